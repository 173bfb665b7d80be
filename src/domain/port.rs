use super::{Guid, PKeyValue};
use serde::{Deserialize, Serialize};

/// A port's logical state (PortInfo.PortState / sysfs `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PortState {
    /// Unknown or not reported.
    #[default]
    Unknown,
    /// Link down.
    Down,
    /// Link up, not configured by the SM yet.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Active.
    Active,
    /// Active, deferring.
    ActiveDefer,
}

impl PortState {
    /// Maps the IBA PortState number (1 Down .. 5 ActiveDefer).
    pub fn from_iba(v: u8) -> PortState {
        match v {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            _ => PortState::Unknown,
        }
    }

    /// The IBA PortState number (0 when unknown).
    pub fn iba_number(self) -> u8 {
        match self {
            PortState::Unknown => 0,
            PortState::Down => 1,
            PortState::Init => 2,
            PortState::Armed => 3,
            PortState::Active => 4,
            PortState::ActiveDefer => 5,
        }
    }

    /// Whether the port's P_Key table counts (a DOWN port is reprogrammed before it can go
    /// ACTIVE again, so its table counts as empty).
    pub fn table_counts(self) -> bool {
        !matches!(self, PortState::Down | PortState::Unknown)
    }

    /// Whether the link carries data (ACTIVE or ACTIVE_DEFER): INIT and ARMED ports hold a
    /// table but pass no tenant traffic yet, so they never make an attachment ACTIVE.
    pub fn is_up(self) -> bool {
        matches!(self, PortState::Active | PortState::ActiveDefer)
    }
}

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LinkLayer {
    /// Unknown.
    #[default]
    Unknown,
    /// InfiniBand.
    Infiniband,
    /// Ethernet (RoCE).
    Ethernet,
}

/// What an observer knows of one RDMA port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PortInfo {
    /// Device name, e.g. `mlx5_0`.
    pub device: String,
    /// 1-based port number.
    pub port_number: u8,
    /// Port GUID.
    pub port_guid: Guid,
    /// Node (device) GUID.
    pub node_guid: Guid,
    /// Base LID.
    pub lid: u16,
    /// The subnet manager's LID.
    pub sm_lid: u16,
    /// Logical state.
    pub state: PortState,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// The whole P_Key table, empty slots included (0x0000).
    pub pkeys: Vec<PKeyValue>,
    /// Whether this port belongs to the node's fabric (set by the agent from [`PortSelector`]).
    pub fabric_port: bool,
}

impl PortInfo {
    /// Whether the table holds exactly this entry.
    pub fn holds(&self, key: PKeyValue) -> bool {
        self.pkeys.contains(&key)
    }

    /// Whether the table holds this key's base with any membership.
    pub fn holds_base(&self, base: u16) -> bool {
        self.pkeys.iter().any(|k| !k.is_empty() && k.base() == base)
    }

    /// Non-empty entries in table order.
    pub fn entries(&self) -> impl Iterator<Item = PKeyValue> + '_ {
        self.pkeys.iter().copied().filter(|k| !k.is_empty())
    }
}

/// Every port an observer sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Inventory {
    /// Ports in device, port order.
    pub ports: Vec<PortInfo>,
}

impl Inventory {
    /// The port with this GUID, fabric port or not.
    pub fn port(&self, guid: Guid) -> Option<&PortInfo> {
        self.ports.iter().find(|p| p.port_guid == guid)
    }

    /// Ports that belong to the node's fabric.
    pub fn fabric_ports(&self) -> impl Iterator<Item = &PortInfo> {
        self.ports.iter().filter(|p| p.fabric_port)
    }

    /// The smallest P_Key table among fabric ports, minus the default partition's slot: how many
    /// tenant keys every fabric port can hold.
    pub fn tenant_key_capacity(&self) -> usize {
        self.fabric_ports()
            .map(|p| p.pkeys.len().saturating_sub(1))
            .min()
            .unwrap_or(0)
    }
}

/// A port as an attach request names it: a device and port number, or a port GUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PortName {
    /// `mlx5_0` port 1.
    Device {
        /// Device name.
        device: String,
        /// 1-based port number.
        port_number: u8,
    },
    /// A port GUID.
    Guid(Guid),
}

impl std::fmt::Display for PortName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortName::Device {
                device,
                port_number,
            } => write!(f, "{device}/{port_number}"),
            PortName::Guid(g) => write!(f, "{g}"),
        }
    }
}

impl PortName {
    /// Whether this name denotes `port`.
    pub fn names(&self, port: &PortInfo) -> bool {
        match self {
            PortName::Device {
                device,
                port_number,
            } => port.device == *device && port.port_number == *port_number,
            PortName::Guid(g) => port.port_guid == *g,
        }
    }
}

/// One port an attachment covers, fixed when the attachment is admitted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttachmentPort {
    /// Device name at admission.
    pub device: String,
    /// 1-based port number.
    pub port_number: u8,
    /// Port GUID (what identifies the port from then on).
    pub port_guid: Guid,
}

impl AttachmentPort {
    /// The port as an inventory entry describes it.
    pub fn of(p: &PortInfo) -> AttachmentPort {
        AttachmentPort {
            device: p.device.clone(),
            port_number: p.port_number,
            port_guid: p.port_guid,
        }
    }
}

impl std::fmt::Display for AttachmentPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} ({})",
            self.device, self.port_number, self.port_guid
        )
    }
}

/// Which ports belong to the node's fabric. Empty lists mean "every InfiniBand link-layer port".
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PortSelector {
    /// Device name patterns (`*` matches any run of characters), e.g. `mlx5_*`.
    pub devices: Vec<String>,
    /// Port GUIDs.
    pub guids: Vec<Guid>,
}

impl PortSelector {
    /// Whether a port belongs to the fabric.
    pub fn selects(&self, port: &PortInfo) -> bool {
        if self.devices.is_empty() && self.guids.is_empty() {
            return port.link_layer == LinkLayer::Infiniband;
        }
        self.guids.contains(&port.port_guid)
            || self.devices.iter().any(|p| glob_match(p, &port.device))
    }

    /// Marks `fabric_port` on every port of an inventory.
    pub fn apply(&self, inventory: &mut Inventory) {
        for p in &mut inventory.ports {
            p.fabric_port = self.selects(p);
        }
    }
}

/// `*`-only glob matching.
fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("mlx5_*", "mlx5_0"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("mlx*_1*", "mlx5_10"));
        assert!(!glob_match("mlx5_*", "rxe0"));
        assert!(glob_match("rxe0", "rxe0"));
        assert!(!glob_match("a*a", "a"));
    }

    #[test]
    fn default_selector_takes_infiniband_ports() {
        let ib = PortInfo {
            link_layer: LinkLayer::Infiniband,
            ..Default::default()
        };
        let eth = PortInfo {
            link_layer: LinkLayer::Ethernet,
            ..Default::default()
        };
        let s = PortSelector::default();
        assert!(s.selects(&ib));
        assert!(!s.selects(&eth));
    }
}
