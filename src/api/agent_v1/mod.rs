//! `fabric.agent.v1`, the control plane's protocol: the `FabricAgent` service (thin handlers),
//! its protobuf <-> domain mapping and its one `AgentError` -> status mapping (`convert`), the
//! ListAttachments page token, and the typed client the CLI uses (no tonic type above `api`).

pub mod client;
pub mod convert;
mod convert_sm_hosts;
pub mod page_token;
mod service;

pub use client::AgentClient;
pub use service::AgentService;
