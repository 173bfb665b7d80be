//! `[listen]` and `[listen.tls]`: the unix socket, the TCP listener and its mTLS. Read as
//! written ([`ListenSection`], [`TlsSection`]) and validated once into the typed settings the
//! listeners use ([`ListenConfig`], [`TlsConfig`]: allowlists and the node mapping parsed).

use crate::api::gate::{ClientAllowlist, NodeMapping, TlsAccess};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use thiserror::Error;

/// The default unix socket.
pub const DEFAULT_SOCKET: &str = "/run/fabric-agent/agent.sock";

/// `[listen]` as written; [`ListenSection::validate`] makes it a [`ListenConfig`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenSection {
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
    pub tls: Option<TlsSection>,
}

/// Listener settings, validated: the TCP listener is mTLS, or plaintext on loopback for test
/// rigs.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    /// Unix socket for local use (the CLI).
    pub unix_socket: PathBuf,
    /// Its mode.
    pub unix_socket_mode: SocketMode,
    /// The group (name or numeric gid) whose members may call read-only RPCs on the unix socket;
    /// none: only root, the agent's own user and `allowed_uids` may read.
    pub read_group: Option<String>,
    /// Users (uids) besides root and the agent's own user that may call mutating RPCs on the
    /// unix socket.
    pub allowed_uids: Vec<u32>,
    /// TCP address for the control plane.
    pub tcp: Option<SocketAddr>,
    /// UNSAFE, test rigs only: plaintext gRPC on the loopback `tcp` address.
    pub insecure_plaintext_for_tests: bool,
    /// TLS settings for `tcp`.
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

impl Default for ListenSection {
    fn default() -> Self {
        ListenSection {
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
}

impl ListenSection {
    /// The TCP listener is mTLS, or plaintext on loopback for test rigs; the TLS section's
    /// allowlists and node mapping parse.
    pub fn validate(self) -> Result<ListenConfig, ListenError> {
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
        let tls = self.tls.map(TlsSection::validate).transpose()?;
        if let Some(addr) = self.tcp {
            check_tcp(addr, tls.is_some(), self.insecure_plaintext_for_tests)?;
        }
        Ok(ListenConfig {
            unix_socket: self.unix_socket,
            unix_socket_mode: self.unix_socket_mode,
            read_group: self.read_group,
            allowed_uids: self.allowed_uids,
            tcp: self.tcp,
            insecure_plaintext_for_tests: self.insecure_plaintext_for_tests,
            tls,
        })
    }
}

/// The TCP listener at `addr` is mTLS, or plaintext on loopback for test rigs.
fn check_tcp(addr: SocketAddr, tls: bool, insecure: bool) -> Result<(), ListenError> {
    match (tls, insecure) {
        (true, true) => Err(invalid(
            "listen.insecure_plaintext_for_tests",
            "set either [listen.tls] or insecure_plaintext_for_tests, not both",
        )),
        (false, false) => Err(invalid(
            "listen.tcp",
            "TCP needs [listen.tls] (mTLS); plaintext is only for test rigs on a loopback \
                 address (insecure_plaintext_for_tests = true)",
        )),
        (false, true) if !addr.ip().is_loopback() => Err(invalid(
            "listen.insecure_plaintext_for_tests",
            format!("{addr} is not a loopback address; plaintext is only allowed on loopback"),
        )),
        _ => Ok(()),
    }
}

/// `[listen.tls]` as written; [`TlsSection::validate`] makes it a [`TlsConfig`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
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

/// Server-side TLS with client-certificate verification (mTLS), validated: the allowlists and
/// the node mapping parsed. The certificate, key and CA bundle are re-read on SIGHUP, and the
/// allowlists and node mapping replaced.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// PEM certificate chain of this agent.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle that client certificates must chain to.
    pub client_ca: PathBuf,
    /// Who may call `fabric.agent.v1.FabricAgent` (the control plane).
    pub allowed_clients: ClientAllowlist,
    /// SM host: who may call `fabric.sm.v1.Partitions` (the nodes' agents).
    pub partitions_clients: ClientAllowlist,
    /// SM host: identities that may read every node's memberships and call the operator-only
    /// methods.
    pub operator_clients: ClientAllowlist,
    /// SM host: which node a certificate speaks for.
    pub nodes: NodeMapping,
}

impl TlsSection {
    /// The allowlists parse, name someone, and the node mapping is one of its two forms.
    pub fn validate(self) -> Result<TlsConfig, ListenError> {
        let list = |key: &'static str, entries: &[String]| {
            ClientAllowlist::parse(entries).map_err(rejected_by(key))
        };
        let allowed_clients = list("listen.tls.allowed_clients", &self.allowed_clients)?;
        let partitions_clients = list("listen.tls.partitions_clients", &self.partitions_clients)?;
        let operator_clients = list("listen.tls.operator_clients", &self.operator_clients)?;
        if self.allowed_clients.is_empty()
            && self.partitions_clients.is_empty()
            && self.operator_clients.is_empty()
        {
            return Err(invalid(
                "listen.tls.allowed_clients",
                "must name at least one client identity (or partitions_clients on the SM host)",
            ));
        }
        let nodes =
            NodeMapping::from_config(self.node_name_template.as_deref(), &self.node_identities)
                .map_err(rejected_by(if self.node_identities.is_empty() {
                    "listen.tls.node_name_template"
                } else {
                    "listen.tls.node_identities"
                }))?;
        Ok(TlsConfig {
            cert: self.cert,
            key: self.key,
            client_ca: self.client_ca,
            allowed_clients,
            partitions_clients,
            operator_clients,
            nodes,
        })
    }
}

impl TlsConfig {
    /// The allowlists and node mapping as the gate consults them.
    pub fn access(&self) -> TlsAccess {
        TlsAccess::new(
            self.allowed_clients.clone(),
            self.partitions_clients.clone(),
            self.operator_clients.clone(),
            self.nodes.clone(),
        )
    }
}

/// Why a `[listen]` or `[listen.tls]` setting was refused, under its dotted key.
#[derive(Debug, Error)]
pub enum ListenError {
    /// A value that parses but makes no sense.
    #[error("invalid {key}: {reason}")]
    Invalid {
        /// The dotted key.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// A value its own type refused (an allowlist entry, the node mapping), with that type's
    /// error.
    #[error("invalid {key}: {source}")]
    Rejected {
        /// The dotted key.
        key: &'static str,
        /// The type's own error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A value its own type refused, under its dotted key.
fn rejected_by<E: std::error::Error + Send + Sync + 'static>(
    key: &'static str,
) -> impl Fn(E) -> ListenError {
    move |e| ListenError::Rejected {
        key,
        source: Box::new(e),
    }
}

/// A value that parses but makes no sense, under its dotted key.
fn invalid(key: &'static str, reason: impl Into<String>) -> ListenError {
    ListenError::Invalid {
        key,
        reason: reason.into(),
    }
}
