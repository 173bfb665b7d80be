//! Persistence of every node's desired memberships on the SM host, so a restarted agent
//! rewrites the same region. The daemon implements [`NodeMembershipStore`] on its durable store;
//! [`InMemoryNodeStore`] serves tests.

use crate::domain::NodeMemberships;
use std::collections::BTreeMap;
use std::sync::Mutex;
use thiserror::Error;

/// A node's latest accepted desired set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredNode {
    /// The complete desired set.
    pub memberships: NodeMemberships,
    /// The node's generation for it (requests with a lower one are ignored).
    pub generation: u64,
}

/// The store failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("node membership store: {0}")]
pub struct NodeStoreError(pub String);

/// Durable storage of [`StoredNode`]s keyed by node id.
pub trait NodeMembershipStore: Send + Sync + 'static {
    /// Every stored node.
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError>;
    /// Replaces one node's record durably before returning.
    fn put(&self, node: &StoredNode) -> Result<(), NodeStoreError>;
}

/// A [`NodeMembershipStore`] in memory.
#[derive(Debug, Default)]
pub struct InMemoryNodeStore {
    nodes: Mutex<BTreeMap<String, StoredNode>>,
}

impl NodeMembershipStore for InMemoryNodeStore {
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError> {
        let nodes = self
            .nodes
            .lock()
            .map_err(|_| NodeStoreError("poisoned".into()))?;
        Ok(nodes.values().cloned().collect())
    }

    fn put(&self, node: &StoredNode) -> Result<(), NodeStoreError> {
        self.nodes
            .lock()
            .map_err(|_| NodeStoreError("poisoned".into()))?
            .insert(node.memberships.node_id.clone(), node.clone());
        Ok(())
    }
}
