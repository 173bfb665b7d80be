//! gRPC: the `fabric.agent.v1.FabricAgent` service, health, reflection, and the listeners
//! (unix socket; TCP with mTLS and a client allowlist, or plaintext on loopback when asked).
//! Handlers only translate: `convert` holds every protobuf <-> domain mapping and the one
//! error -> status mapping.

mod audit;
mod auth;
mod caller;
pub mod client;
pub mod convert;
pub mod limits;
pub mod metrics;
mod node_identity;
pub mod partitions;
mod server;
mod server_tls;
mod service;
mod socket_guard;

pub use auth::{CertIdentity, ClientAllowlist, ClientId};
pub use caller::{Caller, Guarded, LocalPolicy, Policy};
pub use node_identity::NodeMapping;
pub use server::{serve, Listeners, ServeError};
pub use server_tls::{TlsLoaded, TlsReloader};
pub use service::AgentService;
