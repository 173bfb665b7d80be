//! The model world: the truth of the node's fabric ports and of the subnet manager, the seeded
//! RNG every model decision draws from, the trace, and the oracle. Every change to the world
//! goes through [`with`], which lets the oracle read the agent's new events and check the
//! invariants before and after the change, so no instant between two changes goes unchecked.

use super::oracle::Oracle;
use super::schedule::PORTS;
use fabric_agent::domain::{Guid, Inventory, LinkLayer, PKeyValue, PortInfo, PortState};
use fabric_agent::store::Store;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// P_Key table size of every model port (default partition included).
pub const TABLE_SIZE: usize = 8;
/// Model port `i`'s GUID is this plus `i`.
pub const PORT_GUID_BASE: u64 = 0x0002_c903_0000_1000;
/// The default partition entry every port holds (limited member: a well-run fabric).
pub const DEFAULT_ENTRY: u16 = 0x7FFF;

/// Keys by base -> the entry value (membership bit included) and the port GUIDs that get it.
pub type Keys = BTreeMap<u16, (u16, Vec<u64>)>;

/// What a node's set gives, as the model keeps it.
pub fn keys_of(desired: &fabric_agent::domain::NodeMemberships) -> Keys {
    desired
        .keys
        .iter()
        .map(|(k, s)| {
            let ports = desired.guids_for(*k).into_iter().map(|g| g.0).collect();
            (k.base(), (k.value(s.membership).0, ports))
        })
        .collect()
}

/// Whether `keys` give `base` to the port `guid`.
pub fn gives(keys: &Keys, base: u16, guid: u64) -> bool {
    keys.get(&base)
        .is_some_and(|(_, ports)| ports.contains(&guid))
}

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
}

/// The model subnet manager's state for this node: what it DID (took, programs), apart from
/// what it answered.
#[derive(Debug, Clone, Default)]
pub struct SmNode {
    /// The last set it took (None: it knows nothing of the node and programs nothing for it).
    pub config: Option<Keys>,
    /// The generation it holds.
    pub stored_generation: u64,
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
    pub sm_host: Option<super::model_opensm::SmHostView>,
    /// Adds on their way to UFM (`--ufm` runs), by request number: (base, port GUIDs). UFM
    /// has no fencing: each may still be executed, whenever it lands.
    pub ufm_adds: BTreeMap<u64, (u16, Vec<u64>)>,
}

impl Fabric {
    fn new() -> Fabric {
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

    /// Whether a request may still be taken by the SM (same incarnation, not fenced now).
    pub fn takeable(&self, r: &Request) -> bool {
        let stored = match &self.sm_host {
            Some(h) => h.stored_generation(),
            None => self.sm.stored_generation,
        };
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

/// The table the SM programs on port `guid` for a config: the default entry, then the keys the
/// config gives that port, then empty slots.
pub fn program_table(keys: &Keys, guid: u64) -> Vec<u16> {
    let mut t = vec![DEFAULT_ENTRY];
    t.extend(
        keys.values()
            .filter(|(_, ports)| ports.contains(&guid))
            .map(|(v, _)| *v),
    );
    t.resize(TABLE_SIZE.max(t.len()), 0);
    t.truncate(TABLE_SIZE);
    t
}

/// Everything shared between the driver, the model SM and the model observer.
pub struct World {
    /// Start of the run.
    pub t0: Instant,
    /// The one RNG model decisions draw from (derived from the seed).
    pub rng: StdRng,
    /// Whether random faults are on.
    pub faults: bool,
    /// The truth.
    pub fabric: Fabric,
    /// The checker.
    pub oracle: Oracle,
    /// What happened, with simulated times.
    pub trace: Vec<String>,
    /// Signalled when a port table or state changes (the observer's trap).
    pub changes: Arc<Notify>,
    /// Signalled when an apply starts.
    pub apply_started: Arc<Notify>,
    /// Signalled when a read starts.
    pub read_started: Arc<Notify>,
    /// Request numbers.
    pub next_request: u64,
    /// Number of applies issued.
    pub applies: u64,
    /// Number of reads issued.
    pub reads: u64,
    /// Port sweeps the SM has yet to run.
    pub sweeps_pending: u64,
    /// The model UFM (`--ufm` runs).
    pub ufm: Option<super::model_ufm::UfmWorld>,
    /// A crash armed for the next apply's `n`-th poll.
    pub apply_crash: Option<super::crash::ApplyCrash>,
    /// A crash armed for the next command: its poll, how long the agent stays down (ms).
    pub command_crash: Option<(u32, u64)>,
}

/// The world behind a lock (never held across an await).
pub type Shared = Arc<Mutex<World>>;

impl World {
    /// A fresh world for a seed.
    pub fn new(seed: u64, store: Arc<Store>) -> Shared {
        Arc::new(Mutex::new(World {
            t0: Instant::now(),
            rng: StdRng::seed_from_u64(seed ^ 0x5EED_F00D_FAB1_C0DE),
            faults: false,
            fabric: Fabric::new(),
            oracle: Oracle::new(store),
            trace: Vec::new(),
            changes: Arc::new(Notify::new()),
            apply_started: Arc::new(Notify::new()),
            read_started: Arc::new(Notify::new()),
            next_request: 1,
            applies: 0,
            reads: 0,
            sweeps_pending: 0,
            ufm: None,
            apply_crash: None,
            command_crash: None,
        }))
    }

    /// Simulated milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// Appends a trace line stamped with the simulated time.
    pub fn log(&mut self, line: impl AsRef<str>) {
        let t = self.now_ms();
        self.trace.push(format!("t={t:>7} ms  {}", line.as_ref()));
    }

    /// Lets the oracle catch up with the agent's events and check every invariant now.
    pub fn check(&mut self) {
        let now = self.now_ms();
        self.oracle.sync(&self.fabric, now);
        for note in std::mem::take(&mut self.oracle.notes) {
            self.log(format!("(seen) {note}"));
        }
    }

    /// Programs port `i` from the SM's current config (if up) and signals the change.
    pub fn program_port(&mut self, i: usize) {
        let empty = Keys::new();
        let cfg = self.fabric.sm.config.as_ref().unwrap_or(&empty);
        let table = program_table(cfg, self.fabric.ports[i].guid);
        let port = &mut self.fabric.ports[i];
        if port.up && port.table != table {
            port.table = table;
            let line = format!("sm: port {i} programmed: {:04x?}", port.table);
            self.log(line);
            self.changes.notify_waiters();
        }
    }

    /// Counts an apply carrying `generation` and checks the node's generations strictly
    /// increase over its whole life, crashes included (the old protocol sent 0 every time;
    /// that is not a regression of this check).
    pub fn note_apply(&mut self, generation: u64) {
        self.applies += 1;
        let max = self.fabric.max_generation_seen;
        if generation != 0 && generation <= max {
            let now = self.now_ms();
            self.oracle.finding.get_or_insert(format!(
                "seen at t={now} ms: the node sent generation {generation}, not above {max} \
                 which it sent before"
            ));
        }
        self.fabric.max_generation_seen = max.max(generation);
    }

    /// A random duration in `lo..hi` ms.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        use rand::Rng;
        Duration::from_millis(self.rng.random_range(lo..hi))
    }

    /// A random event with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        use rand::Rng;
        self.rng.random_bool(p)
    }
}

/// Runs `f` on the world between two oracle checks.
pub fn with<R>(world: &Shared, f: impl FnOnce(&mut World) -> R) -> R {
    let mut w = world.lock().expect("world lock");
    w.check();
    let r = f(&mut w);
    w.check();
    r
}

/// Formats keys as `{0x8012@[0,1], 0x0034@[1]}` (the model ports, by index, that get each).
pub fn show_keys(keys: &Keys) -> String {
    let v: Vec<String> = keys
        .values()
        .map(|(v, ports)| {
            let idx: Vec<String> = ports
                .iter()
                .map(|g| (g - PORT_GUID_BASE).to_string())
                .collect();
            format!("{v:#06x}@[{}]", idx.join(","))
        })
        .collect();
    format!("{{{}}}", v.join(", "))
}
