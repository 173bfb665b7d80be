//! What SM hosts tell each other, and what one knows of its peers: a pulled answer (sets as the
//! nodes sent them, revocations, consumed grants, retirements, fences), the [`Peer`] a host pulls,
//! and the sync status shown by status, metrics and the standing conditions. Plain data, below
//! [`super::sync`] (which pulls and judges) and the modules that read its status
//! ([`super::host_conditions`], [`super::generation_bound`]).

use crate::domain::{NodeId, NodeMemberships, SignedGrant};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

/// A node's set as the node sent it: what a peer needs to judge it again.
#[derive(Debug, Clone)]
pub struct PeerSet {
    /// The complete set.
    pub memberships: NodeMemberships,
    /// The node's generation for it.
    pub generation: u64,
    /// The signed grants the node carried with it.
    pub grants: Vec<SignedGrant>,
    /// Confirmed on the answering host: received from the node (or a caught-up peer) since
    /// that host started.
    pub confirmed: bool,
}

/// An instance revoked on a node, as the answering host holds it: the asking host revokes the
/// same ([`super::OpenSmBackend::learn_revocations`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRevocation {
    /// The node the instance was revoked on.
    pub node: NodeId,
    /// The revoked instance.
    pub instance: String,
    /// The grant ids the revocation consumed on the answering host (none for a revocation
    /// recorded before they were kept).
    pub grant_ids: BTreeSet<String>,
}

/// The grant ids the answering host holds consumed for one node (released or revoked there, or
/// learned from its own peers): the asking host consumes the same
/// ([`super::OpenSmBackend::learn_ledger`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConsumed {
    /// The node.
    pub node: NodeId,
    /// Its consumed grant ids.
    pub grant_ids: BTreeSet<String>,
}

/// A peer's answer to a pull.
#[derive(Debug, Clone, Default)]
pub struct PeerAnswer {
    /// The answering host's node id.
    pub host: String,
    /// Whether it has caught up with all its peers since it started.
    pub caught_up: bool,
    /// Its sets.
    pub sets: Vec<PeerSet>,
    /// Every revocation it holds, for every node it has a record of (held back or not).
    pub revocations: Vec<PeerRevocation>,
    /// Every grant id it holds consumed, per node (held back or not).
    pub consumed: Vec<PeerConsumed>,
    /// Every P_Key retired on it.
    pub retired: crate::domain::RetiredKeys,
    /// The name it states to the nodes (empty from a host that predates it).
    pub host_name: String,
    /// The SM hosts it holds fenced.
    pub fenced: Vec<super::fenced_host::FencedHost>,
}

impl PeerAnswer {
    /// Why this answer does not hold every set and revocation of `mine` (this host's stored
    /// nodes, held back or not): a node whose set the answer lacks or holds at an older
    /// generation, or a revocation it lacks. `None` when it holds them all (at the same or
    /// newer generations). A fence is lifted only on `None` ([`super::fence`]): a peer fenced
    /// while this host confirmed releases holds them before anyone counts on it again. A set
    /// this host holds back counts too: it may be the only record of a release acknowledged
    /// while the peer was fenced (this host restarted since), and the peer's older set, served
    /// unfenced, would be programmed by its OpenSM.
    pub fn behind(&self, mine: &[super::store::StoredNode]) -> Option<String> {
        for n in mine.iter().filter(|n| n.has_set()) {
            let id = &n.memberships.node_id;
            let theirs = self
                .sets
                .iter()
                .filter(|s| s.confirmed && &s.memberships.node_id == id)
                .map(|s| s.generation)
                .max();
            match theirs {
                Some(g) if g >= n.generation => {}
                Some(g) => {
                    return Some(format!(
                        "it holds node {id} at generation {g}, this host at {}",
                        n.generation
                    ))
                }
                None => {
                    return Some(format!(
                        "it serves no set of node {id} (this host: generation {})",
                        n.generation
                    ))
                }
            }
            for instance in &n.revoked_instances {
                if !self
                    .revocations
                    .iter()
                    .any(|r| &r.node == id && &r.instance == instance)
                {
                    return Some(format!(
                        "it does not hold instance {instance} of node {id} revoked"
                    ));
                }
            }
        }
        None
    }
}

/// One peer SM host, reached over `fabric.sm.v1` (the client lives in the api layer).
#[async_trait]
pub trait Peer: Send + Sync + 'static {
    /// The peer's endpoint, for status and logs.
    fn name(&self) -> &str;
    /// Pulls the peer's stored sets.
    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String>;
}

/// What this host knows of one peer.
#[derive(Debug, Clone, Default)]
pub struct PeerStatus {
    /// The peer's endpoint.
    pub name: String,
    /// Its node id, from its last answer.
    pub host: String,
    /// When it last answered.
    pub last_answer: Option<SystemTime>,
    /// Why its last pull failed (cleared by an answer).
    pub last_error: Option<String>,
    /// Whether it said it had caught up.
    pub caught_up: bool,
    /// Highest generation it holds, per node, as of its last answer.
    pub generations: BTreeMap<String, u64>,
    /// What it holds per node as of its last answer (keys and ports, in a canonical form), to
    /// compare with what this host holds.
    pub held: BTreeMap<String, String>,
}

/// The sync state shown by status and metrics.
#[derive(Debug, Clone, Default)]
pub struct SyncStatus {
    /// This host's OpenSM role (`None`: not read).
    pub role: Option<super::opensm_state::OpenSmState>,
    /// Where `role` came from: the SM's SMInfo, or OpenSM's log as a fallback with its reason.
    pub role_source: Option<super::sminfo::RoleSource>,
    /// Every peer answered at least once since start (and this host took their sets).
    pub caught_up: bool,
    /// The peers that have not answered since start.
    pub waiting_for: Vec<String>,
    /// Nodes whose stored set is still held back.
    pub gated_nodes: Vec<String>,
    /// Nodes on which a peer and this host held different generations after each of the last
    /// two rounds (a transient difference converges within one pull).
    pub disagreements: Vec<String>,
    /// Per peer.
    pub peers: Vec<PeerStatus>,
    /// The nodes that differed after the last round alone.
    pub last_round_disagreements: std::collections::BTreeSet<String>,
    /// The peer SM hosts this host holds fenced ([`super::fence`]).
    pub fenced: Vec<super::fenced_host::FencedHost>,
    /// Every stored set was held back again since the last catch-up (this host may have been
    /// fenced by its peers): cleared when every peer has answered again.
    pub caught_up_lost: bool,
    /// The peers whose last answer states this host fenced.
    pub fenced_by: Vec<String>,
    /// Every stored set was held back because a peer states this host fenced (cleared when no
    /// peer does).
    pub held_back_for_fence: bool,
}
