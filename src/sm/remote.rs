//! Remote backend settings: the SM host's agent (`fabric.sm.v1.Partitions`) reached over gRPC
//! with mTLS (or plaintext to a loopback address, for tests and single-host rigs). The gRPC
//! client itself is `api::sm_v1::RemoteSm` (tonic stays in `api/`).
//!
//! Each apply sends the node's complete desired set with the generation the reconciler gave it
//! (a counter persisted in the node's store, never a clock), so the SM host refuses a delayed
//! older request even across agent restarts.
//!
//! A fabric with several SM hosts (a master OpenSM and its standbys, each with its own agent)
//! lists them all in `endpoints`: every apply goes to every one of them, and is acknowledged only
//! when each acknowledged that generation (docs/OPENSM.md, "Several SM hosts").

pub mod reload;

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// `[subnet_manager.remote]` settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// The SM host's agent: `https://host:port` (mTLS), or `http://` to a loopback address.
    /// The one-host form of `endpoints` (set one of the two).
    #[serde(default)]
    pub endpoint: String,
    /// Every SM host's agent of the fabric (master and standbys), each as `endpoint`. An apply
    /// is acknowledged only when every one of them acknowledged it.
    #[serde(default)]
    pub endpoints: Vec<String>,
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
    /// Neither `endpoint` nor `endpoints`, or both.
    #[error("set either endpoint (one SM host) or endpoints (every SM host of the fabric), not both and not neither")]
    EndpointCount,
    /// One SM host listed twice.
    #[error("endpoint {0:?} is listed twice")]
    DuplicateEndpoint(String),
    /// More SM hosts than the agent fans out to.
    #[error("at most {MAX_ENDPOINTS} endpoints")]
    TooManyEndpoints,
}

/// Most SM hosts one node sends its sets to.
pub const MAX_ENDPOINTS: usize = 8;

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
    /// Every SM host's endpoint: `endpoints`, or `endpoint` as a one-element list.
    pub fn all_endpoints(&self) -> Vec<String> {
        if self.endpoints.is_empty() && !self.endpoint.is_empty() {
            vec![self.endpoint.clone()]
        } else {
            self.endpoints.clone()
        }
    }

    /// Checks that exactly one of `endpoint` / `endpoints` names the SM hosts, each once, that
    /// https has its certificates and http goes only to loopback.
    pub fn validate(&self) -> Result<(), RemoteConfigError> {
        if self.endpoint.is_empty() == self.endpoints.is_empty() {
            return Err(RemoteConfigError::EndpointCount);
        }
        let all = self.all_endpoints();
        if all.len() > MAX_ENDPOINTS {
            return Err(RemoteConfigError::TooManyEndpoints);
        }
        for (i, endpoint) in all.iter().enumerate() {
            if all[..i].contains(endpoint) {
                return Err(RemoteConfigError::DuplicateEndpoint(endpoint.clone()));
            }
            if endpoint.starts_with("https://") {
                if self.ca.is_none() || self.cert.is_none() || self.key.is_none() {
                    return Err(RemoteConfigError::HttpsWithoutCertificates);
                }
            } else if endpoint.starts_with("http://") {
                if !is_loopback_http(endpoint) {
                    return Err(RemoteConfigError::PlaintextNotLoopback);
                }
            } else {
                return Err(RemoteConfigError::Scheme(endpoint.clone()));
            }
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

    #[test]
    fn several_sm_hosts() {
        let mut c = RemoteConfig {
            endpoints: vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
            ..RemoteConfig::default()
        };
        assert!(c.validate().is_ok());
        assert_eq!(c.all_endpoints().len(), 2);
        c.endpoint = "http://127.0.0.1:3".into();
        assert_eq!(c.validate(), Err(RemoteConfigError::EndpointCount));
        c.endpoint.clear();
        c.endpoints.push("http://127.0.0.1:1".into());
        assert_eq!(
            c.validate(),
            Err(RemoteConfigError::DuplicateEndpoint(
                "http://127.0.0.1:1".into()
            ))
        );
        c.endpoints = vec!["http://127.0.0.1:1".into(), "http://smhost2:7443".into()];
        assert_eq!(c.validate(), Err(RemoteConfigError::PlaintextNotLoopback));
        c.endpoints.clear();
        assert_eq!(c.validate(), Err(RemoteConfigError::EndpointCount));
        c.endpoints = (0..9).map(|i| format!("http://127.0.0.1:{i}")).collect();
        assert_eq!(c.validate(), Err(RemoteConfigError::TooManyEndpoints));
        let one = RemoteConfig {
            endpoint: "http://127.0.0.1:7443".into(),
            ..RemoteConfig::default()
        };
        assert_eq!(
            one.all_endpoints(),
            vec!["http://127.0.0.1:7443".to_owned()]
        );
    }
}
