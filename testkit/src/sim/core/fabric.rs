//! The model's whole truth ([`Fabric`]): the node's fabric ports, the subnet manager's state for
//! the node, the sets and adds still on their way, and what may still be programmed from them.

use super::constants::{PORTS, PORT_GUID_BASE};
use super::keys::{gives, program_table, Keys};
use super::sm_host_view::SmHostView;
use fabric_agent::domain::{
    Guid, Inventory, LinkLayer, NodeMemberships, PKeyValue, PortInfo, PortState,
};
use std::collections::BTreeMap;

/// One model port: what it really holds now.
#[derive(Debug, Clone)]
pub struct ModelPort {
    /// Port GUID.
    pub guid: u64,
    /// Link up (a DOWN port's table counts as empty).
    pub up: bool,
    /// The whole P_Key table.
    pub table: Vec<u16>,
}

impl ModelPort {
    /// Whether the port really holds this base now (a DOWN port holds nothing).
    pub fn holds_base(&self, base: u16) -> bool {
        self.up && self.table.iter().any(|e| *e & 0x7FFF == base)
    }
}

/// A set the node sent that the SM has not taken yet (it may still land).
#[derive(Debug, Clone)]
pub struct Request {
    /// Generation it carries.
    pub generation: u64,
    /// SM incarnation it was sent to (a restart loses it).
    pub epoch: u64,
    /// The keys.
    pub keys: Keys,
    /// The set as the node sent it (the model SM stores it for the start check's read; None
    /// where another backend stores the set).
    pub set: Option<NodeMemberships>,
}

/// The model subnet manager's state for this node: what it DID (took, programs), apart from
/// what it answered.
#[derive(Debug, Clone, Default)]
pub struct SmNode {
    /// The last set it took (None: it knows nothing of the node and programs nothing for it).
    pub config: Option<Keys>,
    /// The generation it holds.
    pub stored_generation: u64,
    /// The set it holds, as the node sent it (the model SM: what `stored_sets` answers).
    pub stored_set: Option<NodeMemberships>,
    /// Incarnation, bumped at every restart.
    pub epoch: u64,
}

/// The model's whole truth.
#[derive(Debug, Clone)]
pub struct Fabric {
    /// The node's fabric ports.
    pub ports: Vec<ModelPort>,
    /// The SM's state for this node.
    pub sm: SmNode,
    /// Sets on their way to the SM, by request number.
    pub in_flight: BTreeMap<u64, Request>,
    /// The highest generation the node ever sent.
    pub max_generation_seen: u64,
    /// The real SM-host backend between the node and a model OpenSM (`--opensm` runs): what it
    /// holds or wrote may still be programmed.
    pub sm_host: Option<SmHostView>,
    /// Adds on their way to UFM (`--ufm` runs), by request number: (base, port GUIDs). UFM
    /// has no fencing: each may still be executed, whenever it lands.
    pub ufm_adds: BTreeMap<u64, (u16, Vec<u64>)>,
}

impl Fabric {
    /// The fabric at the start of a run: every port UP with the default entry only, an SM
    /// that knows nothing of the node.
    pub(crate) fn new() -> Fabric {
        Fabric {
            ports: (0..PORTS)
                .map(|i| ModelPort {
                    guid: PORT_GUID_BASE + i as u64,
                    up: true,
                    table: program_table(&Keys::new(), 0),
                })
                .collect(),
            sm: SmNode::default(),
            in_flight: BTreeMap::new(),
            max_generation_seen: 0,
            sm_host: None,
            ufm_adds: BTreeMap::new(),
        }
    }

    /// The generation of the node's set the fabric side holds now (0: none).
    pub fn held_generation(&self) -> u64 {
        match &self.sm_host {
            Some(h) => h.stored_generation(),
            None => self.sm.stored_generation,
        }
    }

    /// The generation the fabric side tells the node's start check it holds (0: it stores no
    /// set of the node, whatever generation it fences with).
    pub fn answered_generation(&self) -> u64 {
        match &self.sm_host {
            Some(h) => h.stored_generation(),
            None if self.sm.stored_set.is_some() => self.sm.stored_generation,
            None => 0,
        }
    }

    /// Whether a request may still be taken by the SM (same incarnation, not fenced now).
    pub fn takeable(&self, r: &Request) -> bool {
        let stored = self.held_generation();
        r.epoch == self.sm.epoch && r.generation >= stored
    }

    /// Why base `b` may still reach or already is on one of the ports `guids` (None: it
    /// cannot).
    pub fn holds_or_may_program(&self, base: u16, guids: &[u64]) -> Option<String> {
        for (i, p) in self.ports.iter().enumerate() {
            if guids.contains(&p.guid) && p.holds_base(base) {
                return Some(format!(
                    "model port {i} holds {base:#06x} (table {:04x?})",
                    p.table
                ));
            }
        }
        if let Some(cfg) = &self.sm.config {
            if let Some(g) = guids.iter().find(|g| gives(cfg, base, **g)) {
                return Some(format!(
                    "the model SM's config for the node (generation {}) gives {base:#06x} to \
                     port {g:#x}: it programs it there",
                    self.sm.stored_generation
                ));
            }
        }
        if let Some(why) = self
            .sm_host
            .as_ref()
            .and_then(|h| h.may_program(base, guids))
        {
            return Some(why);
        }
        for (id, (b, ports)) in &self.ufm_adds {
            if let Some(g) = guids.iter().find(|g| *b == base && ports.contains(g)) {
                return Some(format!(
                    "UFM request #{id}, an add of {base:#06x} for port {g:#x}, is still on its \
                     way and UFM executes whatever reaches it"
                ));
            }
        }
        for (id, r) in &self.in_flight {
            if guids.iter().any(|g| gives(&r.keys, base, *g)) && self.takeable(r) {
                return Some(format!(
                    "request #{id} (generation {}, stored {}) carrying {base:#06x} to a covered \
                     port is still on its way to the SM and would be taken",
                    r.generation, self.sm.stored_generation
                ));
            }
        }
        None
    }

    /// The inventory an honest read would return now.
    pub fn inventory(&self) -> Inventory {
        let mut ports: Vec<PortInfo> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| PortInfo {
                device: format!("mlx5_{i}"),
                port_number: 1,
                port_guid: Guid(p.guid),
                node_guid: Guid(0x0002_c903_0000_0f00 + i as u64),
                lid: 10 + i as u16,
                sm_lid: 1,
                state: if p.up {
                    PortState::Active
                } else {
                    PortState::Down
                },
                link_layer: LinkLayer::Infiniband,
                pkeys: p.table.iter().map(|e| PKeyValue(*e)).collect(),
                fabric_port: false,
            })
            .collect();
        // An Ethernet port the selector must leave out.
        ports.push(PortInfo {
            device: "eth_roce".into(),
            port_number: 1,
            port_guid: Guid(0x0002_c903_0000_2000),
            state: PortState::Active,
            link_layer: LinkLayer::Ethernet,
            pkeys: vec![PKeyValue(0xFFFF)],
            ..Default::default()
        });
        Inventory { ports }
    }
}
