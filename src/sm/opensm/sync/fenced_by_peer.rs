//! This host as its peers see it: fenced by one of them, and whose sets a round may trust.
//!
//! A host fenced by a peer may lack releases the nodes saw acknowledged without it, and its
//! file may still hold those keys: an OpenSM started (or restarted alone) here would program
//! them. So while an answering peer states this host fenced and its own OpenSM is not
//! running, every stored set is held back (once, when the fence is first heard), and each is
//! confirmed again only by the sets of peers no host holds fenced. The fencing peer lifts the
//! fence once this host serves every set it holds (`PeerAnswer::behind`).
//!
//! A peer that this host or any answering peer holds fenced is not trusted to confirm or
//! supply a set in a round: it was excused while releases were acknowledged, so an older set
//! it serves at the same generation as a held-back record could be the one a release replaced.

use super::{PeerAnswer, PeerSync};
use std::collections::BTreeSet;

impl PeerSync {
    /// The SM hosts held fenced by this host or by any peer that answered this round.
    pub(super) fn fenced_anywhere(
        &self,
        answers: &[(String, Result<PeerAnswer, String>)],
    ) -> BTreeSet<String> {
        let mut fenced: BTreeSet<String> =
            self.fences.fenced().into_iter().map(|f| f.host).collect();
        for (_, answer) in answers {
            if let Ok(a) = answer {
                fenced.extend(a.fenced.iter().map(|f| f.host.clone()));
            }
        }
        fenced
    }

    /// The peers whose answer this round states this host fenced.
    pub(super) fn fencers(&self, answers: &[(String, Result<PeerAnswer, String>)]) -> Vec<String> {
        let me = self.fences.host();
        answers
            .iter()
            .filter(|(_, a)| {
                a.as_ref()
                    .is_ok_and(|a| a.fenced.iter().any(|f| f.host == me))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// After a round: `fencers` are the peers whose answer states this host fenced. Holds
    /// every stored set back the first time a fence is heard while this host's OpenSM is not
    /// running (module docs).
    pub(super) async fn after_fenced_by(&self, fencers: Vec<String>) {
        let first = {
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            let before = std::mem::replace(&mut status.fenced_by, fencers.clone());
            if fencers.is_empty() {
                if !before.is_empty() {
                    tracing::info!(was = ?before, "no peer SM host states this host fenced any more");
                }
                status.held_back_for_fence = false;
                return;
            }
            !status.held_back_for_fence
        };
        if !first {
            return;
        }
        let Some(why) = self.role.as_ref().and_then(|r| r.not_running()) else {
            tracing::warn!(peers = ?fencers, "a peer SM host states this host fenced while its OpenSM runs: the peer withdraws the fence at its next round (its SM answers SMInfo)");
            return;
        };
        match self.backend.hold_back_all().await {
            Ok(held) => {
                tracing::warn!(held, peers = ?fencers, opensm = %why, "a peer SM host holds this host fenced: every stored set is held back until a peer no one holds fenced confirms it, so an OpenSM started here never programs a release acknowledged without this host");
                self.status
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .held_back_for_fence = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "holding every stored set back (fenced by a peer): the region was not rewritten yet (retried at the next round)")
            }
        }
    }
}
