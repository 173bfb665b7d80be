//! What the fabric side does for the nodes: the backend behind `fabric.sm.v1.Partitions`. The
//! OpenSM SM host ([`super::opensm::OpenSmBackend`]) and the UFM broker
//! ([`super::ufm::broker::UfmBroker`]) implement it; the service sees only this trait.
//!
//! Both keep, per node, the last accepted set with its generation and the grants that justify
//! it ([`StoredNode`]), check port claims against the fabric's own view, and answer Ok only
//! once the subnet manager was seen holding the set.

use super::opensm::{OpenSmError, Revocation, StoredNode};
use super::ufm::broker::BrokerError;
use crate::domain::{Condition, Guid, NodeId, NodeMemberships, PKey, SignedGrant};
use async_trait::async_trait;

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

/// Why the fabric side refused or could not confirm a call: the backend's own error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FabricSideError {
    /// The OpenSM SM host.
    #[error(transparent)]
    OpenSm(#[from] OpenSmError),
    /// The UFM broker.
    #[error(transparent)]
    Broker(#[from] BrokerError),
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
}
