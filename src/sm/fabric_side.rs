//! What the fabric side does for the nodes: the backend behind `fabric.sm.v1.Partitions`. The
//! OpenSM SM host ([`super::opensm::OpenSmBackend`]) and the UFM broker
//! ([`super::ufm::broker::UfmBroker`]) implement it; the service sees only this trait.
//!
//! Both keep, per node, the last accepted set with its generation and the grants that justify
//! it ([`StoredNode`]), check port claims against the fabric's own view, and answer Ok only
//! once the subnet manager was seen holding the set. Their failures reach the service as one
//! backend-neutral [`FabricSideError`]; each backend converts its own error beside it.

use super::opensm::{Revocation, StoredNode};
use crate::domain::{Condition, Guid, NodeId, NodeMemberships, PKey, SignedGrant};
use async_trait::async_trait;
use std::fmt;
use std::sync::Arc;

/// One port a partition holds, as the fabric side read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMember {
    /// The port.
    pub guid: Guid,
    /// Full membership.
    pub full: bool,
    /// The node whose stored set holds the port, if any.
    pub node: Option<NodeId>,
}

/// A partition's members and where they were read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMembers {
    /// The ports.
    pub members: Vec<PartitionMember>,
    /// Where they were read (`partitions-file`, `sa`, `ufm`).
    pub source: &'static str,
}

/// What kind of failure a fabric side reports: what a caller (and `fabric.sm.v1`'s status
/// codes) tells apart, whichever backend failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricSideErrorKind {
    /// The request is malformed or names something it may not (bad value, a port another node
    /// holds, an operator's key).
    Invalid,
    /// The fabric side holds a newer generation of this node's set (or the same generation
    /// with a different set).
    StaleGeneration {
        /// The generation the request carried.
        sent: u64,
        /// The generation stored for the node.
        stored: u64,
    },
    /// A table the set needs is full.
    Exhausted,
    /// The fabric side is not in a state to take the call (a refused file, an unreadable
    /// inventory, a quarantined set, grants not required).
    Precondition,
    /// The caller may not have what it asked for (a port it does not own, a refused grant).
    Denied,
    /// The node has no stored set.
    NotFound,
    /// The subnet manager, the store or a task could not be reached or could not confirm:
    /// retry.
    Unavailable,
    /// A fault of the fabric side itself.
    Internal,
}

/// Why the fabric side refused or could not confirm a call, backend-neutral: its kind, the
/// backend's message, and the backend's own error as the source (for logs).
#[derive(Debug, Clone)]
pub struct FabricSideError {
    kind: FabricSideErrorKind,
    message: String,
    source: Arc<dyn std::error::Error + Send + Sync>,
}

impl FabricSideError {
    /// A failure of `kind`, described by the backend's own error `source`.
    pub fn new(
        kind: FabricSideErrorKind,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> FabricSideError {
        FabricSideError {
            kind,
            message: source.to_string(),
            source: Arc::new(source),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> FabricSideErrorKind {
        self.kind
    }

    /// The backend's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The generation the fabric side holds, when it refused a stale one.
    pub fn stored_generation(&self) -> Option<u64> {
        match self.kind {
            FabricSideErrorKind::StaleGeneration { stored, .. } => Some(stored),
            _ => None,
        }
    }
}

impl fmt::Display for FabricSideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FabricSideError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The fabric side of `fabric.sm.v1.Partitions`.
#[async_trait]
pub trait FabricSide: Send + Sync + 'static {
    /// Whether every key of a node's set needs a grant.
    fn requires_grants(&self) -> bool;

    /// Replaces one node's set (declarative) with the grants it carries, fenced by
    /// `generation`. Ok only once the subnet manager holds it. Returns a count for the reply
    /// (the SM host's sweeps; the broker's applies).
    async fn set_node(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<u64, FabricSideError>;

    /// The node's stored set.
    fn node(&self, node: &NodeId) -> Option<StoredNode>;

    /// Consumes an instance's grants on a node and removes the keys they justified.
    async fn revoke_instance(
        &self,
        node: &NodeId,
        instance: &str,
    ) -> Result<Revocation, FabricSideError>;

    /// Retires `pkey` as of `retired_at_unix_ms` (the control plane deleted its partition):
    /// grants for it issued then or before are refused, and the keys they justified leave the
    /// nodes' sets. A fabric side that cannot refuses with `Precondition`.
    async fn retire_pkey(
        &self,
        pkey: PKey,
        retired_at_unix_ms: u64,
    ) -> Result<super::opensm::Retirement, FabricSideError> {
        let _ = (pkey, retired_at_unix_ms);
        Err(FabricSideError::new(
            FabricSideErrorKind::Precondition,
            std::io::Error::other("this fabric side does not retire P_Keys"),
        ))
    }

    /// The ports the subnet manager holds in `pkey`.
    async fn partition_members(&self, pkey: PKey) -> Result<PartitionMembers, FabricSideError>;

    /// Standing conditions (shown by the service's callers through the agent).
    fn conditions(&self) -> Vec<Condition>;

    /// Anti-entropy between SM hosts: every stored set with the grants it came with, for a
    /// peer SM host (`from` names it). `None`: this fabric side has no peers.
    fn peer_sets(&self, from: &str) -> Option<super::opensm::sync::PeerAnswer> {
        let _ = from;
        None
    }

    /// The SM-host set this fabric side states in its answers to nodes (its name, the SM hosts
    /// it knows, the ones it holds fenced). `None`: a fabric side without peers (the node then
    /// identifies it by its endpoint).
    fn sm_hosts(&self) -> Option<super::opensm::fence::SmHostSet> {
        None
    }

    /// The operator's fence of peer SM host `name` after the physical check
    /// (`fabric-agent fence-sm-host`). `None`: this fabric side has no peers.
    async fn fence_sm_host(
        &self,
        name: &str,
    ) -> Option<Result<super::opensm::fence::FencedHost, super::opensm::fence::FenceRefusal>> {
        let _ = name;
        None
    }
}
