//! The agent's TOML configuration: parsed strictly (unknown keys are errors) and validated once
//! at start. A bad file exits with code 64 (EX_USAGE). Each section's struct and its rules live
//! in its own file; this one composes them: `ConfigFile` as written -> [`Config`] validated.

mod error;
mod events;
mod grants;
mod log;
mod metrics;
mod ports;
pub mod reference;
mod subnet_manager;
#[cfg(test)]
mod tests;

pub use crate::agent::ReconcilerConfig;
pub use crate::api::settings::{
    BadSocketMode, LimitsConfig, ListenConfig, ListenSection, SocketMode, TlsConfig, TlsSection,
    DEFAULT_SOCKET,
};
pub use crate::domain::GrantPolicy;
pub use crate::observe::{ObserverConfig, ObserverKind};
pub use error::ConfigError;
pub use events::EventsConfig;
pub use grants::{decode_public_key, GrantKeyConfig, GrantsConfig, GrantsSettings};
pub use log::{check_filter as check_log_filter, LogConfig};
pub use metrics::MetricsConfig;
pub use ports::PortsConfig;
pub use subnet_manager::{Backend, SubnetManagerConfig};

use crate::api::ClientAllowlist;
use crate::domain::{FabricName, NodeId, PortSelector};
use error::{invalid, rejected_by};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The default config path.
pub const DEFAULT_PATH: &str = "/etc/fabric-agent/config.toml";

/// The whole configuration, validated once: identifiers and port GUIDs are domain values.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's id: configured, or the host name (read once, at load).
    pub node_id: NodeId,
    /// The fabric this node's InfiniBand ports are cabled to.
    pub fabric: FabricName,
    /// Where the durable store lives.
    pub state_dir: PathBuf,
    /// Listeners.
    pub listen: ListenConfig,
    /// The subnet-manager backend.
    pub subnet_manager: SubnetManagerConfig,
    /// An SM host's peers' certificate identities (`[subnet_manager.opensm_ha]
    /// peer_identities`): they may pull every stored set. Empty without `opensm_ha`.
    pub peer_identities: ClientAllowlist,
    /// The port observer.
    pub observer: ObserverConfig,
    /// Which ports belong to the fabric.
    pub ports: PortSelector,
    /// Event log retention.
    pub events: EventsConfig,
    /// Reconciler timing.
    pub reconciler: ReconcilerConfig,
    /// The operator's acknowledgement of an insecure default partition (see the file's
    /// `allow_full_default`).
    pub allow_full_default: bool,
    /// The Prometheus metrics listener.
    pub metrics: MetricsConfig,
    /// Logging.
    pub log: LogConfig,
    /// Resource bounds of the gRPC listeners.
    pub limits: LimitsConfig,
    /// The control plane's grants: required or not, and its public keys.
    pub grants: GrantsSettings,
}

/// The configuration file as written; [`ConfigFile::validate`] turns it into a [`Config`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    /// This node's id; defaults to the host name.
    #[serde(default)]
    node_id: Option<String>,
    /// The fabric this node's InfiniBand ports are cabled to.
    fabric: String,
    /// Where the durable store lives.
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
    /// Listeners.
    #[serde(default)]
    listen: ListenSection,
    /// The subnet-manager backend.
    #[serde(default)]
    subnet_manager: SubnetManagerConfig,
    /// The port observer.
    #[serde(default)]
    observer: ObserverConfig,
    /// Which ports belong to the fabric.
    #[serde(default)]
    ports: PortsConfig,
    /// Event log retention.
    #[serde(default)]
    events: EventsConfig,
    /// Reconciler timing.
    #[serde(default)]
    reconciler: ReconcilerConfig,
    /// The operator's acknowledgement of an insecure default partition: fabric ports that are
    /// full members of it (0xFFFF), or an OpenSM Default entry granting `ALL=full`, let every
    /// tenant reach every other. Without it such a posture is a standing condition, tenant keys
    /// are not reported ACTIVE (node) and not served (SM host). Default false.
    #[serde(default)]
    allow_full_default: bool,
    /// The Prometheus metrics listener.
    #[serde(default)]
    metrics: MetricsConfig,
    /// Logging.
    #[serde(default)]
    log: LogConfig,
    /// Resource bounds of the gRPC listeners.
    #[serde(default)]
    limits: LimitsConfig,
    /// The control plane's grants.
    #[serde(default)]
    grants: GrantsConfig,
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/fabric-agent")
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates config text (`path` is for messages). A configuration without
    /// `node_id` takes the host name, read here once.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        file.validate()
    }

    /// The observer to run, resolving the default.
    pub fn observer_kind(&self) -> ObserverKind {
        self.observer
            .kind
            .unwrap_or(match self.subnet_manager.backend {
                Backend::Embedded => ObserverKind::Embedded,
                _ => ObserverKind::Auto,
            })
    }
}

impl ConfigFile {
    /// Checks every section and parses the identifiers into domain values.
    fn validate(self) -> Result<Config, ConfigError> {
        let fabric =
            FabricName::parse(&self.fabric).map_err(|e| invalid("fabric", e.to_string()))?;
        self.log.validate()?;
        self.metrics.validate()?;
        let node_id = resolve_node_id(self.node_id.as_deref())?;
        let listen = self.listen.validate()?;
        self.observer
            .validate()
            .map_err(rejected_by("observer.slow_poll_ms"))?;
        self.reconciler
            .validate()
            .map_err(|e| rejected_by(e.key())(e))?;
        self.events.validate()?;
        let ports = self.ports.selector()?;
        self.limits.validate()?;
        let peer_identities = self.subnet_manager.validate(self.observer.kind)?;
        self.subnet_manager.validate_broker(&listen)?;
        let grants = self.grants.validate(&fabric)?;
        Ok(Config {
            node_id,
            fabric,
            state_dir: self.state_dir,
            listen,
            subnet_manager: self.subnet_manager,
            peer_identities,
            observer: self.observer,
            ports,
            events: self.events,
            reconciler: self.reconciler,
            allow_full_default: self.allow_full_default,
            metrics: self.metrics,
            log: self.log,
            limits: self.limits,
            grants,
        })
    }
}

/// The node id: the configured one, or else the host name (`localhost` if it cannot be read).
fn resolve_node_id(configured: Option<&str>) -> Result<NodeId, ConfigError> {
    match configured {
        Some(id) => NodeId::parse(id).map_err(|e| invalid("node_id", e.to_string())),
        None => {
            let host = crate::sys::host::hostname().unwrap_or_else(|| "localhost".to_owned());
            NodeId::parse(&host).map_err(|e| {
                invalid(
                    "node_id",
                    format!(
                        "not set, and the host name {host:?} is not a node id ({e}); set node_id"
                    ),
                )
            })
        }
    }
}
