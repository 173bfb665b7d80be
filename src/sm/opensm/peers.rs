//! `[subnet_manager.opensm_ha]`: the other SM hosts of the fabric. Every SM host (a master
//! OpenSM and its standbys) runs an agent owning its own OpenSM's file; the nodes send their sets
//! to all of them. Each agent pulls its peers' stored sets (`fabric.sm.v1.Partitions/
//! PullNodeSets`) at start and every `sync_interval_ms`, re-judges every set it learns and keeps,
//! per node, the highest generation ([`super::sync`]).

use crate::sm::remote::{RemoteConfig, RemoteConfigError};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// `[subnet_manager.opensm_ha]` settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PeersConfig {
    /// The other SM hosts' agents: `https://host:port` (mTLS with `ca`, `cert`, `key`), or
    /// `http://` to a loopback address (test rigs).
    pub peers: Vec<String>,
    /// Who may pull this host's sets: the peers' certificate identities, typed as everywhere
    /// (`dns:NAME`, `uri:URI`, `cn:NAME`). Their certificates must also pass the listener's
    /// gate (`[listen.tls] partitions_clients`, where SM hosts usually are as nodes).
    #[serde(default)]
    pub peer_identities: Vec<String>,
    /// PEM CA bundle the peers' certificates must chain to.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate of this SM host.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// PEM private key of this SM host.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name to verify in the peers' certificates (default: each endpoint's host).
    #[serde(default)]
    pub domain_name: Option<String>,
    /// How often to pull every peer, milliseconds (default 5000).
    #[serde(default = "default_sync_interval_ms")]
    pub sync_interval_ms: u64,
    /// At start, how long the first pull may take before the agent reports ready anyway (with
    /// every set no one confirmed still held back), milliseconds (default 5000).
    #[serde(default = "default_catch_up_timeout_ms")]
    pub catch_up_timeout_ms: u64,
    /// One pull's deadline, milliseconds (default 10000).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The umad device of the port this host's OpenSM is bound to (e.g.
    /// `/dev/infiniband/umad0`): the role (master or standby) is then read from the SM's own
    /// SMInfo on that port ([`super::sminfo`]), and a write is confirmed as a standby's only on
    /// an SMInfo read after it. Unset: the role comes from OpenSM's log lines, shown as a
    /// fallback in status.
    #[serde(default)]
    pub sminfo_umad_device: Option<PathBuf>,
}

fn default_sync_interval_ms() -> u64 {
    5000
}
fn default_catch_up_timeout_ms() -> u64 {
    5000
}
fn default_request_timeout_ms() -> u64 {
    10_000
}

/// Why `[subnet_manager.opensm_ha]` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeersConfigError {
    /// No peer listed.
    #[error("peers must name at least one other SM host's agent")]
    NoPeers,
    /// An endpoint or TLS setting is refused (the remote backend's rules).
    #[error("peers: {0}")]
    Endpoint(#[from] RemoteConfigError),
    /// An https peer but nobody may pull from this host.
    #[error("peer_identities must name the peers' certificate identities when peers use https")]
    NoIdentities,
    /// An interval out of range.
    #[error("sync_interval_ms must be 100-600000, catch_up_timeout_ms and request_timeout_ms 100-600000")]
    Interval,
}

impl PeersConfig {
    /// The peers as a client config (the remote backend's endpoint and TLS rules).
    pub fn client(&self) -> RemoteConfig {
        RemoteConfig {
            endpoints: self.peers.clone(),
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            domain_name: self.domain_name.clone(),
            request_timeout_ms: Some(self.request_timeout_ms),
            ..RemoteConfig::default()
        }
    }

    /// Endpoints, TLS material and ranges (the identities' syntax is checked with the
    /// listener's allowlists, by the config).
    pub fn validate(&self) -> Result<(), PeersConfigError> {
        if self.peers.is_empty() {
            return Err(PeersConfigError::NoPeers);
        }
        self.client().validate()?;
        if self.peers.iter().any(|p| p.starts_with("https://")) && self.peer_identities.is_empty() {
            return Err(PeersConfigError::NoIdentities);
        }
        let range = 100..=600_000;
        if !range.contains(&self.sync_interval_ms)
            || !range.contains(&self.catch_up_timeout_ms)
            || !range.contains(&self.request_timeout_ms)
        {
            return Err(PeersConfigError::Interval);
        }
        Ok(())
    }

    /// Pull interval.
    pub fn sync_interval(&self) -> Duration {
        Duration::from_millis(self.sync_interval_ms)
    }

    /// The first pull's bound at start.
    pub fn catch_up_timeout(&self) -> Duration {
        Duration::from_millis(self.catch_up_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        let c: PeersConfig = toml::from_str("peers = [\"http://127.0.0.1:7443\"]\n").unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(c.sync_interval(), Duration::from_secs(5));
        assert!(toml::from_str::<PeersConfig>("peers = []\nbogus = 1\n").is_err());
        let none = PeersConfig::default();
        assert_eq!(none.validate(), Err(PeersConfigError::NoPeers));
        let tls = PeersConfig {
            peers: vec!["https://smhost2:7443".into()],
            ca: Some("ca".into()),
            cert: Some("c".into()),
            key: Some("k".into()),
            ..c.clone()
        };
        assert_eq!(tls.validate(), Err(PeersConfigError::NoIdentities));
        let no_certs = PeersConfig {
            peers: vec!["https://smhost2:7443".into()],
            peer_identities: vec!["dns:smhost2".into()],
            ..c.clone()
        };
        assert!(matches!(
            no_certs.validate(),
            Err(PeersConfigError::Endpoint(
                RemoteConfigError::HttpsWithoutCertificates
            ))
        ));
        let twice = PeersConfig {
            peers: vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:1".into()],
            ..c.clone()
        };
        assert!(matches!(
            twice.validate(),
            Err(PeersConfigError::Endpoint(
                RemoteConfigError::DuplicateEndpoint(_)
            ))
        ));
        let fast = PeersConfig {
            sync_interval_ms: 10,
            ..c
        };
        assert_eq!(fast.validate(), Err(PeersConfigError::Interval));
    }
}
