//! What a chaos campaign saw, as the checker reads it: every port read (`smpquery`), every event
//! the control plane received from a node's stream, every grant, revocation and delete-guard
//! "yes" the control-plane driver made. Times are wall-clock milliseconds since the Unix epoch
//! (the agents stamp their events with the same clock: one machine).

use std::sync::{Arc, Mutex};

/// Milliseconds since the Unix epoch.
pub type Ms = u64;

/// Now, in [`Ms`].
pub fn now_ms() -> Ms {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Ms)
        .unwrap_or_default()
}

/// The default partition's base, on every port and never a tenant's.
pub const DEFAULT_BASE: u16 = 0x7fff;

/// The tenant key bases of a P_Key table (membership bit dropped; empty slots and the default
/// partition left out), sorted and deduplicated.
pub fn tenant_bases(keys: &[u16]) -> Vec<u16> {
    let mut out: Vec<u16> = keys
        .iter()
        .map(|k| k & 0x7fff)
        .filter(|b| *b != 0 && *b != DEFAULT_BASE)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One read of a node's port 1 P_Key table by `smpquery`.
#[derive(Debug, Clone, PartialEq)]
pub struct PortRead {
    /// The node whose port was read.
    pub node: String,
    /// When the query was started.
    pub started: Ms,
    /// When its answer was in.
    pub ended: Ms,
    /// The tenant key bases the table held ([`tenant_bases`]).
    pub bases: Vec<u16>,
    /// The port's LinkState (`smpquery portinfo`, read right after the table when it held a
    /// tenant key; `None` when not read): a port that is not Active counts as not holding a
    /// key (TRUTH-RULES.md: the SM reprograms a port before it can go ACTIVE again).
    pub link: Option<String>,
}

impl PortRead {
    /// Whether the port was seen not Active (a documented exception for keys it holds).
    pub fn not_active(&self) -> bool {
        self.link.as_deref().is_some_and(|l| l != "Active")
    }
}

/// An attachment's state change carried by an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The instance.
    pub instance: String,
    /// Its key's base.
    pub pkey: u16,
    /// The new state (`fabric.agent.v1.AttachmentState` value).
    pub to: i32,
    /// The agent's reason.
    pub reason: String,
}

/// One event as the control plane received it from a node's `WatchEvents` stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenEvent {
    /// The node.
    pub node: String,
    /// Its log epoch.
    pub epoch: String,
    /// Its sequence number.
    pub seq: u64,
    /// The agent's timestamp of the event.
    pub at: Ms,
    /// A digest of its content (kind and time): one (epoch, seq) must name one event only.
    pub digest: String,
    /// The attachment change it carries, if any.
    pub change: Option<Change>,
}

/// A grant the control plane signed and sent with an attach (recorded before the send).
#[derive(Debug, Clone, PartialEq)]
pub struct Granted {
    /// The node.
    pub node: String,
    /// The instance.
    pub instance: String,
    /// The key's base.
    pub pkey: u16,
    /// When it was issued.
    pub at: Ms,
}

/// One entry of a history.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A port read.
    Read(PortRead),
    /// An event received.
    Event(SeenEvent),
    /// The watcher of `node` was told its cursor no longer holds (OUT_OF_RANGE: another epoch,
    /// a rewound or pruned log) and started over from what the node retains.
    Resync {
        /// The node.
        node: String,
        /// When.
        at: Ms,
        /// The node's message.
        why: String,
    },
    /// A grant issued.
    Grant(Granted),
    /// An instance revoked at an SM host (acknowledged at `at`).
    Revoke {
        /// The node.
        node: String,
        /// The instance.
        instance: String,
        /// When the SM host acknowledged it.
        at: Ms,
    },
    /// An attach or release the node acknowledged as final (ACTIVE / RELEASED) in its reply.
    Ack {
        /// The node.
        node: String,
        /// The instance.
        instance: String,
        /// The state the reply carried.
        state: i32,
        /// When the reply came.
        at: Ms,
    },
    /// The fault loop dropped (`up: false`, ibsim `Unlink`) or restored (`ReLink`) a node's link.
    Link {
        /// The node.
        node: String,
        /// Restored (true) or dropped.
        up: bool,
        /// When the console command was sent.
        at: Ms,
    },
    /// The delete guard said yes for a partition's key, and the partition was deleted.
    DeleteYes {
        /// The key's base.
        pkey: u16,
        /// When the guard said yes.
        at: Ms,
    },
}

/// A campaign's history: entries in the order they were recorded (each stream's own entries in
/// the order that stream saw them).
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Every entry.
    pub entries: Vec<Entry>,
}

/// A history shared by the campaign's recorders.
pub type SharedHistory = Arc<Mutex<History>>;

impl History {
    /// Appends `entry`.
    pub fn push(&mut self, entry: Entry) {
        self.entries.push(entry);
    }

    /// The port reads.
    pub fn reads(&self) -> impl Iterator<Item = &PortRead> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Read(r) => Some(r),
            _ => None,
        })
    }

    /// The events received.
    pub fn events(&self) -> impl Iterator<Item = &SeenEvent> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Event(v) => Some(v),
            _ => None,
        })
    }

    /// The grants issued.
    pub fn grants(&self) -> impl Iterator<Item = &Granted> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Grant(g) => Some(g),
            _ => None,
        })
    }
}

/// Appends `entry` to a shared history.
pub fn record(history: &SharedHistory, entry: Entry) {
    history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(entry);
}
