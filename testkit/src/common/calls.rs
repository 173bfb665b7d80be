//! One-line calls of the agent's API for set-up and polling: each panics on an error, so use
//! them only where the call is expected to succeed.

use super::requests::{attach, partition, release_request};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use tonic::transport::Channel;

/// AttachPartition; the attachment it returns.
pub async fn attach_now(
    c: &mut FabricAgentClient<Channel>,
    req: pb::AttachPartitionRequest,
) -> pb::Attachment {
    c.attach_partition(req)
        .await
        .expect("attach")
        .into_inner()
        .attachment
        .expect("attachment")
}

/// ReleaseInstance; the attachment it returns.
pub async fn release(
    c: &mut FabricAgentClient<Channel>,
    instance: &str,
    wait_ms: Option<u32>,
) -> pb::Attachment {
    c.release_instance(release_request(instance, wait_ms))
        .await
        .expect("release")
        .into_inner()
        .attachment
        .expect("attachment")
}

/// GetAttachment.
pub async fn get(c: &mut FabricAgentClient<Channel>, instance: &str) -> pb::Attachment {
    c.get_attachment(pb::GetAttachmentRequest {
        instance_id: instance.into(),
    })
    .await
    .expect("get attachment")
    .into_inner()
}

/// GetNode.
pub async fn node(c: &mut FabricAgentClient<Channel>) -> pb::GetNodeResponse {
    c.get_node(pb::GetNodeRequest {})
        .await
        .expect("get node")
        .into_inner()
}

/// Attaches `instance` to partition `id` (P_Key `pkey`) as a full member, waiting up to 5 s for
/// the outcome; the attachment.
pub async fn attach_waiting(
    c: &mut FabricAgentClient<Channel>,
    instance: &str,
    id: &str,
    pkey: u32,
) -> pb::Attachment {
    attach_now(c, attach(instance, partition(id, pkey), Some(5000))).await
}
