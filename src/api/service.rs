//! The `FabricAgent` service: each handler converts, calls the agent, converts back.

use super::audit::{self, Subject};
use super::caller::Caller;
use super::convert;
use crate::agent::Agent;
use crate::proto::agent as pb;
use crate::proto::agent::fabric_agent_server::FabricAgent;
use std::pin::Pin;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// The gRPC face of an [`Agent`].
pub struct AgentService {
    agent: Agent,
    node_id: String,
}

impl AgentService {
    /// Wraps an agent.
    pub fn new(agent: Agent, node_id: String) -> AgentService {
        AgentService { agent, node_id }
    }
}

/// The membership as the audit trail names it (UNSPECIFIED is treated as, and named, FULL).
fn membership_name(m: i32) -> Option<&'static str> {
    match pb::Membership::try_from(m).ok()? {
        pb::Membership::Unspecified | pb::Membership::Full => Some("FULL"),
        pb::Membership::Limited => Some("LIMITED"),
    }
}

impl AgentService {
    async fn attach(
        &self,
        r: pb::AttachPartitionRequest,
    ) -> Result<Response<pb::AttachPartitionResponse>, Status> {
        let (req, wait) = convert::attach_request(r).map_err(convert::status)?;
        let (a, created) = self
            .agent
            .attach(req, wait)
            .await
            .map_err(convert::status)?;
        Ok(Response::new(pb::AttachPartitionResponse {
            attachment: Some(convert::attachment_to_pb(&a)),
            created,
        }))
    }

    async fn release(
        &self,
        r: pb::ReleaseInstanceRequest,
    ) -> Result<Response<pb::ReleaseInstanceResponse>, Status> {
        let id = convert::instance_id(&r.instance_id).map_err(convert::status)?;
        let wait = convert::wait(r.wait_ms).map_err(convert::status)?;
        let a = self
            .agent
            .release(&id, wait)
            .await
            .map_err(convert::status)?;
        Ok(Response::new(pb::ReleaseInstanceResponse {
            attachment: Some(convert::attachment_to_pb(&a)),
        }))
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl FabricAgent for AgentService {
    #[tracing::instrument(skip_all)]
    async fn get_node(
        &self,
        _: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::GetNodeResponse>, Status> {
        let view = self.agent.node().map_err(convert::status)?;
        Ok(Response::new(convert::node_to_pb(view)))
    }

    #[tracing::instrument(skip_all, fields(instance = %request.get_ref().instance_id))]
    async fn attach_partition(
        &self,
        request: Request<pb::AttachPartitionRequest>,
    ) -> Result<Response<pb::AttachPartitionResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let r = request.into_inner();
        let (instance, partition) = (
            r.instance_id.clone(),
            r.partition.clone().unwrap_or_default(),
        );
        let membership = membership_name(r.membership).unwrap_or("INVALID");
        let result = self.attach(r).await;
        audit::agent_call(
            caller.as_ref(),
            "AttachPartition",
            &Subject {
                instance: &instance,
                partition: &partition.id,
                pkey: partition.pkey,
                membership,
            },
            audit::code_of(&result),
        );
        result
    }

    async fn get_attachment(
        &self,
        request: Request<pb::GetAttachmentRequest>,
    ) -> Result<Response<pb::Attachment>, Status> {
        let id = convert::instance_id(&request.get_ref().instance_id).map_err(convert::status)?;
        let a = self.agent.get(&id).map_err(convert::status)?;
        Ok(Response::new(convert::attachment_to_pb(&a)))
    }

    async fn list_attachments(
        &self,
        request: Request<pb::ListAttachmentsRequest>,
    ) -> Result<Response<pb::ListAttachmentsResponse>, Status> {
        let filter = convert::list_filter(request.into_inner()).map_err(convert::status)?;
        let list = self.agent.list(&filter).map_err(convert::status)?;
        Ok(Response::new(pb::ListAttachmentsResponse {
            attachments: list.iter().map(convert::attachment_to_pb).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(instance = %request.get_ref().instance_id))]
    async fn release_instance(
        &self,
        request: Request<pb::ReleaseInstanceRequest>,
    ) -> Result<Response<pb::ReleaseInstanceResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let r = request.into_inner();
        let instance = r.instance_id.clone();
        let result = self.release(r).await;
        let released = result
            .as_ref()
            .ok()
            .and_then(|a| a.get_ref().attachment.clone())
            .unwrap_or_default();
        let partition = released.partition.unwrap_or_default();
        let membership = membership_name(released.membership).unwrap_or("");
        audit::agent_call(
            caller.as_ref(),
            "ReleaseInstance",
            &Subject {
                instance: &instance,
                partition: &partition.id,
                pkey: partition.pkey,
                membership: if result.is_ok() { membership } else { "" },
            },
            audit::code_of(&result),
        );
        result
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        request: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let r = request.into_inner();
        let rx = self
            .agent
            .watch(r.after_seq, !r.no_follow)
            .map_err(convert::status)?;
        let node_id = self.node_id.clone();
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |item| {
            item.map(|e| convert::event_to_pb(&e, &node_id))
                .map_err(convert::status)
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
