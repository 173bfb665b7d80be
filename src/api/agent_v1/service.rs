//! The `FabricAgent` service: each handler converts, calls the agent, converts back.

use super::convert;
use super::page_token;
use crate::agent::{Agent, WatchFrom};
use crate::api::gate::audit::{self, Subject};
use crate::api::gate::limits::StreamSlots;
use crate::api::gate::Caller;
use crate::api::settings::LimitsConfig;
use crate::proto::agent as pb;
use crate::proto::agent::fabric_agent_server::FabricAgent;
use std::pin::Pin;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// The gRPC face of an [`Agent`].
pub struct AgentService {
    agent: Agent,
    node_id: String,
    limits: LimitsConfig,
    streams: StreamSlots,
    sm_host: Option<std::sync::Arc<crate::sm::opensm::sync::PeerSync>>,
}

impl AgentService {
    /// Wraps an agent, with the default [`LimitsConfig`].
    pub fn new(agent: Agent, node_id: String) -> AgentService {
        AgentService::with_limits(agent, node_id, LimitsConfig::default())
    }

    /// Wraps an agent with the given resource bounds (the server applies the listener bounds
    /// from the same value).
    pub fn with_limits(agent: Agent, node_id: String, limits: LimitsConfig) -> AgentService {
        AgentService {
            agent,
            node_id,
            streams: StreamSlots::from_limits(&limits),
            limits,
            sm_host: None,
        }
    }

    /// On an SM host with peers: `GetNode` shows its OpenSM's role and the anti-entropy.
    pub fn with_sm_host(
        self,
        sync: Option<std::sync::Arc<crate::sm::opensm::sync::PeerSync>>,
    ) -> AgentService {
        AgentService {
            sm_host: sync,
            ..self
        }
    }

    /// The resource bounds this service was built with.
    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// The slots of long-lived streams (WatchEvents here; the server adds Health.Watch and
    /// reflection streams to the same count).
    pub fn stream_slots(&self) -> StreamSlots {
        self.streams.clone()
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

type WireEvents = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl FabricAgent for AgentService {
    #[tracing::instrument(skip_all)]
    async fn get_node(
        &self,
        _: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::GetNodeResponse>, Status> {
        let view = self.agent.node().map_err(convert::status)?;
        let mut node = convert::node_to_pb(view);
        if let (Some(sync), Some(sm)) = (&self.sm_host, node.subnet_manager.as_mut()) {
            sm.sm_host = Some(convert::sync_status_to_pb(&sync.status()));
        }
        Ok(Response::new(node))
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
        let subject = Subject {
            instance: &instance,
            partition: &partition.id,
            pkey: partition.pkey,
            membership,
        };
        let admitted = audit::agent_admitted(caller.as_ref(), "AttachPartition", &subject);
        let result = self.attach(r).await;
        admitted.answered();
        audit::agent_call(
            caller.as_ref(),
            "AttachPartition",
            &subject,
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
        let page = convert::list_page(
            request.into_inner(),
            self.limits.list_default_page_size,
            self.limits.list_max_page_size,
        )
        .map_err(convert::status)?;
        let found = self
            .agent
            .list_page(&page.filter, page.after.as_deref(), page.size)
            .map_err(convert::status)?;
        let next_page_token = match found.attachments.last() {
            Some(last) if found.more => page_token::encode(last.instance_id.as_str(), &page.filter),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListAttachmentsResponse {
            attachments: found
                .attachments
                .iter()
                .map(convert::attachment_to_pb)
                .collect(),
            next_page_token,
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
        let admitted = audit::agent_admitted(
            caller.as_ref(),
            "ReleaseInstance",
            &Subject {
                instance: &instance,
                ..Subject::default()
            },
        );
        let result = self.release(r).await;
        let released = result
            .as_ref()
            .ok()
            .and_then(|a| a.get_ref().attachment.clone())
            .unwrap_or_default();
        let partition = released.partition.unwrap_or_default();
        let membership = membership_name(released.membership).unwrap_or("");
        admitted.answered();
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

    type WatchEventsStream = WireEvents;

    async fn watch_events(
        &self,
        request: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<WireEvents>, Status> {
        // The slot is held by the stream and freed when the client goes away.
        let slot = self.streams.acquire(request.extensions().get())?;
        let r = request.into_inner();
        let events = self
            .agent
            .watch(WatchFrom {
                after: r.after_seq,
                epoch: r.log_epoch,
                follow: !r.no_follow,
                batch: self.limits.watch_batch,
                max_age: (self.limits.watch_max_age_secs > 0)
                    .then(|| std::time::Duration::from_secs(self.limits.watch_max_age_secs)),
            })
            .map_err(convert::status)?;
        let node_id = self.node_id.clone();
        let epoch = self.agent.log_epoch();
        let stream = events.map(move |item| {
            let _slot = &slot;
            item.map(|e| convert::event_to_pb(&e, &node_id, &epoch))
                .map_err(convert::status)
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
