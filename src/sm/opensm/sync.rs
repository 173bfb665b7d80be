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

pub use super::peer_state::{
    Peer, PeerAnswer, PeerConsumed, PeerRevocation, PeerSet, PeerStatus, SyncStatus,
};

mod fenced_by_peer;
pub mod reload;

use super::backend::OpenSmBackend;
use super::store::{CommitState, NodeMembershipStore, NodeStoreError, StoredNode};
use crate::domain::{NodeId, NodeMemberships, SignedGrant};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

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
    fn load_retired(&self) -> Result<crate::domain::RetiredKeys, NodeStoreError> {
        self.0.load_retired()
    }
    fn put_retired(&self, retired: &crate::domain::RetiredKeys) -> Result<(), NodeStoreError> {
        self.0.put_retired(retired)
    }
    fn load_fenced(&self) -> Result<Vec<super::fenced_host::FencedHost>, NodeStoreError> {
        self.0.load_fenced()
    }
    fn put_fenced(&self, fenced: &[super::fenced_host::FencedHost]) -> Result<(), NodeStoreError> {
        self.0.put_fenced(fenced)
    }
}

/// Anti-entropy and the gate of one SM host.
pub struct PeerSync {
    backend: OpenSmBackend,
    local: String,
    /// Replaced on SIGHUP ([`PeerSync::replace_peers`], `reload`).
    peers: std::sync::RwLock<Arc<Vec<Arc<dyn Peer>>>>,
    /// The grants each stored set came with (the node's, or the peer's forwarded ones).
    relay: Mutex<BTreeMap<NodeId, (u64, Vec<SignedGrant>)>>,
    status: Mutex<SyncStatus>,
    answered: Mutex<BTreeMap<String, bool>>,
    role: Option<Arc<super::sminfo::SmRole>>,
    fences: Arc<super::fence::Fences>,
}

impl PeerSync {
    /// [`PeerSync::new`] with `fences`: the SM-host set this host states and the peers it
    /// fences ([`super::fence`]).
    pub fn with_fences(
        backend: OpenSmBackend,
        local: String,
        peers: Vec<Arc<dyn Peer>>,
        role: Option<Arc<super::sminfo::SmRole>>,
        fences: Arc<super::fence::Fences>,
    ) -> Arc<PeerSync> {
        let sync = Self::new(backend, local, peers, role);
        let mut sync = Arc::into_inner(sync).expect("just built");
        sync.fences = fences;
        Arc::new(sync)
    }

    /// The peers pulled now.
    pub fn peers(&self) -> Arc<Vec<Arc<dyn Peer>>> {
        self.peers.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `peers` in effect from the next round (SIGHUP, [`reload`]): a new peer counts as not
    /// answered (this host is not caught up until it has), a removed one is forgotten.
    pub fn replace_peers(&self, peers: Vec<Arc<dyn Peer>>) {
        let names: Vec<String> = peers.iter().map(|p| p.name().to_owned()).collect();
        {
            let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
            answered.retain(|n, _| names.contains(n));
            for n in &names {
                answered.entry(n.clone()).or_insert(false);
            }
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            status.peers.retain(|p| names.contains(&p.name));
            for n in &names {
                if !status.peers.iter().any(|p| &p.name == n) {
                    status.peers.push(PeerStatus {
                        name: n.clone(),
                        ..PeerStatus::default()
                    });
                }
            }
            status.waiting_for = answered
                .iter()
                .filter(|(_, ok)| !**ok)
                .map(|(n, _)| n.clone())
                .collect();
            status.caught_up = status.waiting_for.is_empty();
        }
        *self.peers.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(peers);
    }

    /// The fences and the SM-host set this host states.
    pub fn fences(&self) -> &Arc<super::fence::Fences> {
        &self.fences
    }

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
        let endpoints: Vec<String> = peers.iter().map(|p| p.name().to_owned()).collect();
        let fences = Arc::new(super::fence::Fences::plain(local.clone(), &endpoints));
        Arc::new(PeerSync {
            fences,
            backend,
            local,
            peers: std::sync::RwLock::new(Arc::new(peers)),
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
            // One grant per key and instance (what admission kept): a node's copies are not
            // forwarded.
            let mut seen = BTreeSet::new();
            let grants: Vec<SignedGrant> = grants
                .iter()
                .filter(|g| seen.insert((g.grant.pkey, g.grant.instance_id.as_str())))
                .cloned()
                .collect();
            self.relay
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(desired.node_id.clone(), (generation, grants));
        }
    }

    /// This host's answer to a peer's pull: every stored set that is not held back, with the
    /// grants it came with (less the ones revoked since), and every revocation it holds. A
    /// pull from a peer counts as its agent answering ([`super::fence::Fences::pulled_by`]).
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
        let consumed = nodes
            .iter()
            .filter(|n| !n.consumed.is_empty())
            .map(|n| PeerConsumed {
                node: n.memberships.node_id.clone(),
                grant_ids: n.consumed.clone(),
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
        let answer = PeerAnswer {
            host: self.local.clone(),
            caught_up: self.status().caught_up,
            sets,
            revocations,
            consumed,
            retired: self.backend.retired(),
            host_name: self.fences.host().to_owned(),
            fenced: self.fences.fenced(),
        };
        // After the answer, which still states the fence: the puller holds its sets back if
        // its OpenSM is not running (`fenced_by_peer`).
        self.fences.pulled_by(from);
        answer
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
        s.fenced = self.fences.fenced();
        s.gated_nodes = self
            .backend
            .nodes()
            .into_iter()
            .filter(|n| n.gated)
            .map(|n| n.memberships.node_id.to_string())
            .collect();
        s
    }

    /// Pulls every peer once (concurrently), first revokes here every revocation a peer holds,
    /// retires every key a peer retired and consumes every grant a peer holds consumed (union:
    /// so no set carrying a revoked, retired or consumed grant is taken below, nor kept), then
    /// takes, per node, any confirmed set newer than this host's (or confirming a held-back
    /// one), each judged by this host's admission (grants not judged by age again: the peer
    /// admitted them).
    pub async fn round(&self) {
        let peers = self.peers();
        let answers = futures::future::join_all(peers.iter().map(|p| {
            let p = p.clone();
            // The name this host states (its fence name): a peer that holds it fenced
            // withdraws the fence when it is pulled (`Fences::pulled_by`).
            let local = self.fences.host().to_owned();
            async move { (p.name().to_owned(), p.pull(&local).await) }
        }))
        .await;
        self.learn_revocations(&answers).await;
        self.learn_ledger(&answers).await;
        let untrusted = self.fenced_anywhere(&answers);
        let fencers = self.fencers(&answers);
        let mut best: BTreeMap<NodeId, PeerSet> = BTreeMap::new();
        let mut views: Vec<(String, Result<PeerAnswer, String>)> = Vec::new();
        for (name, answer) in answers {
            if let Some(a) = answer
                .as_ref()
                .ok()
                .filter(|a| !untrusted.contains(&a.host_name))
            {
                for set in a.sets.iter().filter(|s| {
                    s.confirmed
                        && super::generation_bound::admits(&name, s, |id| {
                            self.backend.node(id).map(|n| n.generation)
                        })
                }) {
                    let id = set.memberships.node_id.clone();
                    if best.get(&id).is_none_or(|b| b.generation < set.generation) {
                        best.insert(id, set.clone());
                    }
                }
            }
            views.push((name, answer));
        }
        let heard: Vec<(String, Option<super::fence::Heard>)> = {
            let mine = self.backend.nodes();
            views
                .iter()
                .map(|(name, a)| {
                    let heard = a.as_ref().ok().map(|a| super::fence::Heard {
                        stated: a.host_name.clone(),
                        caught_up: a.caught_up,
                        behind: a.behind(&mine),
                    });
                    (name.clone(), heard)
                })
                .collect()
        };
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
                .set_node_from_peer(set.memberships.clone(), &set.grants, generation)
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
        self.fences.after_round(&heard).await;
        self.after_fenced_by(fencers).await;
        self.hold_back_if_maybe_fenced().await;
    }

    /// This host may have been fenced by its peers when its own OpenSM is not running, no peer's
    /// agent has answered for the fence bound and a peer's SM still answers SMInfo (so that peer
    /// is alive and sees this host's agent silent too). Its file may then lack releases the
    /// nodes saw acknowledged without it, and an OpenSM restarted alone here (its agent kept
    /// running) would program it: every stored set is held back as at start, and this host
    /// counts as not caught up until a peer answers again (module docs: the gate).
    ///
    /// Checked at every round while it lasts, not once: a peer that answered meanwhile may have
    /// confirmed sets again, and a release acknowledged since the peers went silent again would
    /// be missing from them.
    async fn hold_back_if_maybe_fenced(&self) {
        let Some(why) = self.role.as_ref().and_then(|r| r.not_running()) else {
            return;
        };
        // Already held back, and nothing confirmed since: no SMInfo check needed this round.
        if self.status().caught_up_lost
            && self.backend.nodes().iter().all(|n| n.gated || !n.has_set())
        {
            return;
        }
        if !self.fences.every_peer_silent() {
            return;
        }
        let Some(alive) = self.fences.a_peer_sm_answers().await else {
            return;
        };
        match self.backend.hold_back_all().await {
            Ok(0) if self.status().caught_up_lost => return,
            Ok(held) => tracing::warn!(
                held,
                peer = %alive,
                opensm = %why,
                "this host's OpenSM is not running, no peer's agent answers and a peer's SM is alive: it may have fenced this host, so every stored set is held back until a peer confirms it"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "holding every stored set back: the region was not rewritten yet (retried by the next commit)")
            }
        }
        let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        answered.values_mut().for_each(|a| *a = false);
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        status.caught_up = false;
        status.caught_up_lost = true;
        status.waiting_for = answered.keys().cloned().collect();
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

    /// Retires and consumes here what the peers hold (the union of their answers); a failed
    /// write is stored and retried by the next commit, and logged.
    async fn learn_ledger(&self, answers: &[(String, Result<PeerAnswer, String>)]) {
        let mut retired = crate::domain::RetiredKeys::default();
        let mut consumed: BTreeMap<NodeId, BTreeSet<String>> = BTreeMap::new();
        for a in answers.iter().filter_map(|(_, a)| a.as_ref().ok()) {
            for (k, t) in a.retired.iter() {
                retired.retire(k, t);
            }
            for c in &a.consumed {
                consumed
                    .entry(c.node.clone())
                    .or_default()
                    .extend(c.grant_ids.iter().cloned());
            }
        }
        match self.backend.learn_ledger(&retired, &consumed).await {
            Ok(changed) if !changed.is_empty() => {
                tracing::info!(
                    nodes = changed.len(),
                    "took consumed grants and retired P_Keys from the peer SM hosts"
                )
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "took consumed grants and retired P_Keys from the peer SM hosts; OpenSM has not confirmed the file yet")
            }
        }
    }

    /// What this host holds per node (canonical keys and ports), as compared with the peers.
    fn held(&self) -> BTreeMap<String, String> {
        self.backend
            .nodes()
            .into_iter()
            .filter(|n| n.has_set() && !n.gated)
            .map(|n| (n.memberships.node_id.to_string(), held_form(&n.memberships)))
            .collect()
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
        let mine_held = self.held();
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
                    peer.held = a
                        .sets
                        .iter()
                        .map(|s| (s.memberships.node_id.to_string(), held_form(&s.memberships)))
                        .collect();
                    for (node, g) in &peer.generations {
                        if mine.get(node) != Some(g) || mine_held.get(node) != peer.held.get(node) {
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
            status.caught_up_lost = false;
        }
        let previous = std::mem::take(&mut status.last_round_disagreements);
        status.disagreements = disagreements
            .iter()
            .filter(|n| previous.contains(*n))
            .cloned()
            .collect();
        status.last_round_disagreements = disagreements;
    }

    /// `SM_HOSTS_DISAGREE` while peers hold other generations or other sets (keys, ports)
    /// than this host (two pulls in a row), naming the nodes, each peer's generation and, where
    /// the generations agree, that the sets differ.
    pub fn conditions(&self) -> Vec<crate::domain::Condition> {
        let s = self.status();
        let mut standing =
            super::host_conditions::standing(&s, self.role.as_deref(), self.generations());
        standing.extend(self.fences.conditions());
        if s.disagreements.is_empty() {
            return standing;
        }
        let mine = self.generations();
        let mine_held = self.held();
        let detail = s
            .disagreements
            .iter()
            .map(|node| {
                let peers: Vec<String> = s
                    .peers
                    .iter()
                    .filter_map(|p| {
                        p.generations.get(node).map(|g| {
                            let differs = p.held.get(node) != mine_held.get(node);
                            format!(
                                "{} {g}{}",
                                p.name,
                                if differs { " (another set)" } else { "" }
                            )
                        })
                    })
                    .collect();
                format!(
                    "{node}: this host {}, {}",
                    mine.get(node).map_or("none".to_owned(), u64::to_string),
                    peers.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        standing.push(crate::domain::Condition {
            kind: crate::domain::ConditionKind::SmHostsDisagree,
            detail: format!("peer SM hosts hold other generations or sets: {detail}"),
        });
        standing
    }

    /// At start, before the agent reports ready: one round (bounded by `timeout`), then the
    /// region rewritten from what is confirmed, so the file OpenSM reads next holds no set
    /// nobody confirmed. Returns whether every peer answered.
    pub async fn catch_up(&self, timeout: Duration) -> bool {
        if tokio::time::timeout(timeout, self.round()).await.is_err() {
            tracing::warn!(?timeout, "the first pull from the peer SM hosts did not finish in time; sets no one confirmed stay out of the partitions file");
        }
        if let Err(e) = self.backend.caught_up_commit().await {
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

/// A node's set in a canonical form (keys with their membership and ports, ports sorted), to
/// compare what two hosts hold.
fn held_form(m: &NodeMemberships) -> String {
    let mut ports = m.port_guids.clone();
    ports.sort();
    format!("{:?} {:?}", m.keys, ports)
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
