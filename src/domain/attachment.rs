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
    /// Set on a live attachment found in a store restored from a copy (or after an unclean stop
    /// that left a change unsent, which a copy of the running node looks like): its key is withheld
    /// from the node's sets until the fabric or the control plane confirms it (see
    /// [`Restored`]). None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
    /// What the current ACTIVE or RELEASED state rests on (the acknowledged apply, the SM hosts
    /// that acknowledged it, the port read): set by the transition to that state, cleared by
    /// any other change of state. None in other states and in records stored before the
    /// evidence was kept with the attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<super::Evidence>,
}

/// Where a live attachment found in a rolled-back store (or after an unclean stop that left a
/// change unsent) stands. The copy may predate a release
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

#[cfg(test)]
impl Attachment {
    /// A test attachment: instance `instance` of partition `ibpart_a` with `key` (full), in
    /// `state`, on the named ports `guids`.
    pub(crate) fn on_named_ports(
        instance: &str,
        key: u32,
        state: AttachmentState,
        guids: &[u64],
    ) -> Attachment {
        Attachment {
            grant: None,
            instance_id: InstanceId::parse(instance).unwrap(),
            partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", key).unwrap(),
            membership: Membership::Full,
            state,
            reason: String::new(),
            created_unix_ns: 0,
            updated_unix_ns: 0,
            ports: guids
                .iter()
                .map(|g| AttachmentPort {
                    device: "mlx5_0".into(),
                    port_number: 1,
                    port_guid: Guid(*g),
                })
                .collect(),
            named_ports: true,
            restored: None,
            evidence: None,
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

    /// Fixes the fabric ports of `inventory` that a whole-node attachment covers now into its
    /// recorded ports, while it wants its key (a key sent to a port may be on it): once joined,
    /// a port stays covered for the attachment's life, so RELEASED needs it read without the
    /// key (or gone from the fabric by the subnet manager's view) even after it drops out of
    /// the read. Returns whether a port joined. Named-port attachments never change.
    pub fn join_ports(&mut self, inventory: &Inventory) -> bool {
        if self.named_ports || !self.wants_key() {
            return false;
        }
        let mut joined = false;
        for p in inventory.fabric_ports() {
            if !self.ports.iter().any(|k| k.port_guid == p.port_guid) {
                self.ports.push(AttachmentPort::of(p));
                joined = true;
            }
        }
        joined
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{PortInfo, PortState};

    fn port(n: u64, fabric: bool) -> PortInfo {
        PortInfo {
            device: "hca".into(),
            port_number: u8::try_from(n).unwrap(),
            port_guid: Guid(n),
            state: PortState::Active,
            fabric_port: fabric,
            ..Default::default()
        }
    }

    fn att(state: AttachmentState, named: bool, ports: &[u64]) -> Attachment {
        Attachment {
            grant: None,
            instance_id: InstanceId::parse("i1").unwrap(),
            partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x12).unwrap(),
            membership: Membership::Full,
            state,
            reason: String::new(),
            created_unix_ns: 0,
            updated_unix_ns: 0,
            ports: ports
                .iter()
                .map(|n| AttachmentPort::of(&port(*n, true)))
                .collect(),
            named_ports: named,
            restored: None,
            evidence: None,
        }
    }

    #[test]
    fn a_fabric_port_joins_a_whole_node_attachment_for_good() {
        let later = Inventory {
            ports: vec![port(1, true), port(2, true), port(3, false)],
        };
        let mut a = att(AttachmentState::Active, false, &[1]);
        assert!(a.join_ports(&later));
        let guids: Vec<Guid> = a.ports.iter().map(|p| p.port_guid).collect();
        assert_eq!(guids, [Guid(1), Guid(2)], "a non-fabric port never joins");
        assert!(!a.join_ports(&later), "nothing new");
        // Port 2 drops out of the read: it stays covered.
        let without = Inventory {
            ports: vec![port(1, true)],
        };
        assert!(!a.join_ports(&without));
        assert_eq!(a.covered_guids(Some(&without)), [Guid(1), Guid(2)]);
        // The record survives the store's encoding (old records without joined ports read too).
        let back: Attachment = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back.ports, a.ports);
    }

    #[test]
    fn named_ports_and_releasing_attachments_take_no_new_port() {
        let inv = Inventory {
            ports: vec![port(1, true), port(2, true)],
        };
        let mut named = att(AttachmentState::Active, true, &[1]);
        assert!(!named.join_ports(&inv));
        assert_eq!(named.ports.len(), 1);
        let mut releasing = att(AttachmentState::Releasing, false, &[1]);
        assert!(!releasing.join_ports(&inv));
        assert_eq!(releasing.ports.len(), 1);
    }
}
