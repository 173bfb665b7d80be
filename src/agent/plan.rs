//! The reconciler's pure core: given the attachments, what the subnet manager last accepted and
//! what the ports hold, which state changes are true now. No I/O, no clock.
//!
//! The rules, strictest reading first, because a wrong RELEASED lets the cloud reuse a node that
//! can still reach another tenant:
//! - PENDING -> PROGRAMMING once the SM accepted a desired set containing the key with this
//!   membership.
//! - PROGRAMMING / DRIFTED -> ACTIVE once every fabric port is up and holds the exact entry
//!   (base and membership bit), with at least one fabric port.
//! - ACTIVE -> DRIFTED when any fabric port lacks the entry (the runner then re-applies).
//! - RELEASING -> RELEASED once the SM accepted a desired set WITHOUT the key and no fabric port
//!   holds the key's base with any membership (a DOWN port counts as not holding it: the SM
//!   reprograms a port before it can go ACTIVE again, and it no longer has the key).
//! - Nothing changes when the inventory is unknown or holds no fabric port.

use crate::domain::{Attachment, AttachmentState, Inventory, NodeMemberships, PKeyValue, PortInfo};

/// One state change the plan decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// Index into the attachments slice given to [`plan`].
    pub index: usize,
    /// The state before.
    pub from: AttachmentState,
    /// The state after.
    pub to: AttachmentState,
    /// Why, for the event and the attachment's reason.
    pub reason: String,
}

/// What the reconciler knows besides the attachments.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The last desired set the subnet manager accepted since start (None: none yet).
    pub accepted: Option<&'a NodeMemberships>,
    /// The latest port inventory with `fabric_port` marked (None: unreadable).
    pub inventory: Option<&'a Inventory>,
}

/// Decides the transitions for every attachment. Chains steps (PENDING may become ACTIVE in
/// one pass when the key is already on every port).
pub fn plan(attachments: &[Attachment], observed: Observed<'_>) -> Vec<Transition> {
    let mut out = Vec::new();
    for (index, a) in attachments.iter().enumerate() {
        let mut state = a.state;
        while let Some((to, reason)) = step(a, state, observed) {
            out.push(Transition {
                index,
                from: state,
                to,
                reason,
            });
            state = to;
        }
    }
    out
}

fn step(
    a: &Attachment,
    state: AttachmentState,
    observed: Observed<'_>,
) -> Option<(AttachmentState, String)> {
    let value = a.pkey_value();
    let accepted_with = observed.accepted.is_some_and(|set| {
        set.keys
            .get(&a.partition.pkey)
            .is_some_and(|s| s.membership == a.membership)
    });
    let accepted_without = observed
        .accepted
        .is_some_and(|set| !set.keys.contains_key(&a.partition.pkey));
    let ports = observed.inventory.map(fabric_ports).unwrap_or_default();
    let all_hold = !ports.is_empty()
        && ports
            .iter()
            .all(|p| p.state.table_counts() && p.holds(value));
    let none_hold = !ports.is_empty()
        && ports
            .iter()
            .all(|p| !p.state.table_counts() || !p.holds_base(value.base()));
    use AttachmentState::*;
    match state {
        Pending if accepted_with => Some((Programming, "subnet manager accepted the key".into())),
        Programming | Drifted if all_hold => {
            Some((Active, format!("every fabric port holds {value}")))
        }
        Active if !ports.is_empty() && !all_hold => Some((Drifted, missing(&ports, value))),
        Releasing if accepted_without && none_hold => Some((
            Released,
            format!("no fabric port holds {:#06x}", value.base()),
        )),
        _ => None,
    }
}

fn fabric_ports(inventory: &Inventory) -> Vec<&PortInfo> {
    inventory.fabric_ports().collect()
}

fn missing(ports: &[&PortInfo], value: PKeyValue) -> String {
    let lacking: Vec<String> = ports
        .iter()
        .filter(|p| !(p.state.table_counts() && p.holds(value)))
        .map(|p| format!("{}/{}", p.device, p.port_number))
        .collect();
    format!("{value} missing on {}", lacking.join(", "))
}

/// The node's desired memberships: every key an attachment in a key-wanting state asks for.
pub fn desired(
    node_id: &str,
    port_guids: Vec<crate::domain::Guid>,
    attachments: &[Attachment],
) -> NodeMemberships {
    let mut set = NodeMemberships {
        node_id: node_id.to_owned(),
        port_guids,
        keys: Default::default(),
    };
    for a in attachments.iter().filter(|a| a.state.wants_key()) {
        let entry = set
            .keys
            .entry(a.partition.pkey)
            .or_insert_with(|| crate::domain::KeySetting {
                membership: a.membership,
                name: a.partition.name.clone(),
            });
        // Two instances of one partition on a node: full wins, so neither loses reachability.
        if a.membership == crate::domain::Membership::Full {
            entry.membership = crate::domain::Membership::Full;
        }
    }
    set
}

#[cfg(test)]
mod tests;
