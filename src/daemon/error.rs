//! Why the daemon could not start: each failure keeps its cause as `source`.

use crate::agent::AgentError;
use crate::api::sm_v1::RemoteError;
use crate::api::ServeError;
use crate::observe::ObserveError;
use crate::sm::opensm::OpenSmError;
use crate::sm::SmError;
use crate::store::StoreError;
use std::net::SocketAddr;
use thiserror::Error;

/// A start-up failure of the daemon (or of a one-shot command that builds part of it).
#[derive(Debug, Error)]
pub enum StartError {
    /// `[grants]`: a key file could not be read or does not hold a key.
    #[error("cannot load the grant keys: {0}")]
    Grants(#[source] crate::config::ConfigError),
    /// The durable store could not be opened.
    #[error("cannot open the store: {0}")]
    Store(#[source] StoreError),
    /// The OpenSM backend could not load its state.
    #[error("cannot start the opensm backend: {0}")]
    OpenSm(#[source] OpenSmError),
    /// The remote backend's channel could not be built.
    #[error("cannot start the remote backend: {0}")]
    Remote(#[source] RemoteError),
    /// The UFM backend refused its settings or could not read its TLS material.
    #[error("cannot start the ufm backend: {0}")]
    Ufm(#[source] SmError),
    /// The configured observer could not be opened.
    #[error("cannot open the port observer: {0}")]
    Observer(#[source] ObserveError),
    /// The observer opened but the ports could not be read.
    #[error("cannot read the ports: {0}")]
    ReadPorts(#[source] ObserveError),
    /// The embedded fabric's ports exist only inside a running daemon.
    #[error("the embedded fabric's tables live in the daemon: use `fabric-agent node`")]
    EmbeddedOutsideDaemon,
    /// The agent could not load its state from the store.
    #[error("cannot start the agent: {0}")]
    Agent(#[source] AgentError),
    /// The gRPC listeners could not be bound or their TLS material loaded.
    #[error("cannot listen: {0}")]
    Listen(#[source] ServeError),
    /// The metrics listener could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Metrics {
        /// The configured address.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
}
