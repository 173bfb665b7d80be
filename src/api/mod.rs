//! gRPC: the `fabric.agent.v1.FabricAgent` service, the SM host's `fabric.sm.v1.Partitions`,
//! health, reflection, and the listeners (unix socket; TCP with mTLS and a client allowlist, or
//! plaintext on loopback when asked). One folder per protocol, each with its services, its
//! protobuf <-> domain mapping and its one error <-> status mapping, and its client:
//! [`agent_v1`] and [`sm_v1`]; [`gate`] is the call gate every call passes (who calls, may
//! they, within which bounds, the audit trail). The shared pieces sit here: the server and its
//! listeners, reloadable TLS, the metrics listener, client channels, the grant codec
//! ([`grant_v1`]), the listeners' settings and the generated code.

pub mod agent_v1;
pub mod client;
pub mod gate;
pub mod grant_v1;
pub mod metrics;
pub mod proto;
mod server;
mod server_tls;
pub mod settings;
pub mod sm_v1;

pub use agent_v1::AgentService;
pub use gate::{
    Caller, CertIdentity, ClientAllowlist, ClientId, ClientIdError, Guarded, LocalPolicy,
    NodeMapping, NodeMappingError, Policy,
};
pub use server::{serve, Listeners, ServeError};
pub use server_tls::{TlsLoaded, TlsReloader};
pub use sm_v1::{PartitionsService, RemoteSm};
