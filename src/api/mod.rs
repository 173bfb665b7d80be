//! gRPC: the `fabric.agent.v1.FabricAgent` service, health, reflection, and the listeners
//! (unix socket; TCP with mTLS and a client allowlist, or plaintext on loopback when asked).
//! Handlers only translate: one module per protocol boundary holds its protobuf <-> domain
//! mapping and its one error <-> status mapping (`convert` for `fabric.agent.v1`, `sm_v1` for
//! `fabric.sm.v1`); `sm_client` is the remote subnet-manager backend's gRPC client;
//! `agent_client` the typed `fabric.agent.v1` client the CLI uses.

pub mod agent_client;
mod audit;
mod auth;
mod caller;
pub mod client;
pub mod conn_limits;
pub mod convert;
pub mod grant_v1;
pub mod limits;
pub mod metrics;
mod node_identity;
pub mod partitions;
pub mod proto;
mod server;
mod server_tls;
mod service;
pub mod settings;
pub mod sm_client;
pub mod sm_host_metrics;
pub mod sm_peers;
pub mod sm_v1;
mod socket_guard;

pub use auth::{CertIdentity, ClientAllowlist, ClientId, ClientIdError};
pub use caller::{Caller, Guarded, LocalPolicy, Policy};
pub use node_identity::{NodeMapping, NodeMappingError};
pub use server::{serve, Listeners, ServeError};
pub use server_tls::{TlsLoaded, TlsReloader};
pub use service::AgentService;
