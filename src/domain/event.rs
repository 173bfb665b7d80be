use super::{AttachmentPort, AttachmentState, ConditionKind, Guid, PKeyValue, PortState, SmState};
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
        /// For ACTIVE and RELEASED: the subnet manager's acknowledgement and the port read the
        /// claim rests on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evidence: Option<Evidence>,
        /// The ports the attachment covers, as fixed at admission (empty in events recorded
        /// before attachments named their ports).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ports: Vec<AttachmentPort>,
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
    /// The subnet manager's answer changed: acknowledged, refused or no answer.
    SubnetManagerChanged {
        /// Backend name.
        backend: String,
        /// Whether the last apply succeeded.
        reachable: bool,
        /// The error, when the last apply failed.
        error: String,
        /// Acknowledged, refused or unreachable (`Unknown` in events recorded before the
        /// state was).
        #[serde(default)]
        state: SmState,
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
    /// A standing condition was raised or cleared.
    ConditionChanged {
        /// Which condition.
        condition: ConditionKind,
        /// True when raised, false when cleared.
        active: bool,
        /// What was seen.
        detail: String,
    },
}

/// What an ACTIVE or RELEASED claim rests on: an acknowledged apply, and a port read that
/// started after that acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The generation of the acknowledged apply.
    pub sm_generation: u64,
    /// When the subnet manager's acknowledgement arrived, Unix nanoseconds.
    pub sm_ack_unix_ns: i64,
    /// When the port read began, Unix nanoseconds (after the acknowledgement).
    pub read_unix_ns: i64,
    /// Every fabric port that read saw.
    pub ports: Vec<PortReading>,
    /// The SM hosts that acknowledged that generation, by identity (the name TLS verified in
    /// each host's certificate; on plaintext, the name it stated, else its endpoint), sorted.
    /// With the remote backend to a UFM broker, the broker. Empty for a backend without separate
    /// SM hosts (embedded, OpenSM on this host, UFM direct, simulated) and in evidence recorded
    /// before the hosts were named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledged_by: Vec<String>,
}

/// One fabric port as a read saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortReading {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port_number: u8,
    /// Port GUID.
    pub port_guid: Guid,
    /// Logical state.
    pub state: PortState,
}
