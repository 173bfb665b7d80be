use super::{AttachmentState, Guid, PKeyValue, PortState};
use serde::{Deserialize, Serialize};

/// One entry of the node's durable, ordered event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Gap-free, strictly increasing sequence number (starts at 1).
    pub seq: u64,
    /// When the event was recorded, Unix nanoseconds.
    pub time_unix_ns: i64,
    /// What happened.
    pub kind: EventKind,
}

/// What an [`Event`] reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// An attachment changed state.
    AttachmentChanged {
        /// The instance.
        instance_id: String,
        /// Its partition.
        partition_id: String,
        /// The key value it puts on the ports.
        pkey_value: PKeyValue,
        /// Previous state (None when just created).
        from: Option<AttachmentState>,
        /// New state.
        to: AttachmentState,
        /// Why, when there is something to say.
        reason: String,
    },
    /// A port's P_Key table changed.
    PKeyTableChanged {
        /// Device name.
        device: String,
        /// Port number.
        port_number: u8,
        /// Port GUID.
        port_guid: Guid,
        /// Entries that appeared.
        added: Vec<PKeyValue>,
        /// Entries that vanished.
        removed: Vec<PKeyValue>,
    },
    /// A port's logical state changed.
    PortStateChanged {
        /// Device name.
        device: String,
        /// Port number.
        port_number: u8,
        /// Port GUID.
        port_guid: Guid,
        /// Previous state.
        from: PortState,
        /// New state.
        to: PortState,
    },
    /// The subnet manager became reachable or unreachable.
    SubnetManagerChanged {
        /// Backend name.
        backend: String,
        /// Whether the last apply succeeded.
        reachable: bool,
        /// The error, when unreachable.
        error: String,
    },
    /// A fabric port holds a key that no attachment asked for.
    ForeignPKey {
        /// Device name.
        device: String,
        /// Port number.
        port_number: u8,
        /// Port GUID.
        port_guid: Guid,
        /// The unexpected entry.
        pkey_value: PKeyValue,
    },
}
