//! Remote backend: reaches the SM host's agent (`fabric.sm.v1.Partitions`) over gRPC with mTLS
//! (or plaintext to a loopback address, for tests and single-host rigs).
//!
//! Each apply sends the node's complete desired set with the generation the reconciler gave it
//! (a counter persisted in the node's store, never a clock), so the SM host refuses a delayed
//! older request even across agent restarts.

use super::{ApplyOutcome, SmError, SubnetManager};
use crate::domain::{Membership, NodeMemberships};
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use async_trait::async_trait;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

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

/// Why the remote backend could not be built.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// A setting is missing or inconsistent.
    #[error("invalid subnet_manager.remote: {0}")]
    Config(String),
    /// A certificate or key file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// tonic refused the endpoint or TLS settings.
    #[error("endpoint: {0}")]
    Endpoint(#[from] tonic::transport::Error),
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
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoint.starts_with("https://") {
            if self.ca.is_none() || self.cert.is_none() || self.key.is_none() {
                return Err("an https endpoint needs ca, cert and key".into());
            }
        } else if self.endpoint.starts_with("http://") {
            if !is_loopback_http(&self.endpoint) {
                return Err("plaintext http is only allowed to a loopback address".into());
            }
        } else {
            return Err(format!(
                "endpoint {:?} must start with https:// or http://",
                self.endpoint
            ));
        }
        if self.connect_timeout_ms == Some(0) || self.request_timeout_ms == Some(0) {
            return Err("timeouts must be above 0".into());
        }
        Ok(())
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.unwrap_or(3000))
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.unwrap_or(30_000))
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, RemoteError> {
    std::fs::read(path).map_err(|source| RemoteError::Read {
        path: path.clone(),
        source,
    })
}

/// The remote subnet manager.
pub struct RemoteSm {
    client: PartitionsClient<Channel>,
}

impl RemoteSm {
    /// Builds the client. The connection is made lazily on the first apply, so the SM host
    /// need not be up when the agent starts.
    pub fn new(config: &RemoteConfig) -> Result<RemoteSm, RemoteError> {
        config.validate().map_err(RemoteError::Config)?;
        let mut endpoint = Endpoint::from_shared(config.endpoint.clone())?
            .connect_timeout(config.connect_timeout())
            .timeout(config.request_timeout());
        if config.endpoint.starts_with("https://") {
            let (Some(ca), Some(cert), Some(key)) = (&config.ca, &config.cert, &config.key) else {
                return Err(RemoteError::Config("https needs ca, cert and key".into()));
            };
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read(ca)?))
                .identity(Identity::from_pem(read(cert)?, read(key)?));
            if let Some(d) = &config.domain_name {
                tls = tls.domain_name(d.clone());
            }
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok(RemoteSm {
            client: PartitionsClient::new(endpoint.connect_lazy()),
        })
    }
}

/// The generation the SM host holds, when `status` is its ABORTED refusing a generation
/// (`fabric.sm.v1.StaleGeneration` in the status details, else the `fabric-stored-generation`
/// trailer); `None` for any other status.
pub fn stored_generation(status: &tonic::Status) -> Option<u64> {
    use prost::Message;
    if status.code() != Code::Aborted {
        return None;
    }
    let from_details = pb::ErrorStatus::decode(status.details())
        .ok()
        .and_then(|s| {
            s.details
                .into_iter()
                .find(|a| a.type_url == "type.googleapis.com/fabric.sm.v1.StaleGeneration")
        })
        .and_then(|a| pb::StaleGeneration::decode(&a.value[..]).ok())
        .map(|s| s.stored);
    from_details.or_else(|| {
        status
            .metadata()
            .get("fabric-stored-generation")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    })
}

/// Maps a gRPC status to the backend error: the SM host's ABORTED refusing a generation becomes
/// [`SmError::StaleGeneration`] (`sent` is the generation the request carried), other transient
/// codes are retried soon, the rest are refusals carrying the SM host's message.
pub fn sm_error_of(status: &tonic::Status, sent: u64) -> SmError {
    if let Some(stored) = stored_generation(status) {
        return SmError::StaleGeneration { sent, stored };
    }
    let msg = format!("SM host: {}", status.message());
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
            SmError::Unavailable(msg)
        }
        // tonic reports transport failures (refused connection, reset) as Unknown with a
        // transport source.
        Code::Unknown if std::error::Error::source(status).is_some() => SmError::Unavailable(msg),
        _ => SmError::Refused(msg),
    }
}

/// A node's desired set as `fabric.sm.v1` sends it.
pub fn memberships_to_proto(desired: &NodeMemberships, generation: u64) -> pb::NodeMemberships {
    pb::NodeMemberships {
        node_id: desired.node_id.clone(),
        port_guids: desired.port_guids.iter().map(ToString::to_string).collect(),
        keys: desired
            .keys
            .iter()
            .map(|(k, s)| pb::KeyMembership {
                pkey: u32::from(k.base()),
                full: s.membership == Membership::Full,
                name: s.name.clone(),
            })
            .collect(),
        generation,
    }
}

#[async_trait]
impl SubnetManager for RemoteSm {
    fn backend(&self) -> &'static str {
        "remote"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let request = pb::SetNodeMembershipsRequest {
            memberships: Some(memberships_to_proto(desired, generation)),
        };
        let mut client = self.client.clone();
        let reply = client
            .set_node_memberships(request)
            .await
            .map_err(|s| sm_error_of(&s, generation))?
            .into_inner();
        Ok(ApplyOutcome {
            detail: format!(
                "SM host merged the memberships ({} sweeps requested there so far)",
                reply.sweeps
            ),
        })
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
        assert!(c.validate().is_err());
        c.endpoint = "https://smhost:7443".into();
        assert!(c.validate().is_err());
        c.ca = Some("ca.pem".into());
        c.cert = Some("c.pem".into());
        c.key = Some("k.pem".into());
        assert!(c.validate().is_ok());
        c.request_timeout_ms = Some(0);
        assert!(c.validate().is_err());
    }

    #[test]
    fn statuses_map_to_errors() {
        assert!(sm_error_of(&tonic::Status::unavailable("x"), 1).is_transient());
        assert!(sm_error_of(&tonic::Status::deadline_exceeded("x"), 1).is_transient());
        let refused = sm_error_of(&tonic::Status::resource_exhausted("table full"), 1);
        assert_eq!(refused, SmError::Refused("SM host: table full".into()));
        // An ABORTED without the generation detail stays a transient Unavailable.
        assert_eq!(
            sm_error_of(&tonic::Status::aborted("conflict"), 3),
            SmError::Unavailable("SM host: conflict".into())
        );
        // The trailer alone is enough.
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("fabric-stored-generation", "12".parse().unwrap());
        let s = tonic::Status::with_metadata(Code::Aborted, "stale", md);
        assert_eq!(
            sm_error_of(&s, 7),
            SmError::StaleGeneration {
                sent: 7,
                stored: 12
            }
        );
    }
}
