//! The reconciler's pure core: given the attachments, the subnet manager's last acknowledgement,
//! which keys earlier applies may have carried, and what the ports hold, which state changes are
//! true now. No I/O, no clock.
//!
//! The truth rules, strictest reading first, because a wrong RELEASED lets the cloud reuse a
//! node that can still reach another tenant:
//! - An apply is *acknowledged* only by a positive answer. Any other outcome leaves every key it
//!   carried *in doubt*: it may have reached the subnet manager.
//! - PENDING -> PROGRAMMING once an acknowledged apply carried the key with this membership.
//! - PROGRAMMING / DRIFTED -> ACTIVE once, besides that acknowledgement, a port read that
//!   started after it shows every fabric port up and holding the exact entry (base and
//!   membership bit), with at least one fabric port, and the node's posture allows tenant keys
//!   (no fabric port a full member of the default partition, unless the operator accepted it).
//! - ACTIVE -> DRIFTED when any fabric port lacks the entry (the runner then re-applies).
//! - RELEASING -> RELEASED once an acknowledged apply WITHOUT the key was issued after the last
//!   attempt that carried it, and a port read that started after that acknowledgement shows no
//!   fabric port holding the key's base with any membership (a DOWN port counts as not holding
//!   it: the SM reprograms a port before it can go ACTIVE again, and it no longer has the key).
//! - Nothing changes when the inventory is unknown or holds no fabric port.

use crate::domain::{
    Attachment, AttachmentState, Evidence, Inventory, KeySetting, LinkLayer, Membership, NodeId,
    NodeMemberships, PKey, PKeyValue, PortInfo, PortReading,
};
use std::collections::BTreeMap;

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
    /// For ACTIVE and RELEASED: what the claim rests on.
    pub evidence: Option<Evidence>,
}

/// The subnet manager's last positive answer in this process's life.
#[derive(Debug, Clone, Copy)]
pub struct Ack<'a> {
    /// The acknowledged apply's generation.
    pub generation: u64,
    /// The set it carried.
    pub set: &'a NodeMemberships,
    /// When the answer arrived, Unix nanoseconds (for the evidence).
    pub unix_ns: i64,
}

/// What the reconciler knows besides the attachments.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The last acknowledged apply since start (None: none yet).
    pub ack: Option<Ack<'a>>,
    /// For every key an apply may have carried: the generation of the last such attempt
    /// (acknowledged or not). Keys from before a restart count as carried just before this
    /// process's first generation.
    pub carried: &'a BTreeMap<PKey, u64>,
    /// The latest port inventory with `fabric_port` marked (None: unreadable).
    pub inventory: Option<&'a Inventory>,
    /// Whether that read started after the acknowledgement in `ack`.
    pub read_after_ack: bool,
    /// When that read started, Unix nanoseconds (for the evidence).
    pub read_unix_ns: i64,
    /// Whether tenant keys may be reported ACTIVE: false while a fabric port is a full member
    /// of the default partition and the operator has not accepted that.
    pub posture_ok: bool,
}

impl Observed<'_> {
    /// Whether an acknowledged apply carried `key` with `membership`.
    fn acked_with(&self, key: PKey, membership: Membership) -> bool {
        self.ack.is_some_and(|a| {
            a.set
                .keys
                .get(&key)
                .is_some_and(|s| s.membership == membership)
        })
    }

    /// Whether an acknowledged apply without `key` was issued after the last attempt that
    /// carried it.
    pub fn acked_without(&self, key: PKey) -> bool {
        self.ack.is_some_and(|a| {
            !a.set.keys.contains_key(&key)
                && self.carried.get(&key).is_none_or(|g| *g < a.generation)
        })
    }

    fn evidence(&self, ports: &[&PortInfo]) -> Option<Evidence> {
        let ack = self.ack?;
        Some(Evidence {
            sm_generation: ack.generation,
            sm_ack_unix_ns: ack.unix_ns,
            read_unix_ns: self.read_unix_ns,
            ports: ports
                .iter()
                .map(|p| PortReading {
                    device: p.device.clone(),
                    port_number: p.port_number,
                    port_guid: p.port_guid,
                    state: p.state,
                })
                .collect(),
        })
    }
}

/// Decides the transitions for every attachment. Chains steps (PENDING may become ACTIVE in
/// one pass when the key is already on every port).
pub fn plan(attachments: &[Attachment], observed: Observed<'_>) -> Vec<Transition> {
    let mut out = Vec::new();
    for (index, a) in attachments.iter().enumerate() {
        let mut state = a.state;
        while let Some((to, reason, evidence)) = step(a, state, observed) {
            out.push(Transition {
                index,
                from: state,
                to,
                reason,
                evidence,
            });
            state = to;
        }
    }
    out
}

type Step = (AttachmentState, String, Option<Evidence>);

fn step(a: &Attachment, state: AttachmentState, observed: Observed<'_>) -> Option<Step> {
    let value = a.pkey_value();
    let key = a.partition.pkey;
    let ports = observed.inventory.map(fabric_ports).unwrap_or_default();
    let fresh = observed.read_after_ack && !ports.is_empty();
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
        Pending if observed.acked_with(key, a.membership) => Some((
            Programming,
            "subnet manager acknowledged the key".into(),
            None,
        )),
        Programming | Drifted
            if observed.acked_with(key, a.membership)
                && fresh
                && all_hold
                && observed.posture_ok =>
        {
            Some((
                Active,
                format!("every fabric port holds {value}"),
                observed.evidence(&ports),
            ))
        }
        Active if !ports.is_empty() && !all_hold => Some((Drifted, missing(&ports, value), None)),
        Releasing if observed.acked_without(key) && fresh && none_hold => Some((
            Released,
            format!(
                "subnet manager acknowledged a set without {:#06x}; no fabric port holds it",
                value.base()
            ),
            observed.evidence(&ports),
        )),
        _ => None,
    }
}

/// Why an attachment that is waiting has not moved, when the reason lies with the node rather
/// than with an unreachable subnet manager (that error is shown instead). None when there is
/// nothing to say.
pub fn waiting_reason(a: &Attachment, observed: Observed<'_>) -> Option<String> {
    let key = a.partition.pkey;
    match a.state {
        AttachmentState::Releasing if !observed.acked_without(key) => Some(format!(
            "{:#06x} in doubt: waiting for the subnet manager to acknowledge a set without it",
            key.base()
        )),
        AttachmentState::Programming | AttachmentState::Drifted if !observed.posture_ok => Some(
            "a fabric port is a full member of the default partition (0xffff): tenant keys are \
             not reported ACTIVE until allow_full_default = true"
                .into(),
        ),
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

/// InfiniBand fabric ports that are full members of the default partition (0xFFFF), as
/// `device/port`. (On RoCE, P_Keys do not isolate tenants and 0xFFFF is the norm; the subnet
/// manager's own port, whose LID is the SM LID, must be a full member.)
pub fn full_default_ports(inventory: &Inventory) -> Vec<String> {
    inventory
        .fabric_ports()
        .filter(|p| p.link_layer == LinkLayer::Infiniband)
        // The subnet manager's own port must be a full member (OpenSM's SELF=full): on the SM
        // host that is expected, not a tenant's exposure.
        .filter(|p| !(p.lid != 0 && p.lid == p.sm_lid))
        .filter(|p| p.state.table_counts() && p.holds(PKeyValue::DEFAULT_FULL))
        .map(|p| format!("{}/{}", p.device, p.port_number))
        .collect()
}

/// The node's desired memberships: every key an attachment in a key-wanting state asks for.
pub fn desired(
    node_id: &NodeId,
    port_guids: Vec<crate::domain::Guid>,
    attachments: &[Attachment],
) -> NodeMemberships {
    let mut set = NodeMemberships {
        node_id: node_id.clone(),
        port_guids,
        keys: Default::default(),
    };
    for a in attachments.iter().filter(|a| a.state.wants_key()) {
        let entry = set
            .keys
            .entry(a.partition.pkey)
            .or_insert_with(|| KeySetting {
                membership: a.membership,
                name: a.partition.name.clone(),
            });
        // Two instances of one partition on a node: full wins, so neither loses reachability.
        if a.membership == Membership::Full {
            entry.membership = Membership::Full;
        }
    }
    set
}

/// The grants of the attachments whose keys `desired` carries: what justifies the set on a
/// fabric side that requires grants (releasing attachments carry none: releases need no grant).
pub fn grants(attachments: &[Attachment]) -> Vec<crate::domain::SignedGrant> {
    attachments
        .iter()
        .filter(|a| a.state.wants_key())
        .filter_map(|a| a.grant.clone())
        .collect()
}

#[cfg(test)]
mod tests;
