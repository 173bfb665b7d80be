//! The typed `fabric.agent.v1` client: what the CLI (or anything embedding the client) calls
//! instead of the generated tonic client. Calls answer with the protocol's messages or a
//! [`CallError`] that carries the gRPC code as a [`StatusCode`], the daemon's message and its
//! `fabric-error-reason` trailer; no tonic type crosses this boundary.

use super::convert::ERROR_REASON_TRAILER;
use crate::api::client::{self, ClientError, ClientTls};
use crate::proto::agent as pb;
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use std::path::Path;
use tonic::transport::Channel;

/// A gRPC status code, spelled as the API documentation spells it (`INVALID_ARGUMENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// OK.
    Ok,
    /// CANCELLED.
    Cancelled,
    /// UNKNOWN.
    Unknown,
    /// INVALID_ARGUMENT.
    InvalidArgument,
    /// DEADLINE_EXCEEDED.
    DeadlineExceeded,
    /// NOT_FOUND.
    NotFound,
    /// ALREADY_EXISTS.
    AlreadyExists,
    /// PERMISSION_DENIED.
    PermissionDenied,
    /// RESOURCE_EXHAUSTED.
    ResourceExhausted,
    /// FAILED_PRECONDITION.
    FailedPrecondition,
    /// ABORTED.
    Aborted,
    /// OUT_OF_RANGE.
    OutOfRange,
    /// UNIMPLEMENTED.
    Unimplemented,
    /// INTERNAL.
    Internal,
    /// UNAVAILABLE.
    Unavailable,
    /// DATA_LOSS.
    DataLoss,
    /// UNAUTHENTICATED.
    Unauthenticated,
}

impl StatusCode {
    /// The code's name as the API documentation spells it.
    pub fn name(self) -> &'static str {
        match self {
            StatusCode::Ok => "OK",
            StatusCode::Cancelled => "CANCELLED",
            StatusCode::Unknown => "UNKNOWN",
            StatusCode::InvalidArgument => "INVALID_ARGUMENT",
            StatusCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            StatusCode::NotFound => "NOT_FOUND",
            StatusCode::AlreadyExists => "ALREADY_EXISTS",
            StatusCode::PermissionDenied => "PERMISSION_DENIED",
            StatusCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            StatusCode::FailedPrecondition => "FAILED_PRECONDITION",
            StatusCode::Aborted => "ABORTED",
            StatusCode::OutOfRange => "OUT_OF_RANGE",
            StatusCode::Unimplemented => "UNIMPLEMENTED",
            StatusCode::Internal => "INTERNAL",
            StatusCode::Unavailable => "UNAVAILABLE",
            StatusCode::DataLoss => "DATA_LOSS",
            StatusCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl std::fmt::Display for StatusCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<tonic::Code> for StatusCode {
    fn from(code: tonic::Code) -> Self {
        use tonic::Code as C;
        match code {
            C::Ok => StatusCode::Ok,
            C::Cancelled => StatusCode::Cancelled,
            C::Unknown => StatusCode::Unknown,
            C::InvalidArgument => StatusCode::InvalidArgument,
            C::DeadlineExceeded => StatusCode::DeadlineExceeded,
            C::NotFound => StatusCode::NotFound,
            C::AlreadyExists => StatusCode::AlreadyExists,
            C::PermissionDenied => StatusCode::PermissionDenied,
            C::ResourceExhausted => StatusCode::ResourceExhausted,
            C::FailedPrecondition => StatusCode::FailedPrecondition,
            C::Aborted => StatusCode::Aborted,
            C::OutOfRange => StatusCode::OutOfRange,
            C::Unimplemented => StatusCode::Unimplemented,
            C::Internal => StatusCode::Internal,
            C::Unavailable => StatusCode::Unavailable,
            C::DataLoss => StatusCode::DataLoss,
            C::Unauthenticated => StatusCode::Unauthenticated,
        }
    }
}

/// A call that did not succeed: the daemon's answer (code, message, reason trailer), or a
/// connection that broke before it answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CallError {
    /// The gRPC code.
    pub code: StatusCode,
    /// The daemon's message (or the transport's, when the connection broke).
    pub message: String,
    /// The `fabric-error-reason` trailer (e.g. `TABLE_FULL`), when the daemon sent one.
    pub reason: Option<String>,
    /// The status came from the transport, not from the daemon: the connection broke.
    pub transport: bool,
}

impl CallError {
    /// An error this client raises itself, without a call (e.g. a daemon that misbehaves).
    pub fn local(code: StatusCode, message: impl Into<String>) -> Self {
        CallError {
            code,
            message: message.into(),
            reason: None,
            transport: false,
        }
    }

    /// The daemon went away between connecting and answering.
    pub fn is_unreachable(&self) -> bool {
        self.code == StatusCode::Unavailable && self.transport
    }
}

impl From<tonic::Status> for CallError {
    fn from(s: tonic::Status) -> Self {
        CallError {
            code: s.code().into(),
            message: s.message().to_owned(),
            reason: s
                .metadata()
                .get(ERROR_REASON_TRAILER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            transport: std::error::Error::source(&s).is_some(),
        }
    }
}

/// A `fabric.agent.v1.FabricAgent` client over one channel.
#[derive(Debug, Clone)]
pub struct AgentClient(FabricAgentClient<Channel>);

/// The events a `WatchEvents` call streams, in order.
pub struct RemoteEvents(tonic::Streaming<pb::Event>);

impl RemoteEvents {
    /// The next event; `None` when the stream ended cleanly.
    pub async fn next(&mut self) -> Option<Result<pb::Event, CallError>> {
        self.0.message().await.map_err(CallError::from).transpose()
    }
}

impl AgentClient {
    /// Connects over the daemon's unix socket.
    pub async fn unix(path: &Path) -> Result<AgentClient, ClientError> {
        Ok(AgentClient(FabricAgentClient::new(
            client::unix(path).await?,
        )))
    }

    /// Connects over TCP; `tls` applies to https URLs.
    pub async fn tcp(url: &str, tls: &ClientTls) -> Result<AgentClient, ClientError> {
        Ok(AgentClient(FabricAgentClient::new(
            client::tcp(url, tls).await?,
        )))
    }

    /// `GetNode`: this node's view.
    pub async fn node(&mut self) -> Result<pb::GetNodeResponse, CallError> {
        Ok(self.0.get_node(pb::GetNodeRequest {}).await?.into_inner())
    }

    /// `AttachPartition`.
    pub async fn attach(
        &mut self,
        request: pb::AttachPartitionRequest,
    ) -> Result<pb::AttachPartitionResponse, CallError> {
        Ok(self.0.attach_partition(request).await?.into_inner())
    }

    /// `GetAttachment`: one instance's attachment (NOT_FOUND when there is none).
    pub async fn get(&mut self, instance_id: &str) -> Result<pb::Attachment, CallError> {
        let request = pb::GetAttachmentRequest {
            instance_id: instance_id.to_owned(),
        };
        Ok(self.0.get_attachment(request).await?.into_inner())
    }

    /// `ReleaseInstance`.
    pub async fn release(
        &mut self,
        request: pb::ReleaseInstanceRequest,
    ) -> Result<pb::ReleaseInstanceResponse, CallError> {
        Ok(self.0.release_instance(request).await?.into_inner())
    }

    /// `ListAttachments`, every page: follows `next_page_token` from the request's page to the
    /// last and answers with all the attachments matching the request's filters.
    pub async fn list(
        &mut self,
        mut request: pb::ListAttachmentsRequest,
    ) -> Result<Vec<pb::Attachment>, CallError> {
        let mut all = Vec::new();
        loop {
            let page = self.0.list_attachments(request.clone()).await?.into_inner();
            all.extend(page.attachments);
            if page.next_page_token.is_empty() {
                return Ok(all);
            }
            if page.next_page_token == request.page_token {
                return Err(CallError::local(
                    StatusCode::Internal,
                    "the agent returned the same page token twice; stopping",
                ));
            }
            request.page_token = page.next_page_token;
        }
    }

    /// `WatchEvents`: the stream of events the request asks for.
    pub async fn events(
        &mut self,
        request: pb::WatchEventsRequest,
    ) -> Result<RemoteEvents, CallError> {
        Ok(RemoteEvents(
            self.0.watch_events(request).await?.into_inner(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_spelled_as_in_the_api_docs() {
        assert_eq!(
            StatusCode::from(tonic::Code::InvalidArgument).name(),
            "INVALID_ARGUMENT"
        );
        assert_eq!(StatusCode::from(tonic::Code::NotFound).name(), "NOT_FOUND");
        assert_eq!(StatusCode::from(tonic::Code::Ok).to_string(), "OK");
    }

    #[test]
    fn a_status_keeps_its_code_message_and_reason() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(ERROR_REASON_TRAILER, "TABLE_FULL".parse().unwrap());
        let status =
            tonic::Status::with_metadata(tonic::Code::ResourceExhausted, "no room", metadata);
        let e = CallError::from(status);
        assert_eq!(e.code, StatusCode::ResourceExhausted);
        assert_eq!(e.message, "no room");
        assert_eq!(e.reason.as_deref(), Some("TABLE_FULL"));
        assert!(!e.transport);
        assert!(!e.is_unreachable());
        assert_eq!(e.to_string(), "RESOURCE_EXHAUSTED: no room");
    }

    #[test]
    fn an_answered_unavailable_is_not_unreachable() {
        let e = CallError::from(tonic::Status::unavailable("stopping"));
        assert!(!e.is_unreachable());
        let mut broken = tonic::Status::unavailable("connection reset");
        broken.set_source(std::sync::Arc::new(std::io::Error::other(
            "connection reset",
        )));
        let e = CallError::from(broken);
        assert!(e.transport);
        assert!(e.is_unreachable());
    }
}
