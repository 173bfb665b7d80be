//! `[metrics]`: the OpenMetrics endpoint.

use super::error::{invalid, ConfigError};
use serde::Deserialize;
use std::net::SocketAddr;

/// `[metrics]`: an OpenMetrics endpoint (`GET /metrics`), off by default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve metrics.
    #[serde(default)]
    pub enabled: bool,
    /// Where (default 127.0.0.1:9464, loopback). Another address needs `allow_remote = true`:
    /// the metrics name instances, partitions' states and ports.
    #[serde(default = "default_metrics_listen")]
    pub listen: SocketAddr,
    /// Allow a non-loopback listen address.
    #[serde(default)]
    pub allow_remote: bool,
}

fn default_metrics_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: false,
            listen: default_metrics_listen(),
            allow_remote: false,
        }
    }
}

impl MetricsConfig {
    /// An enabled endpoint listens on loopback unless `allow_remote` says otherwise.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled && !self.listen.ip().is_loopback() && !self.allow_remote {
            return Err(invalid(
                "metrics.listen",
                format!(
                    "{} is not a loopback address; set allow_remote = true to serve metrics beyond this host",
                    self.listen
                ),
            ));
        }
        Ok(())
    }
}
