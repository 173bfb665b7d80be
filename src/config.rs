//! The agent's TOML configuration: parsed strictly (unknown keys are errors) and validated once
//! at start. A bad file exits with code 64 (EX_USAGE).

pub use crate::agent::ReconcilerConfig;
pub use crate::observe::{ObserverConfig, ObserverKind};

use crate::domain::{FabricName, Guid, NodeId, PortSelector};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The default config path.
pub const DEFAULT_PATH: &str = "/etc/fabric-agent/config.toml";
/// The default unix socket.
pub const DEFAULT_SOCKET: &str = "/run/fabric-agent/agent.sock";

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key or a wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// What the TOML parser said (with line and column).
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("invalid {key}: {reason}")]
    Invalid {
        /// The dotted key.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// A section its own rules refuse.
    #[error("invalid {key}: {source}")]
    Section {
        /// The section's dotted key.
        key: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A section whose own rules (its typed error) refused it.
fn rejected_by<E: std::error::Error + Send + Sync + 'static>(
    key: &'static str,
) -> impl Fn(E) -> ConfigError {
    move |e| ConfigError::Section {
        key,
        source: Box::new(e),
    }
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

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
    listen: ListenConfig,
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
}

/// `[log]`: the daemon's log filter, re-read on SIGHUP.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter such as `info` or `info,fabric_agent::agent=debug` (default `info`;
    /// the `FABRIC_AGENT_LOG` environment variable overrides it).
    #[serde(default)]
    pub filter: Option<String>,
}

/// `[limits]`: what one agent serves at most, so no client can exhaust its memory or tasks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Concurrent WatchEvents streams, over all listeners (default 64); more are refused
    /// with RESOURCE_EXHAUSTED. Every event is sent to every open stream, so each stream adds
    /// to the cost of every state change (docs/PERFORMANCE.md, "WatchEvents stream flood"): a
    /// control plane needs a few per node.
    #[serde(default = "default_max_watch_streams")]
    pub max_watch_streams: usize,
    /// Requests in progress per listener (the unix socket, TCP), not counting open
    /// WatchEvents streams once started (default 256); more are refused with
    /// RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight_requests: usize,
    /// A request's handler is cancelled (DEADLINE_EXCEEDED) after this many seconds (default
    /// 660). Must exceed 600, the longest `wait_ms` a call may ask for. A client's shorter
    /// grpc-timeout wins.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_secs: u64,
    /// HTTP/2 keepalive: ping an idle connection every this many seconds (default 30); a peer
    /// that does not answer within `keepalive_timeout_secs` is disconnected, ending its
    /// streams and freeing their slots. 0 turns pings off.
    #[serde(default = "default_keepalive_interval")]
    pub keepalive_interval_secs: u64,
    /// How long a keepalive ping may go unanswered (default 20).
    #[serde(default = "default_keepalive_timeout")]
    pub keepalive_timeout_secs: u64,
    /// A WatchEvents stream ends with UNAVAILABLE (carrying its resume cursor) after this many
    /// seconds; the client reconnects with its last seq. 0 (default) means no bound.
    #[serde(default)]
    pub watch_max_age_secs: u64,
    /// Events read from the log per replay batch of one stream (default 64, at most 4096).
    #[serde(default = "default_watch_batch")]
    pub watch_batch: usize,
    /// ListAttachments page size when the request gives none (default 500).
    #[serde(default = "default_list_page_size")]
    pub list_default_page_size: u32,
    /// The largest ListAttachments page_size accepted (default 5000).
    #[serde(default = "default_list_max_page_size")]
    pub list_max_page_size: u32,
}

fn default_max_watch_streams() -> usize {
    64
}
fn default_max_in_flight() -> usize {
    256
}
fn default_request_timeout() -> u64 {
    660
}
fn default_keepalive_interval() -> u64 {
    30
}
fn default_keepalive_timeout() -> u64 {
    20
}
fn default_watch_batch() -> usize {
    64
}
fn default_list_page_size() -> u32 {
    500
}
fn default_list_max_page_size() -> u32 {
    5000
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_watch_streams: default_max_watch_streams(),
            max_in_flight_requests: default_max_in_flight(),
            request_timeout_secs: default_request_timeout(),
            keepalive_interval_secs: default_keepalive_interval(),
            keepalive_timeout_secs: default_keepalive_timeout(),
            watch_max_age_secs: 0,
            watch_batch: default_watch_batch(),
            list_default_page_size: default_list_page_size(),
            list_max_page_size: default_list_max_page_size(),
        }
    }
}

impl LimitsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_watch_streams == 0 {
            return Err(invalid("limits.max_watch_streams", "must be at least 1"));
        }
        if self.max_in_flight_requests == 0 {
            return Err(invalid(
                "limits.max_in_flight_requests",
                "must be at least 1",
            ));
        }
        if Duration::from_secs(self.request_timeout_secs) <= crate::agent::MAX_WAIT {
            return Err(invalid(
                "limits.request_timeout_secs",
                format!(
                    "must exceed {} (the longest wait_ms a call may ask for)",
                    crate::agent::MAX_WAIT.as_secs()
                ),
            ));
        }
        if self.keepalive_interval_secs > 0 && self.keepalive_timeout_secs == 0 {
            return Err(invalid(
                "limits.keepalive_timeout_secs",
                "must be at least 1 when keepalive_interval_secs is set",
            ));
        }
        if !(1..=crate::agent::MAX_WATCH_BATCH).contains(&self.watch_batch) {
            return Err(invalid(
                "limits.watch_batch",
                format!("must be 1..={}", crate::agent::MAX_WATCH_BATCH),
            ));
        }
        if self.list_max_page_size == 0
            || !(1..=self.list_max_page_size).contains(&self.list_default_page_size)
        {
            return Err(invalid(
                "limits.list_default_page_size",
                "page sizes must be > 0 and list_default_page_size <= list_max_page_size",
            ));
        }
        Ok(())
    }
}

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

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/fabric-agent")
}

/// Listener settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Unix socket for local use (the CLI).
    #[serde(default = "default_socket")]
    pub unix_socket: PathBuf,
    /// Its mode, octal text, default "0660".
    #[serde(default = "default_socket_mode")]
    pub unix_socket_mode: SocketMode,
    /// The group (name or numeric gid) whose members may call read-only RPCs on the unix socket;
    /// default: the agent's own group. Root and `allowed_uids` may always read.
    #[serde(default)]
    pub read_group: Option<String>,
    /// Users (uids) besides root and the agent's own user that may call mutating RPCs
    /// (AttachPartition, ReleaseInstance, SetNodeMemberships) on the unix socket.
    #[serde(default)]
    pub allowed_uids: Vec<u32>,
    /// TCP address for the control plane (mTLS unless `insecure_plaintext_for_tests`).
    #[serde(default)]
    pub tcp: Option<SocketAddr>,
    /// UNSAFE, test rigs only: serve plaintext gRPC on a loopback `tcp` address. Every process
    /// that can reach the address (any container sharing the host's network namespace) may then
    /// call every RPC, including the SM host's `Partitions` for any node.
    #[serde(default)]
    pub insecure_plaintext_for_tests: bool,
    /// Replaced by `insecure_plaintext_for_tests`; present only to say so.
    #[serde(default)]
    pub plaintext_loopback: Option<bool>,
    /// TLS settings for `tcp`.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}
fn default_socket_mode() -> SocketMode {
    SocketMode(0o660)
}

/// A unix socket's permission bits, written as octal text (`"0660"`, `"0o600"`); parsed when
/// the file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct SocketMode(u32);

/// A socket mode that is not octal permission bits.
#[derive(Debug, Error)]
#[error("unix_socket_mode {0:?}: expected octal like \"0660\"")]
pub struct BadSocketMode(String);

impl SocketMode {
    /// The permission bits (at most 0o777).
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl TryFrom<String> for SocketMode {
    type Error = BadSocketMode;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        u32::from_str_radix(text.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .map(SocketMode)
            .ok_or(BadSocketMode(text))
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            unix_socket: default_socket(),
            unix_socket_mode: default_socket_mode(),
            read_group: None,
            allowed_uids: Vec::new(),
            tcp: None,
            insecure_plaintext_for_tests: false,
            plaintext_loopback: None,
            tls: None,
        }
    }
}

impl ListenConfig {
    /// The unix socket mode as a number.
    pub fn socket_mode(&self) -> u32 {
        self.unix_socket_mode.bits()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.plaintext_loopback.is_some() {
            return Err(invalid(
                "listen.plaintext_loopback",
                "renamed: plaintext gRPC is for test rigs only and unsafe (any local process may \
                 call); write insecure_plaintext_for_tests = true, or use [listen.tls]",
            ));
        }
        if self.read_group.as_deref().is_some_and(str::is_empty) {
            return Err(invalid(
                "listen.read_group",
                "empty; give a group name or a numeric gid, or leave it out",
            ));
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        let Some(addr) = self.tcp else {
            return Ok(());
        };
        match (&self.tls, self.insecure_plaintext_for_tests) {
            (Some(_), true) => Err(invalid(
                "listen.insecure_plaintext_for_tests",
                "set either [listen.tls] or insecure_plaintext_for_tests, not both",
            )),
            (None, false) => Err(invalid(
                "listen.tcp",
                "TCP needs [listen.tls] (mTLS); plaintext is only for test rigs on a loopback \
                 address (insecure_plaintext_for_tests = true)",
            )),
            (None, true) if !addr.ip().is_loopback() => Err(invalid(
                "listen.insecure_plaintext_for_tests",
                format!("{addr} is not a loopback address; plaintext is only allowed on loopback"),
            )),
            _ => Ok(()),
        }
    }
}

/// Server-side TLS with client-certificate verification (mTLS). The certificate, key and CA
/// bundle are re-read on SIGHUP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of this agent.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle that client certificates must chain to.
    pub client_ca: PathBuf,
    /// Who may call `fabric.agent.v1.FabricAgent` (the control plane): typed entries
    /// `dns:NAME`, `uri:URI`, `cn:NAME` (CN only for certificates without DNS/URI SANs).
    #[serde(default)]
    pub allowed_clients: Vec<String>,
    /// SM host: who may call `fabric.sm.v1.Partitions` (the nodes' agents). Each call is further
    /// limited to the node the certificate maps to.
    #[serde(default)]
    pub partitions_clients: Vec<String>,
    /// SM host: identities that may read every node's memberships (`GetNodeMemberships`).
    #[serde(default)]
    pub operator_clients: Vec<String>,
    /// SM host: a node's certificate carries a DNS SAN equal to this with `{node}` replaced by
    /// its node id (a DNS SAN equal to the node id itself always counts).
    #[serde(default)]
    pub node_name_template: Option<String>,
    /// SM host: an explicit identity -> node id table instead (`"dns:gpu-a.example" = "node1"`).
    #[serde(default)]
    pub node_identities: std::collections::BTreeMap<String, String>,
}

impl TlsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        for (key, list) in [
            ("listen.tls.allowed_clients", &self.allowed_clients),
            ("listen.tls.partitions_clients", &self.partitions_clients),
            ("listen.tls.operator_clients", &self.operator_clients),
        ] {
            crate::api::ClientAllowlist::parse(list).map_err(rejected_by(key))?;
        }
        if self.allowed_clients.is_empty()
            && self.partitions_clients.is_empty()
            && self.operator_clients.is_empty()
        {
            return Err(invalid(
                "listen.tls.allowed_clients",
                "must name at least one client identity (or partitions_clients on the SM host)",
            ));
        }
        crate::api::NodeMapping::from_config(
            self.node_name_template.as_deref(),
            &self.node_identities,
        )
        .map_err(rejected_by(if self.node_identities.is_empty() {
            "listen.tls.node_name_template"
        } else {
            "listen.tls.node_identities"
        }))?;
        Ok(())
    }
}

/// Which backend programs keys, with each backend's settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SubnetManagerConfig {
    /// The backend.
    #[serde(default)]
    pub backend: Backend,
    /// `embedded` settings.
    #[serde(default)]
    pub embedded: crate::sm::embedded::EmbeddedConfig,
    /// `opensm` settings (SM host).
    #[serde(default)]
    pub opensm: Option<crate::sm::opensm::OpenSmConfig>,
    /// `remote` settings (nodes of an OpenSM fabric).
    #[serde(default)]
    pub remote: Option<crate::sm::remote::RemoteConfig>,
    /// `ufm` settings.
    #[serde(default)]
    pub ufm: Option<crate::sm::ufm::UfmConfig>,
}

/// Subnet-manager backend names.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In-process simulated SM (demos, soft-RoCE rigs).
    #[default]
    Embedded,
    /// OpenSM's partitions file on this host.
    Opensm,
    /// The SM host's agent over gRPC.
    Remote,
    /// NVIDIA UFM REST.
    Ufm,
}

/// Port selection.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PortsConfig {
    /// Device name patterns (`*` wildcard). Empty with empty `guids`: every InfiniBand port.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Port GUIDs.
    #[serde(default)]
    pub guids: Vec<String>,
}

/// Event log retention.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsConfig {
    /// Keep at most this many newest events (older ones are pruned).
    #[serde(default = "default_retention")]
    pub retain: u64,
    /// Keep RELEASED attachments listed for this many seconds.
    #[serde(default = "default_released_retention")]
    pub released_retain_secs: u64,
}

fn default_retention() -> u64 {
    100_000
}
fn default_released_retention() -> u64 {
    7 * 24 * 3600
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            retain: default_retention(),
            released_retain_secs: default_released_retention(),
        }
    }
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
        self.check_log_and_metrics()?;
        let node_id = resolve_node_id(self.node_id.as_deref())?;
        self.listen.validate()?;
        self.observer
            .validate()
            .map_err(|r| invalid("observer.slow_poll_ms", r))?;
        self.reconciler
            .validate()
            .map_err(|e| rejected_by(e.key())(e))?;
        if self.events.retain < 1000 {
            return Err(invalid("events.retain", "keep at least 1000 events"));
        }
        let ports = self.ports.selector()?;
        self.limits.validate()?;
        self.check_subnet_manager()?;
        Ok(Config {
            node_id,
            fabric,
            state_dir: self.state_dir,
            listen: self.listen,
            subnet_manager: self.subnet_manager,
            observer: self.observer,
            ports,
            events: self.events,
            reconciler: self.reconciler,
            allow_full_default: self.allow_full_default,
            metrics: self.metrics,
            log: self.log,
            limits: self.limits,
        })
    }

    fn check_log_and_metrics(&self) -> Result<(), ConfigError> {
        if let Some(filter) = &self.log.filter {
            tracing_subscriber::EnvFilter::builder()
                .parse(filter)
                .map_err(|e| {
                    invalid("log.filter", format!("{filter:?} is not a log filter: {e}"))
                })?;
        }
        if self.metrics.enabled
            && !self.metrics.listen.ip().is_loopback()
            && !self.metrics.allow_remote
        {
            return Err(invalid(
                "metrics.listen",
                format!(
                    "{} is not a loopback address; set allow_remote = true to serve metrics beyond this host",
                    self.metrics.listen
                ),
            ));
        }
        Ok(())
    }

    /// The backend's own section is present and valid, and the observer fits the backend.
    fn check_subnet_manager(&self) -> Result<(), ConfigError> {
        let sm = &self.subnet_manager;
        if self.observer.kind == Some(ObserverKind::Embedded) && sm.backend != Backend::Embedded {
            return Err(invalid(
                "observer.kind",
                "\"embedded\" observes the embedded fabric's simulated ports, which only the embedded \
                 backend programs; use auto, smp, sysfs or verbs with this backend",
            ));
        }
        /// The backend's section, or an error naming it.
        fn section<'a, T>(
            section: &'a Option<T>,
            key: &'static str,
            backend: &str,
        ) -> Result<&'a T, ConfigError> {
            section
                .as_ref()
                .ok_or_else(|| invalid(key, format!("backend = \"{backend}\" needs [{key}]")))
        }
        match sm.backend {
            Backend::Embedded => sm
                .embedded
                .validate()
                .map_err(rejected_by("subnet_manager.embedded")),
            Backend::Opensm => section(&sm.opensm, "subnet_manager.opensm", "opensm")?
                .validate()
                .map_err(rejected_by("subnet_manager.opensm")),
            Backend::Remote => section(&sm.remote, "subnet_manager.remote", "remote")?
                .validate()
                .map_err(rejected_by("subnet_manager.remote")),
            Backend::Ufm => section(&sm.ufm, "subnet_manager.ufm", "ufm")?
                .validate()
                .map_err(|r| invalid("subnet_manager.ufm", r.to_string())),
        }
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

impl PortsConfig {
    /// The port selection as a domain value.
    fn selector(&self) -> Result<PortSelector, ConfigError> {
        let guids = self
            .guids
            .iter()
            .map(|g| g.parse::<Guid>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("ports.guids", e.to_string()))?;
        Ok(PortSelector {
            devices: self.devices.clone(),
            guids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s, Path::new("test.toml"))
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse("fabric = \"fab1\"\nnode_id = \"n1\"\n").unwrap();
        assert_eq!(c.subnet_manager.backend, Backend::Embedded);
        assert_eq!(c.observer_kind(), ObserverKind::Embedded);
        assert_eq!(c.listen.socket_mode(), 0o660);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        assert!(matches!(
            parse("fabric = \"f\"\nbogus = 1\n"),
            Err(ConfigError::Parse { .. })
        ));
        assert!(matches!(
            parse("fabric = \"a b\"\n"),
            Err(ConfigError::Invalid { .. })
        ));
        let plain_public = "fabric = \"f\"\n[listen]\ntcp = \"0.0.0.0:7443\"\ninsecure_plaintext_for_tests = true\n";
        assert!(matches!(
            parse(plain_public),
            Err(ConfigError::Invalid {
                key: "listen.insecure_plaintext_for_tests",
                ..
            })
        ));
        let old_switch =
            "fabric = \"f\"\n[listen]\ntcp = \"127.0.0.1:7443\"\nplaintext_loopback = true\n";
        match parse(old_switch) {
            Err(ConfigError::Invalid { key, reason }) => {
                assert_eq!(key, "listen.plaintext_loopback");
                assert!(
                    reason.contains("insecure_plaintext_for_tests = true"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let no_tls = "fabric = \"f\"\n[listen]\ntcp = \"127.0.0.1:7443\"\n";
        assert!(matches!(
            parse(no_tls),
            Err(ConfigError::Invalid {
                key: "listen.tcp",
                ..
            })
        ));
        let ok = "fabric = \"f\"\n[listen]\ntcp = \"127.0.0.1:7443\"\ninsecure_plaintext_for_tests = true\n";
        assert!(parse(ok).is_ok());
        for bad in [
            "max_watch_streams = 0",
            "max_in_flight_requests = 0",
            "request_timeout_secs = 600",
            "watch_batch = 0",
            "watch_batch = 5000",
            "list_default_page_size = 0",
            "list_default_page_size = 20\nlist_max_page_size = 10",
            "keepalive_timeout_secs = 0",
        ] {
            assert!(
                matches!(
                    parse(&format!("fabric = \"f\"\n[limits]\n{bad}\n")),
                    Err(ConfigError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        let limits = parse("fabric = \"f\"\n[limits]\nmax_watch_streams = 8192\n").unwrap();
        assert_eq!(limits.limits.max_watch_streams, 8192);
        assert_eq!(limits.limits.request_timeout_secs, 660);
        let mismatch =
            "fabric = \"f\"\n[subnet_manager]\nbackend = \"remote\"\n[subnet_manager.remote]\n\
                        endpoint = \"http://127.0.0.1:1\"\n[observer]\nkind = \"embedded\"\n";
        assert!(matches!(
            parse(mismatch),
            Err(ConfigError::Invalid {
                key: "observer.kind",
                ..
            })
        ));
    }

    #[test]
    fn identifiers_are_typed_once() {
        let c = parse(
            "fabric = \"fab1\"\nnode_id = \"n1\"\n[ports]\nguids = [\"0002:c903:000e:0b72\"]\n[listen]\nunix_socket_mode = \"0o600\"\n",
        )
        .unwrap();
        assert_eq!(c.node_id.as_str(), "n1");
        assert_eq!(c.fabric.as_str(), "fab1");
        assert_eq!(c.ports.guids, vec![Guid(0x0002_c903_000e_0b72)]);
        assert_eq!(c.listen.socket_mode(), 0o600);
        let host = parse("fabric = \"f\"\n").unwrap();
        let expected = crate::sys::host::hostname().unwrap_or_else(|| "localhost".to_owned());
        assert_eq!(host.node_id.as_str(), expected);
        for (text, key) in [
            ("node_id = \"a b\"\n", "node_id"),
            ("[ports]\nguids = [\"0xzz\"]\n", "ports.guids"),
        ] {
            match parse(&format!("fabric = \"f\"\n{text}")) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{text}: {other:?}"),
            }
        }
        for mode in ["0999", "1777", "rw"] {
            match parse(&format!(
                "fabric = \"f\"\n[listen]\nunix_socket_mode = \"{mode}\"\n"
            )) {
                Err(ConfigError::Parse { message, .. }) => {
                    assert!(message.contains("expected octal"), "{message}")
                }
                other => panic!("{mode}: {other:?}"),
            }
        }
    }

    fn tls(lists: &str) -> String {
        format!(
            "fabric = \"f\"\n[listen]\ntcp = \"0.0.0.0:7443\"\n[listen.tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n{lists}"
        )
    }

    #[test]
    fn allowlists_are_typed() {
        assert!(parse(&tls(
            "allowed_clients = [\"dns:cp.example\", \"uri:spiffe://f/cp\"]\n"
        ))
        .is_ok());
        match parse(&tls("allowed_clients = [\"cp.example\"]\n")) {
            Err(ConfigError::Section { key, source }) => {
                assert_eq!(key, "listen.tls.allowed_clients");
                assert_eq!(
                    source.downcast_ref::<crate::api::ClientIdError>(),
                    Some(&crate::api::ClientIdError::Untyped("cp.example".into()))
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&tls("partitions_clients = [\"node1\"]\n")),
            Err(ConfigError::Section {
                key: "listen.tls.partitions_clients",
                ..
            })
        ));
        assert!(matches!(
            parse(&tls("")),
            Err(ConfigError::Invalid {
                key: "listen.tls.allowed_clients",
                ..
            })
        ));
        assert!(parse(&tls(
            "partitions_clients = [\"dns:*.nodes.f.example\"]\noperator_clients = [\"cn:ops\"]\nnode_name_template = \"{node}.nodes.f.example\"\n"
        ))
        .is_ok());
        assert!(matches!(
            parse(&tls(
                "partitions_clients = [\"dns:a\"]\nnode_name_template = \"nodes.f.example\"\n"
            )),
            Err(ConfigError::Section {
                key: "listen.tls.node_name_template",
                ..
            })
        ));
        assert!(parse(&tls(
            "partitions_clients = [\"dns:a\"]\n[listen.tls.node_identities]\n\"dns:a\" = \"node1\"\n"
        ))
        .is_ok());
        assert!(matches!(
            parse("fabric = \"f\"\n[listen]\nread_group = \"\"\n"),
            Err(ConfigError::Invalid {
                key: "listen.read_group",
                ..
            })
        ));
    }
}
