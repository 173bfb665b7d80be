//! Persistence on the SM host: every node's desired memberships, so a restarted agent rewrites
//! the same region, and the state of the last write ([`CommitState`]: unconfirmed, rejected), so
//! a restarted agent re-checks a write OpenSM was never seen accepting. The daemon implements
//! [`NodeMembershipStore`] on its durable store; [`InMemoryNodeStore`] serves tests.
//!
//! The backend writes the node sets of a whole commit group, with the commit state that marks
//! its write in progress, in one transaction ([`NodeMembershipStore::put_group`]): one fsync per
//! group, not one per request.
//!
//! A store found restored from a copy at open: every stored set is marked unconfirmed and loads
//! without its keys ([`StoredNode::unconfirmed`]) until that node's next set is stored.

use crate::domain::{Membership, NodeId, NodeMemberships, PKey, RetiredKeys};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// A node's latest accepted desired set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredNode {
    /// The complete desired set.
    pub memberships: NodeMemberships,
    /// The node's generation for it: a request with a lower one, or with the same one and a
    /// different set, is refused.
    pub generation: u64,
    /// The grants that justify the set's keys (empty when grants are not required). Stored
    /// with the set, in the same transaction, so consumption is as durable as the set.
    pub grants: Vec<AcceptedGrant>,
    /// Grant ids consumed on this node (released: absent from a later accepted set; or
    /// revoked): refused forever, for every node.
    pub consumed: BTreeSet<String>,
    /// Instances revoked on this node: grants naming them are refused.
    pub revoked_instances: BTreeSet<String>,
    /// The grant ids each revocation consumed, by revoked instance: what this host tells its
    /// peer SM hosts so they revoke the same (an instance revoked before this was recorded has
    /// none listed). Only ever grows.
    pub revoked_grants: BTreeMap<String, BTreeSet<String>>,
    /// Held back by the catch-up gate of an SM host with peers (see
    /// [`super::sync::GatedStore`]): loaded at start and not yet confirmed by the node or by a
    /// caught-up peer, so its keys stay out of the region. The same generation is then not a
    /// retry but the confirmation: it is judged and admitted like a newer one.
    pub gated: bool,
}

impl StoredNode {
    /// The fabric side's fencing rule for `set` at `generation` against this stored set:
    /// `Ok(true)` a retry of it (same generation, same node, keys and ports), `Ok(false)` a
    /// newer generation, `Err(stored generation)` an older generation or the same one with
    /// another set (never answered Ok: it was not applied).
    pub fn fence(&self, set: &NodeMemberships, generation: u64) -> Result<bool, u64> {
        let ports = |m: &NodeMemberships| {
            let mut guids = m.port_guids.clone();
            guids.sort();
            guids
        };
        let same = self.memberships.node_id == set.node_id
            && self.memberships.keys == set.keys
            && ports(&self.memberships) == ports(set);
        match self.generation.cmp(&generation) {
            std::cmp::Ordering::Greater => Err(self.generation),
            std::cmp::Ordering::Equal if self.gated => Ok(false),
            std::cmp::Ordering::Equal if same => Ok(true),
            std::cmp::Ordering::Equal => Err(self.generation),
            std::cmp::Ordering::Less => Ok(false),
        }
    }

    /// What a restored store's record of a node becomes (fail closed): the store was found
    /// older than the one last written, so the node may have sent newer sets since, releases
    /// among them. The keys are kept out of the rendered region until the node's next set
    /// arrives; the generation stays (an older set is still refused), and so do the port GUIDs
    /// and the grant history. A node whose ports lose a key it still wants sees the drift and
    /// re-applies with a newer generation.
    pub fn unconfirmed(mut self) -> StoredNode {
        self.memberships.keys.clear();
        self
    }

    /// What the catch-up gate makes of a record loaded at start: its keys kept out of the
    /// region (fail closed) until the node or a caught-up peer confirms this generation or
    /// sends a newer one. Ports, generation and grant history stay.
    /// A record holding only revocations learned from a peer (generation 0, no set) holds
    /// nothing back and is loaded as it is.
    pub fn gated(mut self) -> StoredNode {
        if self.generation == 0 {
            return self;
        }
        self.memberships.keys.clear();
        self.gated = true;
        self
    }

    /// A set with no grant history.
    pub fn new(memberships: NodeMemberships, generation: u64) -> StoredNode {
        StoredNode {
            memberships,
            generation,
            grants: Vec::new(),
            consumed: BTreeSet::new(),
            revoked_instances: BTreeSet::new(),
            revoked_grants: BTreeMap::new(),
            gated: false,
        }
    }

    /// A record of `node` holding no set (generation 0: any set of the node is newer), only the
    /// revocations a peer SM host told this one about, so the node's first set here is judged
    /// against them.
    pub fn revocations_only(node: NodeId) -> StoredNode {
        StoredNode::new(
            NodeMemberships {
                node_id: node,
                port_guids: Vec::new(),
                keys: BTreeMap::new(),
            },
            0,
        )
    }

    /// Whether this record holds a node's set (not only learned revocations).
    pub fn has_set(&self) -> bool {
        self.generation > 0
    }
}

/// A grant the SM host accepted for one key of a node's set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedGrant {
    /// The grant's id.
    pub grant_id: String,
    /// The instance it was issued for.
    pub instance_id: String,
    /// The key it justifies.
    pub pkey: PKey,
    /// The membership it grants.
    pub membership: Membership,
    /// When the control plane issued it (ms): a retirement of its key after this time ends it.
    /// 0 in records written before it was kept (such a grant ends with any retirement of its
    /// key).
    #[serde(default)]
    pub issued_at_unix_ms: u64,
}

/// What the SM host knows about its last write of the partitions file, kept across restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommitState {
    /// Set (with what was seen) from just before a write until OpenSM is seen re-reading the
    /// file without error; while set, the next commit rewrites, re-signals and re-checks even
    /// when the rendered bytes equal the file.
    pub unconfirmed: Option<String>,
    /// Set when OpenSM rejected a file the agent wrote and the last accepted one was restored;
    /// cleared when a later write of the agent's is confirmed.
    pub rejected: Option<String>,
    /// OpenSM's log was checked for rejections up to here: a rejection logged after it while
    /// the agent was down is found and repaired at start. `None`: never recorded (a first start
    /// begins at the log's end).
    #[serde(default)]
    pub log_mark: Option<LogMark>,
    /// OpenSM rejected a file the agent did not write (an operator's edit in place): shown
    /// until the operator's part of the file changes again and OpenSM accepts the result.
    #[serde(default)]
    pub operator_rejected: Option<OperatorRejected>,
}

/// A position in OpenSM's log, and which log file (device and inode) it is in: a rotated log
/// is read from its start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogMark {
    /// Bytes of the log already checked.
    pub offset: u64,
    /// The log's device and inode then (`None`: not known).
    pub file: Option<(u64, u64)>,
}

/// A rejection of an operator's edit, and the operator's part that was restored after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OperatorRejected {
    /// OpenSM's error lines, the strict parser's line and reason, and what was restored.
    pub detail: String,
    /// The operator's part (the file outside the agent's region) of the restored file: while
    /// the file in place holds it, the operator has not fixed and re-applied their edit.
    pub restored_operator_part: Vec<u8>,
}

/// The store failed; its cause is kept as the source.
#[derive(Debug, Clone, Error)]
#[error("node membership store: {0}")]
pub struct NodeStoreError(#[source] pub Arc<dyn std::error::Error + Send + Sync>);

impl NodeStoreError {
    /// A store failure caused by `cause` (an error value, or a text for a store without one).
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        NodeStoreError(Arc::from(cause.into()))
    }
}

/// Durable storage of [`StoredNode`]s keyed by node id.
pub trait NodeMembershipStore: Send + Sync + 'static {
    /// Every stored node.
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError>;
    /// Replaces the records of `nodes` and, when given, the [`CommitState`], durably and
    /// atomically (one transaction) before returning.
    fn put_group(
        &self,
        nodes: &[StoredNode],
        commit: Option<&CommitState>,
    ) -> Result<(), NodeStoreError>;
    /// The last saved [`CommitState`] (default when none was saved).
    fn load_commit_state(&self) -> Result<CommitState, NodeStoreError>;
    /// Saves the [`CommitState`] alone, durably before returning.
    fn put_commit_state(&self, state: &CommitState) -> Result<(), NodeStoreError> {
        self.put_group(&[], Some(state))
    }
    /// The retired keys (`fabric.sm.v1` `RetirePKey`, or learned from a peer SM host). No
    /// default: a store wrapper that forgot to pass them through would lose every retirement.
    fn load_retired(&self) -> Result<RetiredKeys, NodeStoreError>;
    /// Replaces the retired keys, durably before returning. A store that cannot keep them
    /// refuses (the retirement is then refused, never half taken).
    fn put_retired(&self, retired: &RetiredKeys) -> Result<(), NodeStoreError>;
    /// The peer SM hosts this host holds fenced ([`super::fence`]).
    fn load_fenced(&self) -> Result<Vec<super::fenced_host::FencedHost>, NodeStoreError>;
    /// Replaces the fenced peer SM hosts, durably before returning. A store that cannot keep
    /// them refuses (the fence, or its lifting, is then not taken).
    fn put_fenced(&self, fenced: &[super::fenced_host::FencedHost]) -> Result<(), NodeStoreError>;
}

/// A [`NodeMembershipStore`] in memory that counts its transactions.
#[derive(Debug, Default)]
pub struct InMemoryNodeStore {
    nodes: Mutex<BTreeMap<String, StoredNode>>,
    retired: Mutex<RetiredKeys>,
    fenced: Mutex<Vec<super::fenced_host::FencedHost>>,
    commit: Mutex<CommitState>,
    transactions: AtomicU64,
    node_transactions: AtomicU64,
}

impl InMemoryNodeStore {
    /// Write transactions so far (each would be one fsync in a durable store).
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::SeqCst)
    }

    /// Write transactions so far that carried at least one node record.
    pub fn node_transactions(&self) -> u64 {
        self.node_transactions.load(Ordering::SeqCst)
    }
}

impl NodeMembershipStore for InMemoryNodeStore {
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError> {
        let nodes = self
            .nodes
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))?;
        Ok(nodes.values().cloned().collect())
    }

    fn put_group(
        &self,
        nodes: &[StoredNode],
        commit: Option<&CommitState>,
    ) -> Result<(), NodeStoreError> {
        let mut stored = self
            .nodes
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))?;
        let mut state = self
            .commit
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))?;
        for node in nodes {
            stored.insert(node.memberships.node_id.to_string(), node.clone());
        }
        if let Some(c) = commit {
            *state = c.clone();
        }
        self.transactions.fetch_add(1, Ordering::SeqCst);
        if !nodes.is_empty() {
            self.node_transactions.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn load_commit_state(&self) -> Result<CommitState, NodeStoreError> {
        Ok(self
            .commit
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))?
            .clone())
    }

    fn load_retired(&self) -> Result<RetiredKeys, NodeStoreError> {
        Ok(self
            .retired
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))?
            .clone())
    }

    fn put_retired(&self, retired: &RetiredKeys) -> Result<(), NodeStoreError> {
        *self
            .retired
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))? = retired.clone();
        self.transactions.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn load_fenced(&self) -> Result<Vec<super::fenced_host::FencedHost>, NodeStoreError> {
        Ok(self
            .fenced
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))?
            .clone())
    }

    fn put_fenced(&self, fenced: &[super::fenced_host::FencedHost]) -> Result<(), NodeStoreError> {
        *self
            .fenced
            .lock()
            .map_err(|_| NodeStoreError::new("lock poisoned"))? = fenced.to_vec();
        self.transactions.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
