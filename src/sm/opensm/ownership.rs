//! Port ownership on the SM host: a port GUID enters a node's set only when the fabric itself
//! shows that port in that node, or the operator's inventory lists it for that node.
//!
//! For every GUID a node claims that is not already in its stored set, the SM host asks the SA
//! for the port's NodeRecord (through [`PortDirectory`]) and [`judge`]s the claim:
//! - the SM host's own port, and the port at the master SM's LID, are never a tenant's;
//! - a switch's or a router's port is never a tenant's;
//! - a channel-adapter port whose NodeDescription matches one of `description_patterns` with
//!   `{node}` = the claiming node id (rdma-core's default is `<hostname> <device>`, hence the
//!   default pattern `{node} *`) is proven by the fabric;
//! - otherwise the inventory file (TOML: `node = ["0x...", ...]`) must list it for the node;
//! - a GUID stored for another node is refused unless the fabric shows it in the claiming node
//!   (then ownership moves: it leaves the other node's set). The inventory never moves a port.
//!
//! If the SA cannot be asked, the claim is refused (fail closed), never accepted.

use super::sa_client::{SaError, SaSession, SaTiming};
use crate::domain::Guid;
use crate::mad::node_info::node_type;
use crate::mad::NodeRecordRepr;
use async_trait::async_trait;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `[subnet_manager.opensm.ownership]` settings.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OwnershipConfig {
    /// Whether claims are checked against the fabric (default true). Off, any node may claim
    /// any GUID no other node holds: for rigs whose SM host cannot reach the SA.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The umad device of the SM host's port, through which the SA is asked.
    #[serde(default = "default_umad")]
    pub umad_device: PathBuf,
    /// NodeDescription patterns that name a node: `{node}` is the node id, `*` any run of
    /// characters (possibly empty). Default `["{node} *"]` (rdma-core's `<hostname> <device>`).
    #[serde(default = "default_patterns")]
    pub description_patterns: Vec<String>,
    /// The operator's inventory: a TOML file of `node_id = ["0x<16 hex digits>", ...]`, read at
    /// every check. A GUID listed for a node is that node's even if the fabric does not show it
    /// (never a switch's, a router's or the SM's port).
    #[serde(default)]
    pub inventory_file: Option<PathBuf>,
    /// Wait for one SA/SMP answer, milliseconds.
    #[serde(default = "default_timeout")]
    pub sa_timeout_ms: u64,
    /// Further attempts after a timeout.
    #[serde(default = "default_retries")]
    pub sa_retries: u32,
    /// Every question of one check ends within this, milliseconds.
    #[serde(default = "default_deadline")]
    pub sa_deadline_ms: u64,
    /// The SM_Key presented to the SA where it answers trusted requests only (P_KeyTableRecords
    /// for `ListPartitionMembers`): OpenSM's `sa_key` (its default is 1).
    #[serde(default = "default_sa_key")]
    pub sa_key: u64,
}

fn default_sa_key() -> u64 {
    1
}

fn default_true() -> bool {
    true
}
fn default_umad() -> PathBuf {
    PathBuf::from("/dev/infiniband/umad0")
}
fn default_patterns() -> Vec<String> {
    vec!["{node} *".into()]
}
fn default_timeout() -> u64 {
    500
}
fn default_retries() -> u32 {
    2
}
fn default_deadline() -> u64 {
    5000
}

impl Default for OwnershipConfig {
    fn default() -> Self {
        OwnershipConfig {
            enabled: true,
            umad_device: default_umad(),
            description_patterns: default_patterns(),
            inventory_file: None,
            sa_timeout_ms: default_timeout(),
            sa_retries: default_retries(),
            sa_deadline_ms: default_deadline(),
            sa_key: default_sa_key(),
        }
    }
}

impl OwnershipConfig {
    /// The check switched off (tests of the file handling that use made-up GUIDs).
    pub fn disabled() -> Self {
        OwnershipConfig {
            enabled: false,
            ..OwnershipConfig::default()
        }
    }

    /// Checks the patterns and the timing.
    pub fn validate(&self) -> Result<(), OwnershipConfigError> {
        if self.description_patterns.is_empty() {
            return Err(OwnershipConfigError::NoPatterns);
        }
        for p in &self.description_patterns {
            if p.matches("{node}").count() != 1 {
                return Err(OwnershipConfigError::Pattern(p.clone()));
            }
        }
        if !(1..=60_000).contains(&self.sa_timeout_ms) {
            return Err(OwnershipConfigError::SaTimeout);
        }
        if self.sa_retries > 10 {
            return Err(OwnershipConfigError::SaRetries);
        }
        if !(self.sa_timeout_ms..=120_000).contains(&self.sa_deadline_ms) {
            return Err(OwnershipConfigError::SaDeadline);
        }
        Ok(())
    }

    pub(crate) fn timing(&self) -> SaTiming {
        SaTiming {
            timeout: Duration::from_millis(self.sa_timeout_ms),
            retries: self.sa_retries,
            deadline: Duration::from_millis(self.sa_deadline_ms),
        }
    }
}

/// What the fabric says about some port GUIDs, asked in one go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricFacts {
    /// The SM host's own port GUID.
    pub local_port_guid: u64,
    /// The master SM's LID.
    pub sm_lid: u16,
    /// Each GUID asked for: its NodeRecord, or `None` when the SA knows no such port.
    pub records: BTreeMap<Guid, Option<NodeRecordRepr>>,
}

/// Where facts about ports come from (the SA over umad; tests use a fake).
#[async_trait]
pub trait PortDirectory: Send + Sync {
    /// Asks about `guids`. An error means the fabric could not be asked: the caller refuses.
    async fn facts(&self, guids: &[Guid]) -> Result<FabricFacts, DirectoryError>;
}

/// Why the fabric could not be asked about ports.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DirectoryError {
    /// Other checks held the device until this one's deadline passed.
    #[error("{}: other checks held the device past the deadline of {} ms", device.display(), deadline.as_millis())]
    Busy {
        /// The umad device.
        device: PathBuf,
        /// The check's deadline.
        deadline: Duration,
    },
    /// The blocking thread that asks the SA failed (panicked or was cancelled).
    #[error("the SA query thread failed: {0}")]
    Thread(#[source] Arc<tokio::task::JoinError>),
    /// The SA session failed.
    #[error("{}: {source}", device.display())]
    Sa {
        /// The umad device.
        device: PathBuf,
        /// What failed.
        #[source]
        source: Arc<SaError>,
    },
}

/// The SA over the SM host's umad device: one session (open, local port, one NodeRecord
/// GetTable per GUID, close) per check, on a blocking thread. Sessions run one at a time: each
/// registers agents on the device, and under umad2sim two live registrations of one class in
/// a process steal each other's answers.
#[derive(Debug, Clone)]
pub struct UmadDirectory {
    device: PathBuf,
    timing: SaTiming,
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
}

impl UmadDirectory {
    /// A directory asking through `config.umad_device`.
    pub fn new(config: &OwnershipConfig) -> Self {
        UmadDirectory {
            device: config.umad_device.clone(),
            timing: config.timing(),
            one_at_a_time: Arc::new(tokio::sync::Mutex::new(())),
        }
    }
}

#[async_trait]
impl PortDirectory for UmadDirectory {
    async fn facts(&self, guids: &[Guid]) -> Result<FabricFacts, DirectoryError> {
        let device = self.device.clone();
        let mut timing = self.timing;
        let guids = guids.to_vec();
        // Waiting for the turn counts against the deadline too.
        let started = std::time::Instant::now();
        let _turn = tokio::time::timeout(timing.deadline, self.one_at_a_time.lock())
            .await
            .map_err(|_| DirectoryError::Busy {
                device: self.device.clone(),
                deadline: timing.deadline,
            })?;
        timing.deadline = timing.deadline.saturating_sub(started.elapsed());
        tokio::task::spawn_blocking(move || -> Result<FabricFacts, SaError> {
            let mut session = SaSession::open(&device, timing)?;
            let local = session.local_port()?;
            let mut records = BTreeMap::new();
            for g in guids {
                records.insert(g, session.node_record(local.sm_lid, g.0)?);
            }
            Ok(FabricFacts {
                local_port_guid: local.port_guid,
                sm_lid: local.sm_lid,
                records,
            })
        })
        .await
        .map_err(|e| DirectoryError::Thread(Arc::new(e)))?
        .map_err(|e| DirectoryError::Sa {
            device: self.device.clone(),
            source: Arc::new(e),
        })
    }
}

/// Why a claim holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// The fabric shows a channel-adapter port whose NodeDescription names the node.
    Fabric {
        /// The NodeDescription.
        description: String,
    },
    /// The fabric shows the port in the node, and another node held it: it moves.
    Moved {
        /// The node that held it.
        from: String,
        /// The NodeDescription.
        description: String,
    },
    /// The operator's inventory lists it for the node.
    Inventory,
}

/// Why a claim is refused; the text names the GUID and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipRefusal {
    /// The port never enters a tenant key.
    #[error("port {port}{}: it never enters a tenant's set", forbidden_detail(.why))]
    Forbidden {
        /// The port.
        port: Guid,
        /// Which kind of port it is.
        why: ForbiddenPort,
    },
    /// Another node holds the port and the fabric does not show it in the claiming node.
    #[error("port {port} belongs to node {holder:?}; {}, not in node {node:?}, so it does not move", match .shown { Some(d) => format!("the fabric shows it as {d:?}"), None => "the fabric does not show it".to_owned() })]
    OwnedByOther {
        /// The port.
        port: Guid,
        /// The node that holds it.
        holder: String,
        /// The claiming node.
        node: String,
        /// The port's NodeDescription, when the fabric shows the port.
        shown: Option<String>,
    },
    /// The port was not among the ports asked about (the stored sets changed meanwhile).
    #[error("port {port} was not asked about (the stored sets changed during the check): send the set again")]
    NotAsked {
        /// The port.
        port: Guid,
    },
    /// Neither the fabric nor the inventory says the port is the node's.
    #[error("port {port}: {} and the inventory does not list it for {}", match .shown { Some(d) => format!("its NodeDescription {d:?} does not name node {node:?} (patterns {patterns:?})"), None => "the SA knows no such port".to_owned() }, if .shown.is_some() { "that node".to_owned() } else { format!("node {node:?}") })]
    NotShown {
        /// The port.
        port: Guid,
        /// The claiming node.
        node: String,
        /// The port's NodeDescription, when the SA knows the port.
        shown: Option<String>,
        /// The description patterns tried.
        patterns: Vec<String>,
    },
}

/// A port that never enters a tenant key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForbiddenPort {
    /// The SM host's own port.
    SmHost,
    /// The master SM's port.
    MasterSm {
        /// Its NodeDescription.
        description: String,
        /// Its LID.
        lid: u16,
    },
    /// A switch's or a router's port.
    NotChannelAdapter {
        /// Its NodeDescription.
        description: String,
        /// Its node type.
        node_type: u8,
    },
}

fn forbidden_detail(why: &ForbiddenPort) -> String {
    match why {
        ForbiddenPort::SmHost => " is the SM host's own port".to_owned(),
        ForbiddenPort::MasterSm { description, lid } => {
            format!(" ({description:?}) is the master SM's port (LID {lid})")
        }
        ForbiddenPort::NotChannelAdapter {
            description,
            node_type,
        } => format!(
            " ({description:?}) is {}'s port (node type {node_type})",
            type_name(*node_type)
        ),
    }
}

/// Whether `description` matches `pattern` with `{node}` = `node_id` (`*`: any run of
/// characters). Node ids hold no `*`, so the substitution adds no wildcard.
pub fn description_names(pattern: &str, node_id: &str, description: &str) -> bool {
    let pattern = pattern.replace("{node}", node_id);
    glob(pattern.as_bytes(), description.as_bytes())
}

fn glob(pattern: &[u8], text: &[u8]) -> bool {
    // Iterative wildcard match: remember the last `*` and retry from one character further.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|b| *b == b'*')
}

/// The operator's inventory: node id -> port GUIDs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorInventory {
    owner: BTreeMap<Guid, String>,
}

impl OperatorInventory {
    /// Parses `node = ["0x0002c903000e0b72", ...]` lines. Refuses a GUID that is not `0x` and
    /// 16 hex digits, GUID 0, and a GUID listed twice.
    pub fn parse(text: &str) -> Result<OperatorInventory, InventoryError> {
        let table: BTreeMap<String, Vec<String>> =
            toml::from_str(text).map_err(|e| InventoryError::Toml(Box::new(e)))?;
        let mut owner = BTreeMap::new();
        for (node, guids) in table {
            for g in guids {
                let guid = parse_guid(&g).ok_or_else(|| InventoryError::Guid {
                    node: node.clone(),
                    text: g.clone(),
                })?;
                if let Some(other) = owner.insert(guid, node.clone()) {
                    return Err(InventoryError::Twice {
                        guid,
                        first: other,
                        second: node,
                    });
                }
            }
        }
        Ok(OperatorInventory { owner })
    }

    /// Reads and parses the file.
    pub fn load(path: &Path) -> Result<OperatorInventory, InventoryFileError> {
        let failed = |source| InventoryFileError {
            path: path.to_owned(),
            source,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| failed(InventoryError::Read(Arc::new(e))))?;
        OperatorInventory::parse(&text).map_err(failed)
    }

    /// Whether the inventory lists `guid` for `node_id`.
    pub fn lists(&self, node_id: &str, guid: Guid) -> bool {
        self.owner.get(&guid).is_some_and(|n| n == node_id)
    }
}

/// Why the inventory does not load.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InventoryError {
    /// The file could not be read.
    #[error("{0}")]
    Read(#[source] Arc<std::io::Error>),
    /// The text is not a TOML table of string arrays.
    #[error("{}", .0.message())]
    Toml(#[source] Box<toml::de::Error>),
    /// A GUID is not `0x` and 16 hex digits, or is 0.
    #[error("node {node:?}: {text:?} is not \"0x\" and 16 hex digits")]
    Guid {
        /// The node it is listed for.
        node: String,
        /// The text.
        text: String,
    },
    /// A GUID is listed for two nodes.
    #[error("{guid} is listed for {first:?} and {second:?}")]
    Twice {
        /// The GUID.
        guid: Guid,
        /// The node it was first listed for.
        first: String,
        /// The other node.
        second: String,
    },
}

/// Why the inventory file does not load, with the file's path.
#[derive(Debug, Clone, thiserror::Error)]
#[error("inventory {}: {source}", path.display())]
pub struct InventoryFileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    #[source]
    pub source: InventoryError,
}

fn parse_guid(s: &str) -> Option<Guid> {
    let hex = s
        .strip_prefix("0x")
        .filter(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))?;
    u64::from_str_radix(hex, 16)
        .ok()
        .filter(|g| *g != 0)
        .map(Guid)
}

fn type_name(t: u8) -> &'static str {
    match t {
        node_type::SWITCH => "a switch",
        node_type::ROUTER => "a router",
        _ => "not a channel adapter",
    }
}

/// Judges one claim: `node_id` claims `guid`, which `holder` holds now (if anyone).
pub fn judge(
    node_id: &str,
    guid: Guid,
    facts: &FabricFacts,
    patterns: &[String],
    inventory: &OperatorInventory,
    holder: Option<&str>,
) -> Result<Proof, OwnershipRefusal> {
    if guid.0 == facts.local_port_guid {
        return Err(OwnershipRefusal::Forbidden {
            port: guid,
            why: ForbiddenPort::SmHost,
        });
    }
    let record = match facts.records.get(&guid) {
        Some(r) => r.as_ref(),
        None => return Err(OwnershipRefusal::NotAsked { port: guid }),
    };
    let mut shown = None;
    if let Some(r) = record {
        let description = r.description_text();
        if r.lid == facts.sm_lid {
            return Err(OwnershipRefusal::Forbidden {
                port: guid,
                why: ForbiddenPort::MasterSm {
                    description,
                    lid: r.lid,
                },
            });
        }
        if !r.is_channel_adapter() {
            return Err(OwnershipRefusal::Forbidden {
                port: guid,
                why: ForbiddenPort::NotChannelAdapter {
                    description,
                    node_type: r.node_info.node_type,
                },
            });
        }
        let named = patterns
            .iter()
            .any(|p| description_names(p, node_id, &description));
        shown = Some((description, named));
    }
    match (holder, &shown) {
        (Some(other), Some((description, true))) if other != node_id => {
            return Ok(Proof::Moved {
                from: other.to_owned(),
                description: description.clone(),
            })
        }
        (Some(other), _) if other != node_id => {
            return Err(OwnershipRefusal::OwnedByOther {
                port: guid,
                holder: other.to_owned(),
                node: node_id.to_owned(),
                shown: shown.map(|(d, _)| d),
            });
        }
        _ => {}
    }
    if let Some((description, true)) = shown {
        return Ok(Proof::Fabric { description });
    }
    if inventory.lists(node_id, guid) {
        return Ok(Proof::Inventory);
    }
    Err(OwnershipRefusal::NotShown {
        port: guid,
        node: node_id.to_owned(),
        shown: shown.map(|(d, _)| d),
        patterns: patterns.to_vec(),
    })
}

/// Why `[subnet_manager.opensm.ownership]` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipConfigError {
    /// No description pattern.
    #[error("ownership.description_patterns must not be empty")]
    NoPatterns,
    /// A pattern without exactly one `{node}`.
    #[error("ownership.description_patterns: {0:?} must contain {{node}} exactly once")]
    Pattern(String),
    /// `sa_timeout_ms` out of range.
    #[error("ownership.sa_timeout_ms must be 1-60000")]
    SaTimeout,
    /// `sa_retries` out of range.
    #[error("ownership.sa_retries must be at most 10")]
    SaRetries,
    /// `sa_deadline_ms` out of range.
    #[error("ownership.sa_deadline_ms must be at least sa_timeout_ms and at most 120000")]
    SaDeadline,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{NodeInfo, NodeInfoRepr};

    fn record(lid: u16, kind: u8, guid: u64, description: &str) -> NodeRecordRepr {
        let mut info =
            NodeInfoRepr::parse(&NodeInfo::new_checked(&[0u8; 40][..]).unwrap()).unwrap();
        info.node_type = kind;
        info.port_guid = guid;
        let mut d = [0u8; 64];
        d[..description.len()].copy_from_slice(description.as_bytes());
        NodeRecordRepr {
            lid,
            node_info: info,
            description: d,
        }
    }

    fn facts() -> FabricFacts {
        let mut records = BTreeMap::new();
        for r in [
            record(1, node_type::CHANNEL_ADAPTER, 0x11, "smhost mlx5_0"),
            record(2, node_type::SWITCH, 0x20, "sw1"),
            record(3, node_type::CHANNEL_ADAPTER, 0x13, "node1 mlx5_0"),
            record(4, node_type::CHANNEL_ADAPTER, 0x15, "node2 mlx5_0"),
            record(5, node_type::ROUTER, 0x30, "node1 router"),
            record(6, node_type::CHANNEL_ADAPTER, 0x17, "node10 mlx5_0"),
        ] {
            records.insert(Guid(r.node_info.port_guid), Some(r));
        }
        records.insert(Guid(0x99), None);
        FabricFacts {
            local_port_guid: 0x10,
            sm_lid: 1,
            records,
        }
    }

    fn patterns() -> Vec<String> {
        vec!["{node} *".into()]
    }

    #[test]
    fn patterns_match_whole_descriptions() {
        assert!(description_names("{node} *", "node1", "node1 mlx5_0"));
        assert!(description_names("{node} *", "node1", "node1 "));
        assert!(!description_names("{node} *", "node1", "node10 mlx5_0"));
        assert!(!description_names("{node} *", "node1", "node1"));
        assert!(!description_names("{node} *", "node1", "xnode1 mlx5_0"));
        assert!(description_names("{node}", "node1", "node1"));
        assert!(description_names("*-{node}.*", "n1", "rack4-n1.fab"));
        assert!(!description_names("{node}", "node1", "node1 mlx5_0"));
    }

    #[test]
    fn fabric_proof_and_refusals() {
        let f = facts();
        let inv = OperatorInventory::default();
        let p = patterns();
        assert_eq!(
            judge("node1", Guid(0x13), &f, &p, &inv, None),
            Ok(Proof::Fabric {
                description: "node1 mlx5_0".into()
            })
        );
        // Already the node's own: proven again.
        assert!(judge("node1", Guid(0x13), &f, &p, &inv, Some("node1")).is_ok());
        let forbidden = |guid: u64| match judge("node1", Guid(guid), &f, &p, &inv, None) {
            Err(OwnershipRefusal::Forbidden { port, why }) if port == Guid(guid) => why,
            other => panic!("{guid:#x}: {other:?}"),
        };
        assert_eq!(forbidden(0x10), ForbiddenPort::SmHost);
        assert!(matches!(forbidden(0x11), ForbiddenPort::MasterSm { .. }));
        assert!(matches!(
            forbidden(0x20),
            ForbiddenPort::NotChannelAdapter {
                node_type: node_type::SWITCH,
                ..
            }
        ));
        assert!(matches!(
            forbidden(0x30),
            ForbiddenPort::NotChannelAdapter {
                node_type: node_type::ROUTER,
                ..
            }
        ));
        for guid in [0x15, 0x17, 0x99] {
            let r = judge("node1", Guid(guid), &f, &p, &inv, None).unwrap_err();
            assert!(
                matches!(r, OwnershipRefusal::NotShown { .. }),
                "{guid:#x}: {r:?}"
            );
        }
        let r = judge("node1", Guid(0x1234), &f, &p, &inv, None).unwrap_err();
        assert_eq!(r, OwnershipRefusal::NotAsked { port: Guid(0x1234) });
    }

    #[test]
    fn inventory_allows_but_never_moves_or_unlocks_forbidden_ports() {
        let f = facts();
        let p = patterns();
        let inv = OperatorInventory::parse(
            "node1 = [\"0x0000000000000099\", \"0x0000000000000020\", \"0x0000000000000015\"]\n",
        )
        .unwrap();
        assert_eq!(
            judge("node1", Guid(0x99), &f, &p, &inv, None),
            Ok(Proof::Inventory)
        );
        assert!(judge("node2", Guid(0x99), &f, &p, &inv, None).is_err());
        assert!(matches!(
            judge("node1", Guid(0x20), &f, &p, &inv, None),
            Err(OwnershipRefusal::Forbidden { .. })
        ));
        // Held by node2: the inventory does not move it.
        assert!(matches!(
            judge("node1", Guid(0x99), &f, &p, &inv, Some("node2")),
            Err(OwnershipRefusal::OwnedByOther { .. })
        ));
    }

    #[test]
    fn ownership_moves_only_when_the_fabric_shows_the_port_in_the_new_node() {
        let f = facts();
        let p = patterns();
        let inv = OperatorInventory::default();
        assert_eq!(
            judge("node1", Guid(0x13), &f, &p, &inv, Some("node2")),
            Ok(Proof::Moved {
                from: "node2".into(),
                description: "node1 mlx5_0".into()
            })
        );
        let r = judge("node2", Guid(0x13), &f, &p, &inv, Some("node1")).unwrap_err();
        assert!(
            matches!(&r, OwnershipRefusal::OwnedByOther { holder, shown: Some(d), .. }
                if holder == "node1" && d == "node1 mlx5_0"),
            "{r:?}"
        );
    }

    #[test]
    fn inventory_file_is_strict() {
        for bad in [
            "node1 = [\"0x13\"]",
            "node1 = [\"0000000000000013\"]",
            "node1 = [\"0x0000000000000000\"]",
        ] {
            assert!(
                matches!(OperatorInventory::parse(bad), Err(InventoryError::Guid { node, .. }) if node == "node1"),
                "{bad}"
            );
        }
        assert!(matches!(
            OperatorInventory::parse(
                "node1 = [\"0x0000000000000013\"]\nnode2 = [\"0x0000000000000013\"]"
            ),
            Err(InventoryError::Twice {
                guid: Guid(0x13),
                ..
            })
        ));
        for bad in ["node1 = \"0x0000000000000013\"", "[node1]\nx = 1"] {
            assert!(
                matches!(OperatorInventory::parse(bad), Err(InventoryError::Toml(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            OperatorInventory::load(Path::new("/nonexistent/inventory.toml")),
            Err(InventoryFileError {
                source: InventoryError::Read(_),
                ..
            })
        ));
    }

    #[test]
    fn config_defaults_and_validation() {
        let c: OwnershipConfig = toml::from_str("").unwrap();
        assert!(c.enabled);
        assert_eq!(c.description_patterns, vec!["{node} *".to_owned()]);
        assert!(c.validate().is_ok());
        for bad in [
            "description_patterns = []",
            "description_patterns = [\"node\"]",
            "description_patterns = [\"{node}{node}\"]",
            "sa_timeout_ms = 0",
            "sa_timeout_ms = 1000\nsa_deadline_ms = 500",
            "sa_retries = 11",
        ] {
            let c: OwnershipConfig = toml::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
        assert!(toml::from_str::<OwnershipConfig>("bogus = 1").is_err());
    }
}
