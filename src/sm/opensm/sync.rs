//! Several SM hosts: anti-entropy between their agents and the catch-up gate.
//!
//! Every node sends its complete, generation-numbered set to every SM host, so the hosts merge
//! without consensus: per node, the highest generation wins. Each host also pulls its peers'
//! stored sets ([`PeerSync::round`], at start and every `sync_interval_ms`), so a host that was
//! down catches up from its peers and not only from the nodes' next sets.
//!
//! **A learned set is judged here.** A peer's set goes through this host's own admission
//! exactly like a node's request ([`super::OpenSmBackend::set_node_granted`]): the generation
//! fence, the control plane's signed grants (forwarded by the peer as the node sent them,
//! verified with this host's keys through [`crate::sm::grant_judge`]) and, for port GUIDs this
//! host does not hold for the node yet, its own SA's ownership evidence. A compromised or buggy
//! peer cannot put in a key the control plane never granted that node, nor a port the fabric
//! does not show in it; the worst it can do is send an outdated set, which the fence refuses.
//!
//! **The gate.** At start every stored set is held back ([`GatedStore`]: loaded without its
//! keys, [`StoredNode::gated`]) until it is confirmed, by the node itself (any set from it) or
//! by a peer whose copy is confirmed there (same or newer generation). Before the agent reports
//! ready it pulls every peer once (bounded by `catch_up_timeout_ms`) and rewrites its region, so
//! the file OpenSM reads when it starts (ordered after the agent) holds only confirmed sets: a
//! returning host's stale file never reaches its OpenSM, and a key released while it was down
//! does not come back. What no one confirms stays out (fail closed) until its node's next set;
//! a node sees the drift and re-applies at once.

use super::backend::OpenSmBackend;
use super::store::{CommitState, NodeMembershipStore, NodeStoreError, StoredNode};
use crate::domain::{NodeId, NodeMemberships, SignedGrant};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

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
/// same ([`OpenSmBackend::learn_revocations`]).
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
}

/// One peer SM host, reached over `fabric.sm.v1` (the client lives in the api layer).
#[async_trait]
pub trait Peer: Send + Sync + 'static {
    /// The peer's endpoint, for status and logs.
    fn name(&self) -> &str;
    /// Pulls the peer's stored sets.
    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String>;
}

/// The store wrapper of an SM host with peers: every record loads gated (module docs).
pub struct GatedStore(pub Arc<dyn NodeMembershipStore>);

impl NodeMembershipStore for GatedStore {
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError> {
        let nodes = self.0.load_all()?;
        if !nodes.is_empty() {
            tracing::warn!(
                nodes = nodes.len(),
                "SM host with peers: every stored node set is held back until the node or a caught-up peer confirms it"
            );
        }
        Ok(nodes.into_iter().map(StoredNode::gated).collect())
    }
    fn put_group(
        &self,
        nodes: &[StoredNode],
        commit: Option<&CommitState>,
    ) -> Result<(), NodeStoreError> {
        self.0.put_group(nodes, commit)
    }
    fn load_commit_state(&self) -> Result<CommitState, NodeStoreError> {
        self.0.load_commit_state()
    }
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
}

/// Anti-entropy and the gate of one SM host.
pub struct PeerSync {
    backend: OpenSmBackend,
    local: String,
    peers: Vec<Arc<dyn Peer>>,
    /// The grants each stored set came with (the node's, or the peer's forwarded ones).
    relay: Mutex<BTreeMap<NodeId, (u64, Vec<SignedGrant>)>>,
    status: Mutex<SyncStatus>,
    answered: Mutex<BTreeMap<String, bool>>,
    role: Option<Arc<super::sminfo::SmRole>>,
}

impl PeerSync {
    /// Sync for `backend` (built on a [`GatedStore`]) with `peers`; `local` is this host's node
    /// id; `role` is this host's OpenSM role for the status.
    pub fn new(
        backend: OpenSmBackend,
        local: String,
        peers: Vec<Arc<dyn Peer>>,
        role: Option<Arc<super::sminfo::SmRole>>,
    ) -> Arc<PeerSync> {
        let answered = peers.iter().map(|p| (p.name().to_owned(), false)).collect();
        let status = SyncStatus {
            peers: peers
                .iter()
                .map(|p| PeerStatus {
                    name: p.name().to_owned(),
                    ..PeerStatus::default()
                })
                .collect(),
            ..SyncStatus::default()
        };
        Arc::new(PeerSync {
            backend,
            local,
            peers,
            relay: Mutex::new(BTreeMap::new()),
            status: Mutex::new(status),
            answered: Mutex::new(answered),
            role,
        })
    }

    /// After a set was handed to the backend (by the node, or learned from a peer): when the
    /// backend now holds exactly that set at that generation, keeps the grants it came with, to
    /// forward to the peers.
    pub fn record(&self, desired: &NodeMemberships, grants: &[SignedGrant], generation: u64) {
        let held = self
            .backend
            .node(desired.node_id.as_str())
            .is_some_and(|n| {
                !n.gated && n.generation == generation && n.memberships.keys == desired.keys
            });
        if held {
            self.relay
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(desired.node_id.clone(), (generation, grants.to_vec()));
        }
    }

    /// This host's answer to a peer's pull: every stored set that is not held back, with the
    /// grants it came with (less the ones revoked since), and every revocation it holds.
    pub fn answer(&self, from: &str) -> PeerAnswer {
        let relay = self.relay.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let nodes = self.backend.nodes();
        let revocations = nodes
            .iter()
            .flat_map(|n| {
                n.revoked_instances.iter().map(|instance| PeerRevocation {
                    node: n.memberships.node_id.clone(),
                    instance: instance.clone(),
                    grant_ids: n.revoked_grants.get(instance).cloned().unwrap_or_default(),
                })
            })
            .collect();
        let sets = nodes
            .into_iter()
            .filter(|n| !n.gated && n.has_set())
            .map(|n| {
                let grants = relay
                    .get(&n.memberships.node_id)
                    .filter(|(g, _)| *g == n.generation)
                    .map(|(_, grants)| {
                        grants
                            .iter()
                            .filter(|g| {
                                !n.consumed.contains(&g.grant.grant_id)
                                    && !n.revoked_instances.contains(&g.grant.instance_id)
                            })
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                PeerSet {
                    generation: n.generation,
                    memberships: n.memberships,
                    grants,
                    confirmed: true,
                }
            })
            .collect::<Vec<_>>();
        tracing::debug!(
            peer = from,
            sets = sets.len(),
            "peer pulled the stored sets"
        );
        PeerAnswer {
            host: self.local.clone(),
            caught_up: self.status().caught_up,
            sets,
            revocations,
        }
    }

    /// The sync state now.
    pub fn status(&self) -> SyncStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(role) = self.role.as_ref().map(|r| r.current()) {
            s.role = Some(role.state);
            s.role_source = Some(role.source);
        }
        s.gated_nodes = self
            .backend
            .nodes()
            .into_iter()
            .filter(|n| n.gated)
            .map(|n| n.memberships.node_id.to_string())
            .collect();
        s
    }

    /// Pulls every peer once (concurrently), first revokes here every revocation a peer holds
    /// (union: so no set carrying a revoked grant is taken below, nor kept), then takes, per
    /// node, any confirmed set newer than this host's (or confirming a held-back one), each
    /// judged by this host's admission.
    pub async fn round(&self) {
        let answers = futures::future::join_all(self.peers.iter().map(|p| {
            let p = p.clone();
            let local = self.local.clone();
            async move { (p.name().to_owned(), p.pull(&local).await) }
        }))
        .await;
        self.learn_revocations(&answers).await;
        let mut best: BTreeMap<NodeId, PeerSet> = BTreeMap::new();
        let mut views: Vec<(String, Result<PeerAnswer, String>)> = Vec::new();
        for (name, answer) in answers {
            if let Ok(a) = &answer {
                for set in a.sets.iter().filter(|s| s.confirmed) {
                    let id = set.memberships.node_id.clone();
                    if best.get(&id).is_none_or(|b| b.generation < set.generation) {
                        best.insert(id, set.clone());
                    }
                }
            }
            views.push((name, answer));
        }
        let wanted: Vec<PeerSet> = best
            .into_values()
            .filter(
                |set| match self.backend.node(set.memberships.node_id.as_str()) {
                    None => true,
                    Some(mine) => {
                        mine.generation < set.generation
                            || (mine.generation == set.generation && mine.gated)
                    }
                },
            )
            .collect();
        let adopted = futures::future::join_all(wanted.into_iter().map(|set| async move {
            let id = set.memberships.node_id.clone();
            let generation = set.generation;
            let result = self
                .backend
                .set_node_granted(set.memberships.clone(), &set.grants, generation)
                .await;
            self.record(&set.memberships, &set.grants, generation);
            (id, generation, result)
        }))
        .await;
        for (id, generation, result) in adopted {
            let held = self
                .backend
                .node(id.as_str())
                .is_some_and(|n| !n.gated && n.generation == generation);
            match (&result, held) {
                (Ok(_), _) => {
                    tracing::info!(node_id = %id, generation, "took a newer set from a peer")
                }
                (Err(e), true) => {
                    tracing::info!(node_id = %id, generation, error = %e, "took a newer set from a peer; OpenSM has not confirmed it yet")
                }
                (Err(e), false) => {
                    tracing::warn!(node_id = %id, generation, error = %e, "refused a peer's set for the node")
                }
            }
        }
        self.note(views);
    }

    /// Revokes here what the peers revoked (the union of their answers); a failed write is
    /// stored and retried by the next commit, and logged.
    async fn learn_revocations(&self, answers: &[(String, Result<PeerAnswer, String>)]) {
        let learned: BTreeSet<(NodeId, String, BTreeSet<String>)> = answers
            .iter()
            .filter_map(|(_, a)| a.as_ref().ok())
            .flat_map(|a| a.revocations.iter())
            .map(|r| (r.node.clone(), r.instance.clone(), r.grant_ids.clone()))
            .collect();
        let learned: Vec<_> = learned.into_iter().collect();
        match self.backend.learn_revocations(&learned).await {
            Ok(changed) if !changed.is_empty() => {
                tracing::info!(
                    revocations = changed.len(),
                    "took revocations from the peer SM hosts"
                )
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "took revocations from the peer SM hosts; OpenSM has not confirmed the file yet")
            }
        }
    }

    /// The generation this host stores per node.
    fn generations(&self) -> BTreeMap<String, u64> {
        self.backend
            .nodes()
            .into_iter()
            .filter(StoredNode::has_set)
            .map(|n| (n.memberships.node_id.to_string(), n.generation))
            .collect()
    }

    /// Records what the round saw.
    fn note(&self, views: Vec<(String, Result<PeerAnswer, String>)>) {
        let mine = self.generations();
        let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let mut disagreements = std::collections::BTreeSet::new();
        for (name, view) in views {
            let Some(peer) = status.peers.iter_mut().find(|p| p.name == name) else {
                continue;
            };
            match view {
                Ok(a) => {
                    answered.insert(name.clone(), true);
                    peer.host = a.host;
                    peer.caught_up = a.caught_up;
                    peer.last_answer = Some(SystemTime::now());
                    peer.last_error = None;
                    peer.generations = a
                        .sets
                        .iter()
                        .map(|s| (s.memberships.node_id.to_string(), s.generation))
                        .collect();
                    for (node, g) in &peer.generations {
                        if mine.get(node) != Some(g) {
                            disagreements.insert(node.clone());
                        }
                    }
                }
                Err(e) => {
                    if peer.last_error.as_deref() != Some(e.as_str()) {
                        tracing::warn!(peer = %name, error = %e, "cannot pull the peer SM host's sets");
                    }
                    peer.last_error = Some(e);
                }
            }
        }
        status.waiting_for = answered
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(n, _)| n.clone())
            .collect();
        let was = status.caught_up;
        status.caught_up = status.waiting_for.is_empty();
        if status.caught_up && !was {
            tracing::info!("caught up with every peer SM host");
        }
        let previous = std::mem::take(&mut status.last_round_disagreements);
        status.disagreements = disagreements
            .iter()
            .filter(|n| previous.contains(*n))
            .cloned()
            .collect();
        status.last_round_disagreements = disagreements;
    }

    /// `SM_HOSTS_DISAGREE` while peers hold other generations than this host (two pulls in a
    /// row), naming the nodes and each peer's generation.
    pub fn conditions(&self) -> Vec<crate::domain::Condition> {
        let s = self.status();
        if s.disagreements.is_empty() {
            return Vec::new();
        }
        let mine = self.generations();
        let detail = s
            .disagreements
            .iter()
            .map(|node| {
                let peers: Vec<String> = s
                    .peers
                    .iter()
                    .filter_map(|p| p.generations.get(node).map(|g| format!("{} {g}", p.name)))
                    .collect();
                format!(
                    "{node}: this host {}, {}",
                    mine.get(node).map_or("none".to_owned(), u64::to_string),
                    peers.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        vec![crate::domain::Condition {
            kind: crate::domain::ConditionKind::SmHostsDisagree,
            detail: format!("peer SM hosts hold other generations: {detail}"),
        }]
    }

    /// At start, before the agent reports ready: one round (bounded by `timeout`), then the
    /// region rewritten from what is confirmed, so the file OpenSM reads next holds no set
    /// nobody confirmed. Returns whether every peer answered.
    pub async fn catch_up(&self, timeout: Duration) -> bool {
        if tokio::time::timeout(timeout, self.round()).await.is_err() {
            tracing::warn!(?timeout, "the first pull from the peer SM hosts did not finish in time; sets no one confirmed stay out of the partitions file");
        }
        if let Err(e) = self.backend.resync().await {
            tracing::info!(error = %e, "partitions file rewritten at start; OpenSM did not confirm it (it may not be running yet)");
        }
        let s = self.status();
        tracing::info!(
            caught_up = s.caught_up,
            waiting_for = ?s.waiting_for,
            held_back = s.gated_nodes.len(),
            "SM host start: peers pulled"
        );
        s.caught_up
    }

    /// Pulls every `every` until `stopped` turns true; meanwhile the role's SMInfo read is
    /// refreshed every [`super::sminfo::POLL`].
    pub async fn run(
        self: Arc<Self>,
        every: Duration,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        if let Some(role) = &self.role {
            tokio::spawn(role.clone().run(super::sminfo::POLL, stopped.clone()));
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.changed() => return,
            }
            if *stopped.borrow() {
                return;
            }
            self.round().await;
        }
    }
}

/// The SM host's [`crate::sm::SubnetManager`] with peers: the backend, whose conditions gain
/// `SM_HOSTS_DISAGREE` from the sync.
pub struct WithPeers {
    /// The backend.
    pub backend: OpenSmBackend,
    /// Its sync.
    pub sync: Arc<PeerSync>,
}

#[async_trait]
impl crate::sm::SubnetManager for WithPeers {
    fn backend(&self) -> &'static str {
        crate::sm::SubnetManager::backend(&self.backend)
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<crate::sm::ApplyOutcome, crate::sm::SmError> {
        crate::sm::SubnetManager::apply(&self.backend, desired, generation).await
    }

    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<crate::sm::ApplyOutcome, crate::sm::SmError> {
        crate::sm::SubnetManager::apply_granted(&self.backend, desired, grants, generation).await
    }

    fn conditions(&self) -> Vec<crate::domain::Condition> {
        let mut c = crate::sm::SubnetManager::conditions(&self.backend);
        c.extend(self.sync.conditions());
        c
    }
}
