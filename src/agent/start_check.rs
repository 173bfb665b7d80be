//! The check a node makes at every start, before any apply that adds a key: does the fabric
//! side hold something of this node that its store does not know of? Pure: the runner asks the
//! backend ([`crate::sm::SubnetManager::stored_sets`]) and acts on the verdict.
//!
//! Why: generations are reserved in blocks ([`crate::domain::ApplyLedger::RESERVE`]), so a
//! store put back from a copy of a *running* node (a VM snapshot reverted) resumes above every
//! generation the fabric side holds; nothing looks stale, and the restored set would put a key
//! released after the copy back on the port.
//!
//! The rule: a host holding a generation above the node's last acknowledged one (the ledger's
//! [`AckedSet`], recorded with the apply's outcome) with a set that differs both from that
//! acknowledged set and from the node's current desired set means the store lost writes. A
//! crash between sending a set and recording its acknowledgement is not a rollback: the host
//! then holds what the node still wants. A store with no acknowledgement recorded (new, or
//! written before it was kept) gives no evidence here (a newer generation on the fabric side
//! still raises the rollback at the first apply, as before).
//!
//! Sends are recorded too ([`crate::domain::ApplyLedger::sending`]: the set and the
//! generation it was first sent at, written before it is sent): a host holding a generation at
//! or above that one with another set holds a write the store does not know of. This sees a
//! lost life whose last set equals the last acknowledged one (a release and its re-attach, or an
//! attach and its release, within one reserved block), which the rule above cannot.
//!
//! After a start that may follow a lost life (an unclean stop, which every copy of a running
//! node put back is), a store whose last acknowledged generation no host holds any more (every
//! host holds an older one or nothing: they lost their own state) is taken as rolled back too:
//! nothing can show it is current.
//!
//! Until every host answered (or [`BOUND`] passed, with the `START_CHECK_INCOMPLETE` condition
//! naming the hosts that did not), the node sends only removals: the keys of its desired set
//! that every answering host already holds with the same membership, and nothing at all before
//! any host answered.

use crate::domain::{
    set_digest, AckedSet, Attachment, InstanceId, Inventory, NodeMemberships, SentSet,
};
use crate::sm::{HostStoredSet, StoredSetAnswer};
use std::time::Duration;

/// How long the node sends only removals while a host does not answer the start check.
pub const BOUND: Duration = Duration::from_secs(30);
/// How often a host that did not answer is asked again within the bound.
pub const RETRY: Duration = Duration::from_secs(2);
/// How often after the bound (only to clear `START_CHECK_INCOMPLETE`: a host that stays down
/// must not slow every pass).
pub const RETRY_AFTER_BOUND: Duration = Duration::from_secs(30);
/// The longest one round of asking may hold the reconciler's pass (a host that drops packets
/// answers nothing until the connect timeout).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the answers say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The highest generation any host holds for the node (0: none): the node's next
    /// generation goes above it.
    pub highest: u64,
    /// Proof that the store went back in time: the `STORE_ROLLED_BACK` detail.
    pub rolled_back: Option<String>,
    /// Hosts that gave no answer, with why.
    pub unanswered: Vec<(String, String)>,
    /// The hosts' stored sets (None: the host stores none), of those that answered.
    pub held: Vec<Option<NodeMemberships>>,
    /// Hosts that refused to tell, with why: they refuse the node's sets by the same rule, so
    /// they neither hold evidence nor can take a key from the node.
    pub refused: Vec<(String, String)>,
}

/// What this life of the node knows of its own writes, for [`judge`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThisLife {
    /// (generation, [`set_digest`]) of every set this life sent (removals only, or after the
    /// bound): a host holding one of them holds the node's own write, which is no evidence of
    /// a rollback (a lost life that sent the same generation with another set still counts).
    pub sent: std::collections::BTreeSet<(u64, u64)>,
    /// The store's generation reservation as this life found it (0: a store that never
    /// reserved, new or replaced: no evidence). Generations are reserved durably before they
    /// are sent, so a host holding one above it, not sent by this life, holds a write of a life
    /// the store does not know of: the store lost writes.
    pub reserved_at_start: u64,
    /// This life may follow a lost one (an unclean stop or a store found restored): its next
    /// generation goes `ApplyLedger::LOST_LIFE_MARGIN` above every host's, not just above, and
    /// a store no host vouches for any more is taken as rolled back (`unvouched`).
    pub follows_lost_life: bool,
    /// The ledger's record of the set the node sends, as this life found it (None: no
    /// evidence): every send from its generation on carried it, so a host holding a
    /// generation at or above it with another set, not sent by this life, holds a write of a
    /// life the store does not know of.
    pub sending_at_start: Option<SentSet>,
}

/// Judges the hosts' answers against the last acknowledged set, the current desired set and
/// what this life wrote (`life`).
pub fn judge(
    acked: Option<AckedSet>,
    desired: &NodeMemberships,
    answers: &[HostStoredSet],
    life: &ThisLife,
) -> Verdict {
    let reserved = life.reserved_at_start;
    let mut above_reservation: Option<String> = None;
    let wanted = set_digest(desired);
    let mut verdict = Verdict {
        highest: 0,
        rolled_back: None,
        unanswered: Vec::new(),
        held: Vec::new(),
        refused: Vec::new(),
    };
    for a in answers {
        match &a.answer {
            StoredSetAnswer::NoAnswer(why) => {
                verdict.unanswered.push((a.host.clone(), why.clone()))
            }
            StoredSetAnswer::Refused(why) => verdict.refused.push((a.host.clone(), why.clone())),
            StoredSetAnswer::NotStored => verdict.held.push(None),
            StoredSetAnswer::Stored(generation, set) => {
                verdict.highest = verdict.highest.max(*generation);
                let held = set_digest(set);
                let own = life.sent.contains(&(*generation, held));
                if !own && reserved > 0 && *generation > reserved && above_reservation.is_none() {
                    above_reservation = Some(format!(
                        "SM host {} holds generation {generation} of this node, above every generation this store reserved ({reserved}) and not sent by this life: a life the store does not know of sent it, so the store lost writes (a snapshot of the running node restored, or replaced)",
                        a.host
                    ));
                }
                if let Some(record) = &life.sending_at_start {
                    if !own
                        && *generation >= record.from
                        && held != record.digest
                        && verdict.rolled_back.is_none()
                    {
                        verdict.rolled_back = Some(format!(
                            "SM host {} holds generation {generation} of this node with a set this store never sent: from generation {} on it sent only the set it recorded before sending it: a life the store does not know of sent it, so the store lost writes (a snapshot of the running node restored, or replaced)",
                            a.host, record.from
                        ));
                    }
                }
                if let Some(acked) = acked {
                    let newer = *generation > acked.generation;
                    if newer
                        && !own
                        && held != acked.digest
                        && held != wanted
                        && verdict.rolled_back.is_none()
                    {
                        verdict.rolled_back = Some(format!(
                            "SM host {} holds generation {generation} of this node with a set that is neither the last one it acknowledged to this node (generation {}) nor the one the node wants now: the store lost writes (a snapshot of the running node restored, or replaced)",
                            a.host, acked.generation
                        ));
                    }
                }
                verdict.held.push(Some(set.clone()));
            }
        }
    }
    let unvouched = unvouched(acked, answers, life, &verdict);
    verdict.rolled_back = verdict.rolled_back.or(above_reservation).or(unvouched);
    verdict
}

/// After a start that may follow a lost life: every host answered, and none holds the
/// generation this store last recorded as acknowledged (each holds an older one, or nothing,
/// having lost its own state). Nothing on the fabric side then vouches that the store is
/// current, and nothing can show its writes were lost: a state directory put back from a copy
/// of the running node looks exactly like it. The node takes it as a rollback, so keys the
/// ports do not hold wait for the control plane instead of being sent from a store that may be
/// old (`STORE_ROLLED_BACK` says why).
fn unvouched(
    acked: Option<AckedSet>,
    answers: &[HostStoredSet],
    life: &ThisLife,
    verdict: &Verdict,
) -> Option<String> {
    let acked = acked?;
    if !life.follows_lost_life || answers.is_empty() || !verdict.unanswered.is_empty() {
        return None;
    }
    let mut behind = Vec::new();
    for a in answers {
        match &a.answer {
            StoredSetAnswer::NotStored => behind.push(format!("{} (nothing)", a.host)),
            StoredSetAnswer::Stored(generation, _) if *generation < acked.generation => {
                behind.push(format!("{} (generation {generation})", a.host))
            }
            // A host that vouches, or one that refused to tell (it refuses the node's sets too).
            _ => return None,
        }
    }
    Some(format!(
        "this start follows an unclean stop and no SM host holds the generation this store last recorded as acknowledged ({}): {} lost their state, so nothing on the fabric side vouches that the store is current (a copy of the running node put back looks the same); keys the ports do not hold wait for the control plane",
        acked.generation,
        behind.join(", ")
    ))
}

/// After a start that may follow a lost life, the attachments whose key a lost life may have
/// released without any write the SM hosts could show: when the set the node would send now
/// (`desired`) is not the one its ledger recorded sending, those that want their key and that
/// the recorded set does not give to every port they cover (their key was never sent; a release
/// of one the recorded set carries is a send of another set, which [`judge`] sees). Each is to
/// be settled by the first port read, as after a rollback. Empty when the life follows no lost
/// one, or nothing is unsent.
pub fn unsent(
    life: &ThisLife,
    desired: &NodeMemberships,
    attachments: &[Attachment],
    inventory: Option<&Inventory>,
) -> Vec<InstanceId> {
    let recorded = life.sending_at_start.as_ref();
    if !life.follows_lost_life || recorded.map(|s| s.digest) == Some(set_digest(desired)) {
        return Vec::new();
    }
    attachments
        .iter()
        .filter(|a| a.wants_key())
        .filter(|a| {
            let guids = a.covered_guids(inventory);
            recorded.and_then(|s| s.gave_all(a.partition.pkey, &guids)) != Some(true)
        })
        .map(|a| a.instance_id.clone())
        .collect()
}

/// What may be sent while the check is incomplete: `desired` with only the keys every host in
/// `held` stores with the same membership (and the same ports), so no host gains a key. None
/// when no host told what it holds (nothing is known: send nothing).
pub fn removals_only(
    desired: &NodeMemberships,
    held: &[Option<NodeMemberships>],
) -> Option<NodeMemberships> {
    if held.is_empty() {
        return None;
    }
    let mut out = desired.clone();
    out.keys.retain(|key, setting| {
        held.iter().all(|h| {
            h.as_ref().is_some_and(|h| {
                h.keys
                    .get(key)
                    .is_some_and(|s| s.membership == setting.membership)
                    && desired.guids_for(*key).iter().all(|g| h.gives(*key, *g))
            })
        })
    });
    Some(out)
}

/// The `START_CHECK_INCOMPLETE` detail for hosts that did not answer within the bound.
pub fn incomplete_detail(unanswered: &[(String, String)]) -> String {
    let hosts: Vec<String> = unanswered
        .iter()
        .map(|(h, why)| format!("{h} ({why})"))
        .collect();
    format!(
        "no answer within {}s to the start check (what the SM host stores for this node) from {}: \
         the node sends its sets again without knowing whether its store went back in time; \
         asked again every {}s",
        BOUND.as_secs(),
        hosts.join("; "),
        RETRY_AFTER_BOUND.as_secs()
    )
}

#[cfg(test)]
mod tests;
