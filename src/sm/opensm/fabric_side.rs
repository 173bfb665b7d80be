//! The SM host as the fabric side of `fabric.sm.v1.Partitions`: [`FabricSide`] over the
//! backend's own methods.

use super::backend::OpenSmBackend;
use super::{Revocation, StoredNode};
use crate::domain::{Condition, NodeId, NodeMemberships, PKey, SignedGrant};
use crate::sm::fabric_side::{FabricSide, FabricSideError, PartitionMember, PartitionMembers};
use async_trait::async_trait;

/// Where the SM host reads a partition's members: OpenSM's last accepted partitions file.
pub const MEMBERS_SOURCE: &str = "partitions-file";

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
        Ok(self
            .set_node_granted(desired, grants, generation)
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
        Ok(OpenSmBackend::revoke_instance(self, node, instance).await?)
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
