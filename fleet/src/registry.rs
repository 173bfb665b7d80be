//! The nodes file (TOML): every node agent the control plane follows, the SM hosts that give the
//! fabric's own view of a partition, the grant-signing keys and the follower's tuning.
//!
//! ```toml
//! [tls]                          # defaults for every https endpoint (each entry may override)
//! ca = "/etc/fleet/ca.pem"
//! cert = "/etc/fleet/client.pem"
//! key = "/etc/fleet/client.key"
//!
//! [[node]]
//! id = "gpu-0001"
//! endpoint = "https://10.1.0.1:7443"
//! domain = "gpu-0001.agents.example"   # the identity the node's certificate must carry
//!
//! [[sm_host]]
//! fabric = "europe-north1-a.fab2"
//! endpoint = "https://10.1.9.1:7444"
//!
//! [signing]
//! active = "k2"
//! keys = [{ id = "k1", file = "/etc/fleet/k1.seed" }, { id = "k2", file = "/etc/fleet/k2.seed" }]
//!
//! [follow]
//! max_concurrent_connects = 64
//! ```
//! Endpoints are `https://` (mTLS: CA, certificate and key required), `unix:///path` (an agent
//! on the same host), or `http://` on a loopback address only (test rigs).

use crate::grant::SigningKeyFile;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why the nodes file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not valid TOML for this schema.
    #[error("{}: {source}", .path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        source: toml::de::Error,
    },
    /// A value is wrong; the message names it.
    #[error("{key}: {reason}")]
    Invalid {
        /// The offending key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// TLS material for an https endpoint.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// CA bundle the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM).
    pub cert: Option<PathBuf>,
    /// Client key (PEM).
    pub key: Option<PathBuf>,
}

/// How to reach one gRPC server.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoint {
    /// A unix socket on this host.
    Unix(PathBuf),
    /// Plaintext on loopback (test rigs).
    Plain(String),
    /// mTLS.
    Tls {
        /// The URL.
        url: String,
        /// The server name its certificate must carry (default: the URL's host).
        domain: Option<String>,
        /// CA, client certificate and key.
        tls: TlsFiles,
    },
}

/// One followed node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    /// The node id (must equal the agent's `node_id`).
    pub id: String,
    /// How to reach its agent.
    pub endpoint: Endpoint,
}

/// One SM host serving `fabric.sm.v1.Partitions` for a fabric.
#[derive(Debug, Clone, PartialEq)]
pub struct SmHostEntry {
    /// The fabric it serves.
    pub fabric: String,
    /// How to reach it.
    pub endpoint: Endpoint,
}

/// The grant-signing keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SigningSection {
    /// The id of the key that signs.
    pub active: String,
    /// Every key (the active one and those kept during rotation).
    pub keys: Vec<SigningKeyFile>,
}

/// The followers' tuning.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FollowConfig {
    /// Connects and resyncs in flight at once across all nodes.
    pub max_concurrent_connects: usize,
    /// First reconnect delay (milliseconds); doubles per failure, with full jitter.
    pub backoff_initial_ms: u64,
    /// Cap of the reconnect delay (milliseconds).
    pub backoff_max_ms: u64,
    /// Per-call timeout of GetNode and ListAttachments pages (milliseconds).
    pub call_timeout_ms: u64,
    /// HTTP/2 keepalive interval (milliseconds): a silent dead peer is noticed within about
    /// twice this.
    pub keepalive_ms: u64,
    /// ListAttachments page size during a resync.
    pub page_size: u32,
}

impl Default for FollowConfig {
    fn default() -> Self {
        FollowConfig {
            max_concurrent_connects: 64,
            backoff_initial_ms: 200,
            backoff_max_ms: 30_000,
            call_timeout_ms: 10_000,
            keepalive_ms: 20_000,
            page_size: 500,
        }
    }
}

impl FollowConfig {
    /// The per-call timeout.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }
}

/// The parsed, validated nodes file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Registry {
    /// Followed nodes, in file order, ids unique.
    pub nodes: Vec<NodeEntry>,
    /// SM hosts by fabric.
    pub sm_hosts: Vec<SmHostEntry>,
    /// Grant signing, when this file configures it.
    pub signing: Option<SigningSection>,
    /// Follower tuning.
    pub follow: FollowConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tls: TlsFiles,
    #[serde(default)]
    node: Vec<RawEndpoint>,
    #[serde(default)]
    sm_host: Vec<RawEndpoint>,
    signing: Option<SigningSection>,
    #[serde(default)]
    follow: FollowConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    id: Option<String>,
    fabric: Option<String>,
    endpoint: String,
    domain: Option<String>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

fn invalid(key: String, reason: impl Into<String>) -> RegistryError {
    RegistryError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Registry {
    /// Reads and validates a nodes file.
    pub fn load(path: &Path) -> Result<Registry, RegistryError> {
        let text = std::fs::read_to_string(path).map_err(|source| RegistryError::Read {
            path: path.to_owned(),
            source,
        })?;
        Registry::parse(&text).map_err(|e| match e {
            RegistryError::Parse { source, .. } => RegistryError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    /// Parses and validates the text of a nodes file.
    pub fn parse(text: &str) -> Result<Registry, RegistryError> {
        let raw: RawFile = toml::from_str(text).map_err(|source| RegistryError::Parse {
            path: PathBuf::from("<nodes file>"),
            source,
        })?;
        let mut seen = BTreeSet::new();
        let mut nodes = Vec::new();
        for (i, n) in raw.node.iter().enumerate() {
            let at = format!("node[{i}]");
            let id =
                n.id.clone()
                    .ok_or_else(|| invalid(format!("{at}.id"), "missing"))?;
            if id.is_empty() || id.len() > 128 {
                return Err(invalid(format!("{at}.id"), "must be 1-128 characters"));
            }
            if n.fabric.is_some() {
                return Err(invalid(
                    format!("{at}.fabric"),
                    "a node reports its fabric itself (GetNode)",
                ));
            }
            if !seen.insert(id.clone()) {
                return Err(invalid(format!("{at}.id"), format!("{id:?} appears twice")));
            }
            let endpoint = endpoint(n, &raw.tls, &at)?;
            nodes.push(NodeEntry { id, endpoint });
        }
        let mut sm_hosts = Vec::new();
        for (i, h) in raw.sm_host.iter().enumerate() {
            let at = format!("sm_host[{i}]");
            let fabric = h
                .fabric
                .clone()
                .filter(|f| !f.is_empty())
                .ok_or_else(|| invalid(format!("{at}.fabric"), "missing"))?;
            if h.id.is_some() {
                return Err(invalid(
                    format!("{at}.id"),
                    "an SM host is named by its fabric",
                ));
            }
            sm_hosts.push(SmHostEntry {
                fabric,
                endpoint: endpoint(h, &raw.tls, &at)?,
            });
        }
        let f = &raw.follow;
        if f.max_concurrent_connects == 0 || f.page_size == 0 || f.call_timeout_ms == 0 {
            return Err(invalid(
                "follow".into(),
                "max_concurrent_connects, page_size and call_timeout_ms must be above 0",
            ));
        }
        if f.backoff_initial_ms == 0 || f.backoff_max_ms < f.backoff_initial_ms {
            return Err(invalid(
                "follow.backoff_max_ms".into(),
                "backoff_initial_ms must be above 0 and at most backoff_max_ms",
            ));
        }
        Ok(Registry {
            nodes,
            sm_hosts,
            signing: raw.signing,
            follow: raw.follow,
        })
    }

    /// The node entry with this id.
    pub fn node(&self, id: &str) -> Option<&NodeEntry> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

fn endpoint(raw: &RawEndpoint, defaults: &TlsFiles, at: &str) -> Result<Endpoint, RegistryError> {
    let url = raw.endpoint.as_str();
    let no_tls =
        raw.ca.is_none() && raw.cert.is_none() && raw.key.is_none() && raw.domain.is_none();
    if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/') || !no_tls {
            return Err(invalid(
                format!("{at}.endpoint"),
                "unix:// takes an absolute path and no TLS settings",
            ));
        }
        return Ok(Endpoint::Unix(PathBuf::from(path)));
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let host = host_of(rest);
        let loopback = host == "localhost"
            || host
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<IpAddr>()
                .map(|ip| ip.is_loopback())
                .unwrap_or(false);
        if !loopback || !no_tls {
            return Err(invalid(
                format!("{at}.endpoint"),
                "plaintext http:// is only for loopback test rigs; use https:// (mTLS)",
            ));
        }
        return Ok(Endpoint::Plain(url.to_owned()));
    }
    if url.starts_with("https://") {
        let tls = TlsFiles {
            ca: raw.ca.clone().or_else(|| defaults.ca.clone()),
            cert: raw.cert.clone().or_else(|| defaults.cert.clone()),
            key: raw.key.clone().or_else(|| defaults.key.clone()),
        };
        if tls.ca.is_none() || tls.cert.is_none() || tls.key.is_none() {
            return Err(invalid(
                format!("{at}.endpoint"),
                "https:// needs ca, cert and key (here or in [tls]): the agent requires mTLS",
            ));
        }
        return Ok(Endpoint::Tls {
            url: url.to_owned(),
            domain: raw.domain.clone(),
            tls,
        });
    }
    Err(invalid(
        format!("{at}.endpoint"),
        format!("{url:?}: expected https://, unix:///path or http://<loopback>"),
    ))
}

fn host_of(rest: &str) -> &str {
    let authority = rest.split('/').next().unwrap_or("");
    if authority.starts_with('[') {
        return authority.split(']').next().map_or("", |h| &h[1..]);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_sm_hosts_and_defaults() {
        let r = Registry::parse(
            "[tls]\nca = \"/ca\"\ncert = \"/c\"\nkey = \"/k\"\n\
             [[node]]\nid = \"n1\"\nendpoint = \"https://10.0.0.1:7443\"\ndomain = \"n1.example\"\n\
             [[node]]\nid = \"n2\"\nendpoint = \"unix:///run/a.sock\"\n\
             [[node]]\nid = \"n3\"\nendpoint = \"http://127.0.0.1:9\"\n\
             [[sm_host]]\nfabric = \"f\"\nendpoint = \"http://[::1]:10\"\n",
        )
        .unwrap();
        assert_eq!(r.nodes.len(), 3);
        assert!(
            matches!(&r.nodes[0].endpoint, Endpoint::Tls { domain: Some(d), tls, .. }
            if d == "n1.example" && tls.ca.as_deref() == Some(Path::new("/ca")))
        );
        assert_eq!(r.nodes[1].endpoint, Endpoint::Unix("/run/a.sock".into()));
        assert_eq!(r.sm_hosts[0].fabric, "f");
        assert_eq!(r.follow, FollowConfig::default());
    }

    #[test]
    fn refuses_what_would_be_unsafe_or_ambiguous() {
        for (text, key) in [
            ("[[node]]\nid = \"a\"\nendpoint = \"http://10.0.0.1:1\"\n", "node[0].endpoint"),
            ("[[node]]\nid = \"a\"\nendpoint = \"https://h:1\"\n", "node[0].endpoint"),
            (
                "[[node]]\nid = \"a\"\nendpoint = \"unix:///s\"\n[[node]]\nid = \"a\"\nendpoint = \"unix:///t\"\n",
                "node[1].id",
            ),
            ("[[node]]\nendpoint = \"unix:///s\"\n", "node[0].id"),
            ("[follow]\nbackoff_initial_ms = 10\nbackoff_max_ms = 5\n", "follow.backoff_max_ms"),
        ] {
            match Registry::parse(text) {
                Err(RegistryError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            Registry::parse("[[node]]\nid = \"a\"\nendpoint = \"unix:///s\"\nbogus = 1\n"),
            Err(RegistryError::Parse { .. })
        ));
    }
}
