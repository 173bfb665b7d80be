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
    /// `http://` to a loopback address (test rigs). Empty: the fabric's only SM host, ready to
    /// take peers on SIGHUP (its stored sets are not held back: no peer can hold newer ones).
    /// Re-read on SIGHUP with `peer_host_names` and `peer_sm_port_guids`
    /// (`sm::opensm::sync::reload`).
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
    /// The name this SM host states in every answer to the nodes and peers (default: its
    /// `node_id`). Over TLS it must be the name the nodes verify in this host's certificate
    /// (their `[subnet_manager.remote] domain_name`, else the host of their endpoint URL for
    /// this host), or the nodes do not count its acknowledgements.
    #[serde(default)]
    pub host_name: Option<String>,
    /// The name each peer states, in the order of `peers` (empty: for an https peer the name
    /// this host verifies in its certificate, `domain_name` or the URL's host; for a plaintext
    /// test peer the name it states in its pull answers, its endpoint until it has answered).
    #[serde(default)]
    pub peer_host_names: Vec<String>,
    /// The port GUID each peer's OpenSM is bound to ("0x" + 16 hex digits), in the order of
    /// `peers`. With `sminfo_umad_device` set, a peer whose agent has not answered for
    /// `fence_after_ms` is fenced when that port does not answer SMInfo (or is not in the
    /// fabric): the nodes' applies then go on without it. Empty: peers are never fenced
    /// automatically (nor by `fabric-agent fence-sm-host`).
    #[serde(default)]
    pub peer_sm_port_guids: Vec<String>,
    /// How long a peer's agent must not answer this host's pulls before its SM is checked for
    /// fencing, milliseconds (default three `sync_interval_ms`; 100-3600000).
    #[serde(default)]
    pub fence_after_ms: Option<u64>,
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
    /// An endpoint or TLS setting is refused (the remote backend's rules).
    #[error("peers: {0}")]
    Endpoint(#[from] RemoteConfigError),
    /// An https peer but nobody may pull from this host.
    #[error("peer_identities must name the peers' certificate identities when peers use https")]
    NoIdentities,
    /// `peer_host_names` or `peer_sm_port_guids` not one per peer, or a bad GUID or name.
    #[error("peer_host_names and peer_sm_port_guids must each be empty or name one entry per peer, GUIDs as 0x + 16 hex digits: {0}")]
    PeerIdentity(String),
    /// Fencing configured without the device its evidence is read on.
    #[error("peer_sm_port_guids needs sminfo_umad_device (the peers' SMs are checked over it)")]
    FenceWithoutDevice,
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
        if !self.peers.is_empty() {
            self.client().validate()?;
        }
        if self.peers.iter().any(|p| p.starts_with("https://")) && self.peer_identities.is_empty() {
            return Err(PeersConfigError::NoIdentities);
        }
        for list in [&self.peer_host_names, &self.peer_sm_port_guids] {
            if !list.is_empty() && list.len() != self.peers.len() {
                return Err(PeersConfigError::PeerIdentity(format!(
                    "{} entries for {} peers",
                    list.len(),
                    self.peers.len()
                )));
            }
        }
        if let Some(bad) = self
            .peer_sm_port_guids
            .iter()
            .find(|g| g.parse::<crate::domain::Guid>().is_err())
        {
            return Err(PeersConfigError::PeerIdentity(format!("{bad:?}")));
        }
        if let Some(bad) = self
            .peer_host_names
            .iter()
            .chain(&self.host_name)
            .find(|n| n.is_empty() || n.len() > 253 || n.chars().any(char::is_whitespace))
        {
            return Err(PeersConfigError::PeerIdentity(format!("name {bad:?}")));
        }
        if !self.peer_sm_port_guids.is_empty() && self.sminfo_umad_device.is_none() {
            return Err(PeersConfigError::FenceWithoutDevice);
        }
        if self
            .fence_after_ms
            .is_some_and(|ms| !(100..=3_600_000).contains(&ms))
        {
            return Err(PeersConfigError::Interval);
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

    /// How long a peer's agent may be silent before its SM is checked for fencing.
    pub fn fence_after(&self) -> Duration {
        Duration::from_millis(
            self.fence_after_ms
                .unwrap_or(self.sync_interval_ms.saturating_mul(3)),
        )
    }

    /// Each peer's identity: its endpoint, the name it must state and its SM's port GUID.
    pub fn identities(&self) -> Vec<super::fence::PeerIdentity> {
        self.peers
            .iter()
            .enumerate()
            .map(|(i, endpoint)| {
                let name = self.peer_host_names.get(i).cloned().or_else(|| {
                    endpoint
                        .starts_with("https://")
                        .then(|| self.domain_name.clone().or_else(|| url_host(endpoint)))
                        .flatten()
                });
                super::fence::PeerIdentity {
                    endpoint: endpoint.clone(),
                    name,
                    sm_port_guid: self
                        .peer_sm_port_guids
                        .get(i)
                        .and_then(|g| g.parse::<crate::domain::Guid>().ok())
                        .map(|g| g.0),
                }
            })
            .collect()
    }

    /// The first pull's bound at start.
    pub fn catch_up_timeout(&self) -> Duration {
        Duration::from_millis(self.catch_up_timeout_ms)
    }
}

/// The host of an endpoint URL (`https://host:port/...` -> `host`, brackets kept off IPv6).
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
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
        // The only SM host, ready for peers.
        let none: PeersConfig = toml::from_str("peers = []\n").unwrap();
        assert_eq!(none.validate(), Ok(()));
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
            ..c.clone()
        };
        assert_eq!(fast.validate(), Err(PeersConfigError::Interval));
    }

    #[test]
    fn fencing_keys() {
        let c: PeersConfig = toml::from_str(
            "peers = [\"https://SMHost2.fab:7443\", \"http://127.0.0.1:2\"]\n\
             peer_identities = [\"dns:smhost2.fab\"]\nca = \"ca\"\ncert = \"c\"\nkey = \"k\"\n\
             sminfo_umad_device = \"/dev/infiniband/umad0\"\n\
             peer_sm_port_guids = [\"0x0002c903000e0b72\", \"0x22\"]\n",
        )
        .unwrap();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.fence_after(), Duration::from_millis(15_000));
        let ids = c.identities();
        assert_eq!(ids[0].name.as_deref(), Some("smhost2.fab"));
        assert_eq!(ids[0].sm_port_guid, Some(0x0002_c903_000e_0b72));
        assert_eq!(ids[1].name, None, "a plaintext peer states its own name");
        let named = PeersConfig {
            peer_host_names: vec!["a".into(), "b".into()],
            domain_name: Some("sm.fab".into()),
            ..c.clone()
        };
        assert_eq!(named.identities()[0].name.as_deref(), Some("a"));
        let one_guid = PeersConfig {
            peer_sm_port_guids: vec!["0x22".into()],
            ..c.clone()
        };
        assert!(matches!(
            one_guid.validate(),
            Err(PeersConfigError::PeerIdentity(_))
        ));
        let bad_guid = PeersConfig {
            peer_sm_port_guids: vec!["0x22".into(), "nope".into()],
            ..c.clone()
        };
        assert!(matches!(
            bad_guid.validate(),
            Err(PeersConfigError::PeerIdentity(_))
        ));
        let no_device = PeersConfig {
            sminfo_umad_device: None,
            ..c.clone()
        };
        assert_eq!(
            no_device.validate(),
            Err(PeersConfigError::FenceWithoutDevice)
        );
        let fast = PeersConfig {
            fence_after_ms: Some(5),
            ..c
        };
        assert_eq!(fast.validate(), Err(PeersConfigError::Interval));
        assert_eq!(
            url_host("https://[fe80::1]:7443/x").as_deref(),
            Some("fe80::1")
        );
    }
}
