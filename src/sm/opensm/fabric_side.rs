//! The SM host as the fabric side of `fabric.sm.v1.Partitions`: [`FabricSide`] over the
//! backend's own methods. [`OpenSmSide`] adds the SA's view for `ListPartitionMembers` and, with
//! peer SM hosts, keeps the grants each accepted set came with and answers the peers' pulls
//! ([`super::sync`]).

use super::backend::OpenSmBackend;
use super::sa_members::SaMembers;
use super::sync::{PeerAnswer, PeerSync};
use super::{Revocation, StoredNode};
use crate::domain::{Condition, NodeId, NodeMemberships, PKey, SignedGrant};
use crate::sm::fabric_side::{
    FabricSide, FabricSideError, FabricSideErrorKind, PartitionMember, PartitionMembers,
};
use async_trait::async_trait;

/// `ListPartitionMembers` read from OpenSM's last accepted partitions file (the backend alone,
/// without an SA to ask).
pub const MEMBERS_SOURCE: &str = "partitions-file";
/// `ListPartitionMembers` read from the SA's P_KeyTableRecords: what the SM holds.
pub const SA_SOURCE: &str = "sa";
/// `ListPartitionMembers` read from the file because the SA could not be asked.
pub const FALLBACK_SOURCE: &str = "partitions-file-fallback";

/// The SM host's backend, with the SA to ask which ports hold a key.
#[derive(Clone)]
pub struct OpenSmSide {
    backend: OpenSmBackend,
    sa: Option<SaMembers>,
    sync: Option<std::sync::Arc<PeerSync>>,
}

impl OpenSmSide {
    /// `sa`: where to ask (`None`: the SA is never asked and the file answers, labelled as the
    /// fallback).
    pub fn new(backend: OpenSmBackend, sa: Option<SaMembers>) -> OpenSmSide {
        OpenSmSide {
            backend,
            sa,
            sync: None,
        }
    }

    /// With peer SM hosts: accepted sets are kept with their grants for the peers' pulls.
    pub fn with_sync(self, sync: Option<std::sync::Arc<PeerSync>>) -> OpenSmSide {
        OpenSmSide { sync, ..self }
    }
}

#[async_trait]
impl FabricSide for OpenSmSide {
    fn requires_grants(&self) -> bool {
        self.backend.requires_grants()
    }

    async fn set_node(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<u64, FabricSideError> {
        let Some(sync) = &self.sync else {
            return FabricSide::set_node(&self.backend, desired, grants, generation).await;
        };
        let result = FabricSide::set_node(&self.backend, desired.clone(), grants, generation).await;
        sync.record(&desired, grants, generation);
        result
    }

    fn node(&self, node: &NodeId) -> Option<StoredNode> {
        self.backend.node(node.as_str())
    }

    fn peer_sets(&self, from: &str) -> Option<PeerAnswer> {
        self.sync.as_ref().map(|s| s.answer(from))
    }

    fn sm_hosts(&self) -> Option<super::fence::SmHostSet> {
        self.sync.as_ref().map(|s| s.fences().host_set())
    }

    async fn fence_sm_host(
        &self,
        name: &str,
    ) -> Option<Result<super::fence::FencedHost, super::fence::FenceRefusal>> {
        Some(self.sync.as_ref()?.fences().fence_now(name).await)
    }

    async fn revoke_instance(
        &self,
        node: &NodeId,
        instance: &str,
    ) -> Result<Revocation, FabricSideError> {
        FabricSide::revoke_instance(&self.backend, node, instance).await
    }

    async fn retire_pkey(
        &self,
        pkey: PKey,
        retired_at_unix_ms: u64,
    ) -> Result<super::Retirement, FabricSideError> {
        Ok(OpenSmBackend::retire_pkey(&self.backend, pkey, retired_at_unix_ms).await?)
    }

    /// The SA's view of the candidates (every stored node's ports and the ports the accepted
    /// file names for the key); the file's, labelled [`FALLBACK_SOURCE`], when the SA cannot
    /// be asked.
    async fn partition_members(&self, pkey: PKey) -> Result<PartitionMembers, FabricSideError> {
        let file = FabricSide::partition_members(&self.backend, pkey).await;
        let Some(sa) = &self.sa else {
            return file.map(|m| PartitionMembers {
                source: FALLBACK_SOURCE,
                ..m
            });
        };
        let mut candidates: std::collections::BTreeSet<crate::domain::Guid> = self
            .backend
            .nodes()
            .iter()
            .flat_map(|n| n.memberships.port_guids.iter().copied())
            .collect();
        if let Ok(f) = &file {
            candidates.extend(f.members.iter().map(|m| m.guid));
        }
        match sa.members(pkey, candidates.into_iter().collect()).await {
            Ok(held) => Ok(PartitionMembers {
                members: held
                    .into_iter()
                    .map(|(guid, full)| PartitionMember {
                        guid,
                        full,
                        node: self.backend.owner_of(guid),
                    })
                    .collect(),
                source: SA_SOURCE,
            }),
            Err(e) => {
                tracing::warn!(error = %e, %pkey, "the SA could not be asked for the partition's members; answering from the partitions file");
                file.map(|m| PartitionMembers {
                    source: FALLBACK_SOURCE,
                    ..m
                })
            }
        }
    }

    fn conditions(&self) -> Vec<Condition> {
        self.backend.conditions_now()
    }
}

#[async_trait]
impl FabricSide for OpenSmBackend {
    fn requires_grants(&self) -> bool {
        OpenSmBackend::requires_grants(self)
    }

    async fn set_node(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<u64, FabricSideError> {
        // A node's request waits while commits are held until the catch-up.
        Ok(self
            .set_node_from_node(desired, grants, generation)
            .await?
            .sweeps)
    }

    fn node(&self, node: &NodeId) -> Option<StoredNode> {
        OpenSmBackend::node(self, node.as_str())
    }

    async fn revoke_instance(
        &self,
        node: &NodeId,
        instance: &str,
    ) -> Result<Revocation, FabricSideError> {
        Ok(self.revoke_instance_after_catch_up(node, instance).await?)
    }

    async fn retire_pkey(
        &self,
        pkey: PKey,
        retired_at_unix_ms: u64,
    ) -> Result<super::Retirement, FabricSideError> {
        Ok(OpenSmBackend::retire_pkey(self, pkey, retired_at_unix_ms).await?)
    }

    async fn partition_members(&self, pkey: PKey) -> Result<PartitionMembers, FabricSideError> {
        let members = OpenSmBackend::partition_members(self, pkey).await?;
        Ok(PartitionMembers {
            members: members
                .into_iter()
                .map(|(m, node)| PartitionMember {
                    guid: m.guid,
                    full: m.full,
                    node,
                })
                .collect(),
            source: MEMBERS_SOURCE,
        })
    }

    fn conditions(&self) -> Vec<Condition> {
        self.conditions_now()
    }
}

/// The SM host's failures as the fabric side reports them.
impl From<super::OpenSmError> for FabricSideError {
    fn from(e: super::OpenSmError) -> Self {
        use super::OpenSmError as E;
        use FabricSideErrorKind as K;
        let kind = match &e {
            E::Invalid(_) | E::PortHeld { .. } | E::OperatorKey { .. } => K::Invalid,
            E::TableFull(_) => K::Exhausted,
            E::StaleGeneration { sent, stored } => K::StaleGeneration {
                sent: *sent,
                stored: *stored,
            },
            E::OperatorFile(_)
            | E::Inventory(_)
            | E::Rejected(_)
            | E::InsecureDefault(_)
            | E::PortNotShown(_)
            | E::GrantsNotRequired
            | E::Quarantined { .. } => K::Precondition,
            E::PortForbidden(_) | E::GrantRefused { .. } => K::Denied,
            E::NodeNotStored(_) => K::NotFound,
            E::Unreachable { .. }
            | E::Unconfirmed { .. }
            | E::Io(_)
            | E::Store(_)
            | E::Task { .. }
            | E::FabricUnreachable(_) => K::Unavailable,
            E::Composed(_) => K::Internal,
        };
        FabricSideError::new(kind, e)
    }
}
