//! What the agent knows right now besides the store: the latest inventory and the subnet
//! manager's health, and the node view built from them.

use crate::domain::{
    Attachment, AttachmentState, Condition, Inventory, Membership, PKey, PKeyValue, PortInfo,
    SmState,
};
use std::collections::BTreeMap;

/// The subnet manager's health as the reconciler last saw it.
#[derive(Debug, Clone, Default)]
pub struct SmStatus {
    /// Backend name.
    pub backend: String,
    /// Whether the last apply succeeded.
    pub reachable: bool,
    /// Acknowledged, refused (answered and said no) or unreachable (no answer).
    pub state: SmState,
    /// The last error; empty when healthy.
    pub last_error: String,
    /// When the last apply succeeded, Unix ns (0: never).
    pub last_apply_unix_ns: i64,
    /// Applies attempted since start.
    pub applies: u64,
    /// The generation of the last apply attempted.
    pub generation: u64,
    /// Keys in doubt (`sm_knowledge::SmKnowledge::in_doubt`; the README's truth rules).
    pub in_doubt: Vec<PKey>,
    /// The same keys as the values the node's attachments give them (full membership when any
    /// of them is full, as the desired set does); filled in the node view.
    pub in_doubt_values: Vec<PKeyValue>,
    /// The apply waiting for the subnet manager's answer now, if any.
    pub in_flight: Option<ApplyInFlight>,
    /// The remote backend: the fabric's SM-host set as the last finished apply saw it.
    pub sm_hosts: Option<crate::domain::SmHostSet>,
}

/// An apply sent to the subnet manager and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyInFlight {
    /// When it was sent (monotonic: the watchdog's probe measures it against the timeout).
    pub since: std::time::Instant,
    /// When it was sent, Unix ns.
    pub since_unix_ns: i64,
    /// Its generation.
    pub generation: u64,
    /// The keys it carries.
    pub keys: Vec<PKey>,
}

impl ApplyInFlight {
    /// The reason an attachment waiting on this apply shows: since when, to which backend.
    pub fn reason(&self, backend: &str) -> String {
        let secs = self.since.elapsed().as_secs();
        format!(
            "waiting for the apply in flight to the subnet manager ({backend}, generation {}, \
             sent {secs}s ago)",
            self.generation
        )
    }
}

pub(super) struct Status {
    pub inventory: Option<Inventory>,
    pub sm: SmStatus,
    pub conditions: Vec<Condition>,
}

impl Status {
    pub fn new(backend: &str) -> Status {
        Status {
            inventory: None,
            sm: SmStatus {
                backend: backend.to_owned(),
                ..Default::default()
            },
            conditions: Vec::new(),
        }
    }
}

/// Everything `GetNode` reports.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// Node id.
    pub node_id: String,
    /// Fabric name.
    pub fabric: String,
    /// Every port, fabric or not.
    pub ports: Vec<PortInfo>,
    /// Tenant keys every fabric port can hold.
    pub pkey_capacity: usize,
    /// Subnet manager health.
    pub sm: SmStatus,
    /// Observer kind.
    pub observer: String,
    /// Why that observer.
    pub observer_reason: String,
    /// Attachments per state.
    pub counts: BTreeMap<AttachmentState, u64>,
    /// Oldest retained event.
    pub first_event_seq: u64,
    /// Newest event.
    pub last_event_seq: u64,
    /// The event log's epoch (32 hex digits).
    pub log_epoch: String,
    /// Standing conditions (insecure posture, a rejected partitions file, ...).
    pub conditions: Vec<Condition>,
}

/// Each key in doubt as the value the node's attachments give it: full when any attachment of
/// the key is a full member (the desired set's rule), limited when all are limited, and the
/// full value when no attachment names the key any more (only the base is known then).
pub fn in_doubt_values(keys: &[PKey], attachments: &[Attachment]) -> Vec<PKeyValue> {
    keys.iter()
        .map(|k| {
            let mut of_key = attachments
                .iter()
                .filter(|a| a.partition.pkey == *k)
                .peekable();
            let membership =
                if of_key.peek().is_some() && of_key.all(|a| a.membership == Membership::Limited) {
                    Membership::Limited
                } else {
                    Membership::Full
                };
            k.value(membership)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{InstanceId, Partition};

    fn att(id: &str, pkey: u32, membership: Membership) -> Attachment {
        Attachment {
            grant: None,
            instance_id: InstanceId::parse(id).unwrap(),
            partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", pkey).unwrap(),
            membership,
            state: AttachmentState::Releasing,
            reason: String::new(),
            created_unix_ns: 0,
            updated_unix_ns: 0,
            ports: Vec::new(),
            named_ports: false,
            restored: None,
            evidence: None,
        }
    }

    #[test]
    fn a_key_in_doubt_is_spelled_with_the_membership_its_attachments_give_it() {
        let k = |v| PKey::new(v).unwrap();
        let limited = [att("i1", 0x12, Membership::Limited)];
        let mixed = [
            att("i1", 0x12, Membership::Limited),
            att("i2", 0x12, Membership::Full),
        ];
        assert_eq!(in_doubt_values(&[k(0x12)], &limited), [PKeyValue(0x0012)]);
        assert_eq!(in_doubt_values(&[k(0x12)], &mixed), [PKeyValue(0x8012)]);
        // No attachment names it any more: full (only the base is known).
        assert_eq!(
            in_doubt_values(&[k(0x12), k(0x13)], &limited),
            [PKeyValue(0x0012), PKeyValue(0x8013)]
        );
    }
}
