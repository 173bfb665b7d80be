//! `[metrics]`: the OpenMetrics endpoint.

use super::error::{invalid, ConfigError};
use serde::Deserialize;
use std::net::SocketAddr;

/// Where the endpoint listens unless `listen` says otherwise (loopback).
pub const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9464);

/// `[metrics]`: an OpenMetrics endpoint (`GET /metrics`), off by default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve metrics.
    #[serde(default)]
    pub enabled: bool,
    /// Where (default 127.0.0.1:9464, loopback). Another address needs `allow_remote = true`:
    /// the metrics name instances, partitions' states and ports. See [`MetricsConfig::addr`].
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Allow a non-loopback listen address.
    #[serde(default)]
    pub allow_remote: bool,
}

impl MetricsConfig {
    /// The address the endpoint listens on (the configured one or the default).
    pub fn addr(&self) -> SocketAddr {
        self.listen.unwrap_or(DEFAULT_METRICS_LISTEN)
    }

    /// Settings that enable nothing are refused (a `listen` without `enabled = true` would
    /// listen nowhere, silently); an enabled endpoint listens on loopback unless
    /// `allow_remote` says otherwise.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            let given = [
                ("listen", self.listen.is_some()),
                ("allow_remote", self.allow_remote),
            ];
            if let Some((key, _)) = given.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    "metrics.enabled",
                    format!(
                        "[metrics] {key} is set but enabled is not true, so metrics would be \
                         served nowhere; add enabled = true (or remove {key})"
                    ),
                ));
            }
        }
        if self.enabled && !self.addr().ip().is_loopback() && !self.allow_remote {
            return Err(invalid(
                "metrics.listen",
                format!(
                    "{} is not a loopback address; set allow_remote = true to serve metrics beyond this host",
                    self.addr()
                ),
            ));
        }
        Ok(())
    }
}
