use super::{
    validate_label, AttachmentPort, DomainError, Guid, Inventory, LabelRules, Membership,
    PKeyValue, Partition,
};
use serde::{Deserialize, Serialize};
use std::fmt;

const INSTANCE_RULES: LabelRules = LabelRules {
    max_len: 128,
    punctuation: "._:-",
};

/// A tenant instance on this node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct InstanceId(String);

impl InstanceId {
    /// Validates an instance id: 1-128 characters `[A-Za-z0-9._:-]`.
    pub fn parse(s: &str) -> Result<Self, DomainError> {
        validate_label("instance_id", s, INSTANCE_RULES)?;
        Ok(InstanceId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an attachment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AttachmentState {
    /// Desired state persisted, not yet handed to the subnet manager.
    Pending,
    /// The subnet manager accepted the key; waiting for the ports.
    Programming,
    /// Every fabric port holds the key.
    Active,
    /// Was active; the key vanished from a fabric port and is being re-applied.
    Drifted,
    /// Release requested; waiting until no fabric port holds the key.
    Releasing,
    /// No fabric port holds the key. Final.
    Released,
    /// A condition retries cannot fix; see the attachment's reason.
    Failed,
}

impl AttachmentState {
    /// Every state, in life order.
    pub const ALL: [AttachmentState; 7] = [
        AttachmentState::Pending,
        AttachmentState::Programming,
        AttachmentState::Active,
        AttachmentState::Drifted,
        AttachmentState::Releasing,
        AttachmentState::Released,
        AttachmentState::Failed,
    ];

    /// The API's name for the state.
    pub fn name(self) -> &'static str {
        match self {
            AttachmentState::Pending => "PENDING",
            AttachmentState::Programming => "PROGRAMMING",
            AttachmentState::Active => "ACTIVE",
            AttachmentState::Drifted => "DRIFTED",
            AttachmentState::Releasing => "RELEASING",
            AttachmentState::Released => "RELEASED",
            AttachmentState::Failed => "FAILED",
        }
    }

    /// Whether the node should hold the key in this state.
    pub fn wants_key(self) -> bool {
        matches!(
            self,
            AttachmentState::Pending
                | AttachmentState::Programming
                | AttachmentState::Active
                | AttachmentState::Drifted
        )
    }

    /// Whether the release was requested (RELEASING or RELEASED).
    pub fn is_released_or_releasing(self) -> bool {
        matches!(self, AttachmentState::Releasing | AttachmentState::Released)
    }
}

impl fmt::Display for AttachmentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One instance's membership in one partition on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The instance.
    pub instance_id: InstanceId,
    /// The partition, as the attach request described it.
    pub partition: Partition,
    /// Full or limited.
    pub membership: Membership,
    /// Current state.
    pub state: AttachmentState,
    /// Why FAILED, or the last transient error; empty otherwise.
    pub reason: String,
    /// Creation time, Unix nanoseconds.
    pub created_unix_ns: i64,
    /// Last state change, Unix nanoseconds.
    pub updated_unix_ns: i64,
    /// The control plane's grant for this attachment, carried in every set the node sends to
    /// the fabric side (absent in records stored before grants existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<super::SignedGrant>,
    /// The ports this attachment covers, fixed at admission (empty in records stored before
    /// ports were named: those cover every fabric port the node reads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<AttachmentPort>,
    /// Whether the request named its ports (a partial-node attachment). False: the whole node,
    /// and a fabric port that appears later joins the attachment too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub named_ports: bool,
    /// Set on a live attachment found in a store restored from a copy: its key is withheld
    /// from the node's sets until the fabric or the control plane confirms it (see
    /// [`Restored`]). None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
}

/// Where a live attachment found in a rolled-back store stands. The copy may predate a release
/// the control plane was told of (RELEASED, its key off the ports); sending the restored set
/// would put that key back on the ports. So the key is withheld until something newer than the
/// copy confirms the attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restored {
    /// Marked when the rollback was found: the first port read after it decides. Ports that
    /// still hold the key on every covered port show the fabric side kept it (nothing was sent
    /// since the restore); otherwise the attachment becomes [`Restored::Unconfirmed`].
    AwaitingRead,
    /// The ports did not hold the key after the restore: withheld until the control plane
    /// sends the attach again (which confirms it) or releases the instance.
    Unconfirmed,
}

impl Restored {
    /// The name used in reasons and the condition's detail.
    pub fn name(self) -> &'static str {
        match self {
            Restored::AwaitingRead => "restored, awaiting the first port read",
            Restored::Unconfirmed => "restored, unconfirmed",
        }
    }
}

impl Attachment {
    /// Whether the node asks the fabric side for this attachment's key now: its state wants
    /// the key and it is not a restored attachment awaiting confirmation.
    pub fn wants_key(&self) -> bool {
        self.state.wants_key() && self.restored.is_none()
    }

    /// The 16-bit table entry this attachment puts on the ports.
    pub fn pkey_value(&self) -> PKeyValue {
        self.partition.pkey.value(self.membership)
    }

    /// The GUIDs of the ports this attachment covers now: the ports fixed at admission, plus,
    /// for a whole-node attachment, every fabric port of `inventory` (a port that appeared
    /// later joins whole-node attachments only).
    pub fn covered_guids(&self, inventory: Option<&Inventory>) -> Vec<Guid> {
        let mut out: Vec<Guid> = self.ports.iter().map(|p| p.port_guid).collect();
        if !self.named_ports {
            if let Some(inv) = inventory {
                out.extend(inv.fabric_ports().map(|p| p.port_guid));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// How a covered port is named in reasons: as fixed at admission, else as read now.
    pub fn port_label(&self, guid: Guid, inventory: Option<&Inventory>) -> String {
        if let Some(p) = self.ports.iter().find(|p| p.port_guid == guid) {
            return p.to_string();
        }
        match inventory.and_then(|i| i.port(guid)) {
            Some(p) => AttachmentPort::of(p).to_string(),
            None => guid.to_string(),
        }
    }
}
