//! Binds the daemon's listeners: gRPC (unix socket, TCP) and, when enabled, metrics.

use super::StartError;
use crate::api::Listeners;
use crate::config::Config;
use tokio::net::TcpListener;

/// The bound listeners, before anything is served on them.
pub struct Bound {
    /// The gRPC listeners.
    pub grpc: Listeners,
    /// The metrics listener, when `[metrics] enabled`.
    pub metrics: Option<TcpListener>,
}

/// Binds every listener `config` asks for.
pub async fn bind(config: &Config) -> Result<Bound, StartError> {
    let grpc = Listeners::bind(&config.listen)
        .await
        .map_err(StartError::Listen)?;
    let metrics = if config.metrics.enabled {
        let addr = config.metrics.addr();
        let listener = crate::api::metrics::bind(addr)
            .await
            .map_err(|source| StartError::Metrics { addr, source })?;
        Some(listener)
    } else {
        None
    };
    Ok(Bound { grpc, metrics })
}
