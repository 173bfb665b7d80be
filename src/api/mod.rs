//! gRPC: the `fabric.agent.v1.FabricAgent` service, health, reflection, and the listeners
//! (unix socket; TCP with mTLS and a client allowlist, or plaintext on loopback when asked).
//! Handlers only translate: `convert` holds every protobuf <-> domain mapping and the one
//! error -> status mapping.

mod auth;
pub mod client;
pub mod convert;
pub mod limits;
pub mod metrics;
pub mod partitions;
mod server;
mod service;
mod socket_guard;

pub use auth::ClientAllowlist;
pub use server::{serve, Listeners, ServeError};
pub use service::AgentService;
