//! Remote backend settings: the SM host's agent (`fabric.sm.v1.Partitions`) reached over gRPC
//! with mTLS (or plaintext to a loopback address, for tests and single-host rigs). The gRPC
//! client itself is `api::sm_client::RemoteSm` (tonic stays in `api/`).
//!
//! Each apply sends the node's complete desired set with the generation the reconciler gave it
//! (a counter persisted in the node's store, never a clock), so the SM host refuses a delayed
//! older request even across agent restarts.

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// `[subnet_manager.remote]` settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// The SM host's agent: `https://host:port` (mTLS), or `http://` to a loopback address.
    pub endpoint: String,
    /// PEM CA bundle the SM host's certificate must chain to.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate of this node.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// PEM private key of this node.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name to verify in the SM host's certificate (default: the endpoint's host).
    #[serde(default)]
    pub domain_name: Option<String>,
    /// Connect timeout, milliseconds (default 3000).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Per-request timeout, milliseconds (default 30000: a request waits for a file write and a
    /// heavy sweep, possibly behind a burst of other nodes' requests).
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
}

/// Why `[subnet_manager.remote]` is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RemoteConfigError {
    /// An https endpoint without its certificates.
    #[error("an https endpoint needs ca, cert and key")]
    HttpsWithoutCertificates,
    /// Plaintext to another host.
    #[error("plaintext http is only allowed to a loopback address")]
    PlaintextNotLoopback,
    /// Neither https nor http.
    #[error("endpoint {0:?} must start with https:// or http://")]
    Scheme(String),
    /// A timeout of 0.
    #[error("timeouts must be above 0")]
    ZeroTimeout,
}

fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or_default();
    let host = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

impl RemoteConfig {
    /// Checks that https has its certificates and http goes only to loopback.
    pub fn validate(&self) -> Result<(), RemoteConfigError> {
        if self.endpoint.starts_with("https://") {
            if self.ca.is_none() || self.cert.is_none() || self.key.is_none() {
                return Err(RemoteConfigError::HttpsWithoutCertificates);
            }
        } else if self.endpoint.starts_with("http://") {
            if !is_loopback_http(&self.endpoint) {
                return Err(RemoteConfigError::PlaintextNotLoopback);
            }
        } else {
            return Err(RemoteConfigError::Scheme(self.endpoint.clone()));
        }
        if self.connect_timeout_ms == Some(0) || self.request_timeout_ms == Some(0) {
            return Err(RemoteConfigError::ZeroTimeout);
        }
        Ok(())
    }

    /// Connect timeout (default 3 s).
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.unwrap_or(3000))
    }

    /// Per-request timeout (default 30 s).
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.unwrap_or(30_000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rules() {
        let mut c = RemoteConfig {
            endpoint: "http://127.0.0.1:7443".into(),
            ..RemoteConfig::default()
        };
        assert!(c.validate().is_ok());
        c.endpoint = "http://[::1]:7443".into();
        assert!(c.validate().is_ok());
        c.endpoint = "http://smhost:7443".into();
        assert_eq!(c.validate(), Err(RemoteConfigError::PlaintextNotLoopback));
        c.endpoint = "https://smhost:7443".into();
        assert_eq!(
            c.validate(),
            Err(RemoteConfigError::HttpsWithoutCertificates)
        );
        c.ca = Some("ca.pem".into());
        c.cert = Some("c.pem".into());
        c.key = Some("k.pem".into());
        assert!(c.validate().is_ok());
        c.request_timeout_ms = Some(0);
        assert_eq!(c.validate(), Err(RemoteConfigError::ZeroTimeout));
        c.endpoint = "smhost:7443".into();
        assert!(matches!(c.validate(), Err(RemoteConfigError::Scheme(_))));
    }
}
