//! The call gate every gRPC call passes before a handler sees it (`guarded`, the tower layer):
//! who calls (`caller`: SO_PEERCRED on the unix socket, typed mTLS identities on TCP, and each
//! listener's policy), whether they may (`auth` allowlists, `node_identity` the certificate ->
//! node mapping, `access` the mTLS lists in effect, replaced on SIGHUP), within which bounds (`limits`
//! per call and stream, `conn_limits` per TCP connection, `quota` per certificate identity), the unix socket's mode and group
//! (`socket_guard`), and the audit trail of mutating calls (`audit`).

mod access;
pub(super) mod audit;
mod auth;
mod caller;
pub mod conn_limits;
mod guarded;
pub mod limits;
mod node_identity;
pub mod quota;
pub(super) mod socket_guard;

pub use access::{LiveTlsAccess, TlsAccess, TlsService};
pub use auth::{CertIdentity, ClientAllowlist, ClientId, ClientIdError};
pub use caller::{Caller, LocalPolicy, Policy};
pub use guarded::Guarded;
pub use node_identity::{NodeMapping, NodeMappingError};
