//! The reconciler's pure core: given the attachments, what the node knows of the subnet manager
//! (`sm_knowledge`) and what the ports hold, which state changes are true now. No I/O, no clock.
//!
//! The rules are stated once, in the README ("When ACTIVE and RELEASED are said (the truth
//! rules)"); what the node knows of the subnet manager's side (acknowledged, in doubt) is
//! decided in `sm_knowledge`. This module adds the port-read half, per covered port, and chains
//! PENDING -> PROGRAMMING -> ACTIVE, ACTIVE -> DRIFTED and RELEASING -> RELEASED from them.

use super::sm_knowledge::SmKnowledge;
use crate::domain::{
    Attachment, AttachmentState, Evidence, Guid, Inventory, KeySetting, LinkLayer, Membership,
    NodeId, NodeMemberships, PKeyValue, PortInfo, PortReading, PortState, Restored,
};
use crate::test_mutation::{self, Mutation};
use std::collections::BTreeSet;

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

/// What the reconciler knows besides the attachments.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// What the node knows of the subnet manager: its last acknowledgement and what is in
    /// doubt.
    pub sm: &'a SmKnowledge,
    /// The latest port inventory with `fabric_port` marked (None: unreadable).
    pub inventory: Option<&'a Inventory>,
    /// Whether that read started after the subnet manager's last acknowledgement.
    pub read_after_ack: bool,
    /// When that read started, Unix nanoseconds (for the evidence).
    pub read_unix_ns: i64,
    /// Whether tenant keys may be reported ACTIVE: false while a fabric port is a full member
    /// of the default partition and the operator has not accepted that.
    pub posture_ok: bool,
    /// Covered ports missing from the read that the subnet manager, asked after that read,
    /// no longer shows (see `observe::presence`): they do not block RELEASED.
    pub gone: &'a BTreeSet<Guid>,
}

impl Observed<'_> {
    fn evidence(&self, ports: &[&PortInfo]) -> Option<Evidence> {
        let ack = self.sm.ack()?;
        Some(Evidence {
            sm_generation: ack.generation,
            sm_ack_unix_ns: ack.unix_ns,
            read_unix_ns: self.read_unix_ns,
            acknowledged_by: ack.hosts.clone(),
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

/// An attachment's covered ports as one read saw them.
struct Coverage<'a> {
    /// Every covered port's GUID.
    guids: Vec<Guid>,
    /// The covered ports the read found.
    present: Vec<&'a PortInfo>,
    /// Covered ports the read could not judge (missing, or state unknown), named.
    blocked: Vec<String>,
    /// Covered ports missing from the read and gone from the fabric, named.
    gone: Vec<String>,
}

impl<'a> Coverage<'a> {
    fn of(a: &Attachment, inventory: Option<&'a Inventory>, gone: &BTreeSet<Guid>) -> Coverage<'a> {
        let guids = a.covered_guids(inventory);
        let mut present = Vec::new();
        let mut blocked = Vec::new();
        let mut left = Vec::new();
        for g in &guids {
            match inventory.and_then(|i| i.port(*g)) {
                Some(p) if p.state != PortState::Unknown => present.push(p),
                Some(_) => blocked.push(format!(
                    "{} is in an unknown state",
                    a.port_label(*g, inventory)
                )),
                None if gone.contains(g) => left.push(a.port_label(*g, inventory)),
                None => blocked.push(format!(
                    "{} is missing from the port read",
                    a.port_label(*g, inventory)
                )),
            }
        }
        Coverage {
            guids,
            present,
            blocked,
            gone: left,
        }
    }

    /// Present, known GUIDs (those an apply can reach now).
    fn present_guids(&self) -> Vec<Guid> {
        self.present.iter().map(|p| p.port_guid).collect()
    }

    /// The present covered ports `ok` rejects (as `device/port`), then the blocked ones.
    fn lacking(&self, ok: impl Fn(&PortInfo) -> bool) -> Vec<String> {
        let mut out: Vec<String> = self
            .present
            .iter()
            .filter(|p| !ok(p))
            .map(|p| format!("{}/{}", p.device, p.port_number))
            .collect();
        out.extend(self.blocked.iter().cloned());
        out
    }

    fn all_hold(&self, value: PKeyValue) -> bool {
        self.blocked.is_empty()
            && self.gone.is_empty()
            && !self.present.is_empty()
            && self
                .present
                .iter()
                .all(|p| p.state.is_up() && p.holds(value))
    }

    fn none_hold(&self, base: u16) -> bool {
        self.blocked.is_empty()
            && !self.guids.is_empty()
            && self
                .present
                .iter()
                .all(|p| !p.state.table_counts() || !p.holds_base(base))
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
    if a.restored.is_some() {
        // Withheld: it moves once confirmed (`restore_checks`, or the control plane's attach).
        return None;
    }
    let value = a.pkey_value();
    let key = a.partition.pkey;
    let inventory = observed.inventory?;
    let cover = Coverage::of(a, Some(inventory), observed.gone);
    let fresh = observed.read_after_ack;
    use AttachmentState::*;
    match state {
        Pending
            if observed
                .sm
                .acked_with(key, a.membership, &cover.present_guids()) =>
        {
            Some((
                Programming,
                "subnet manager acknowledged the key".into(),
                None,
            ))
        }
        Programming | Drifted
            if observed.sm.acked_with(key, a.membership, &cover.guids)
                && fresh
                && cover.all_hold(value)
                && observed.posture_ok =>
        {
            Some((
                Active,
                format!("every covered port holds {value}"),
                observed.evidence(&cover.present),
            ))
        }
        Active if !cover.all_hold(value) => Some((Drifted, missing(&cover, value), None)),
        // Test-only (debug builds, `FABRIC_AGENT_TEST_MUTATION`): half (2) switched off, to
        // prove the chaos checker catches it. Never true in a release build.
        Releasing
            if observed.sm.acked_without_on(key, &cover.guids)
                && test_mutation::active(Mutation::ReleasedWithoutPortRead) =>
        {
            Some((
                Released,
                format!(
                    "TEST MUTATION {}: subnet manager acknowledged a set without {value}; the \
                     ports were not checked",
                    Mutation::ReleasedWithoutPortRead.name()
                ),
                observed.evidence(&cover.present),
            ))
        }
        Releasing
            if observed.sm.acked_without_on(key, &cover.guids)
                && fresh
                && cover.none_hold(value.base()) =>
        {
            Some((
                Released,
                format!(
                    "subnet manager acknowledged a set without {value} on the covered ports; no \
                     covered port holds it in either membership (base {:#06x}){}",
                    value.base(),
                    gone_note(&cover)
                ),
                observed.evidence(&cover.present),
            ))
        }
        _ => None,
    }
}

/// Why a RELEASING attachment's key stays on its ports: another instance of the same partition
/// still wants it on a covered port. Names those instances and ports; None when no other
/// instance holds it. This comes before the subnet manager's state: no answer from it would
/// release the key while those instances want it.
pub fn held_by_partition_mate(
    a: &Attachment,
    others: &[Attachment],
    observed: Observed<'_>,
) -> Option<String> {
    if a.state != AttachmentState::Releasing {
        return None;
    }
    let key = a.partition.pkey;
    let guids = a.covered_guids(observed.inventory);
    let mut ports = Vec::new();
    let mut holders: Vec<&str> = Vec::new();
    for g in &guids {
        let mates: Vec<&str> = others
            .iter()
            .filter(|o| {
                o.instance_id != a.instance_id
                    && o.partition.pkey == key
                    && o.wants_key()
                    && o.covered_guids(observed.inventory).contains(g)
            })
            .map(|o| o.instance_id.as_str())
            .collect();
        if !mates.is_empty() {
            ports.push(a.port_label(*g, observed.inventory));
            holders.extend(mates);
        }
    }
    holders.sort_unstable();
    holders.dedup();
    let (first, rest) = holders.split_first()?;
    let named = if rest.is_empty() {
        format!("instance {first}")
    } else {
        format!("instances {first}, {}", rest.join(", "))
    };
    Some(format!(
        "{} stays on {}: {named} of partition {} still holds it there; RELEASED once no \
         instance of the partition does",
        a.pkey_value(),
        ports.join(", "),
        a.partition.id.as_str()
    ))
}

/// What the first port read after a store rollback decides for one restored attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreCheck {
    /// Index into the attachments slice given to [`restore_checks`].
    pub index: usize,
    /// Whether every covered port holds the key: the fabric side kept it, so the attachment
    /// asks for it again as before. Otherwise it stays withheld, unconfirmed.
    pub confirmed: bool,
    /// The state it goes to (an unconfirmed one that claimed the key goes back to PENDING:
    /// the ports do not hold it and nothing asks for it).
    pub to: AttachmentState,
    /// Why, for the event and the attachment's reason.
    pub reason: String,
}

/// Decides, from the first port read after a store rollback (`inventory`), what becomes of
/// each attachment marked [`Restored::AwaitingRead`]. The read must precede any apply since the
/// rollback was found, so the ports show what the fabric side held before the restart: a key on
/// every covered port was kept there (or is wanted there by another instance); a key missing
/// from one (or on a DOWN port, whose table counts as empty) may have been released after the
/// copy was taken, and sending it would put it back.
pub fn restore_checks(attachments: &[Attachment], inventory: &Inventory) -> Vec<RestoreCheck> {
    let gone = BTreeSet::new();
    attachments
        .iter()
        .enumerate()
        .filter(|(_, a)| a.restored == Some(Restored::AwaitingRead))
        .map(|(index, a)| {
            let value = a.pkey_value();
            let cover = Coverage::of(a, Some(inventory), &gone);
            let lacking = cover.lacking(|p| p.state.table_counts() && p.holds(value));
            if lacking.is_empty() && !cover.present.is_empty() {
                return RestoreCheck {
                    index,
                    confirmed: true,
                    to: a.state,
                    reason: format!(
                        "restored from a copy of the store; every covered port still holds {value}"
                    ),
                };
            }
            RestoreCheck {
                index,
                confirmed: false,
                to: AttachmentState::Pending,
                reason: unconfirmed_reason(a, &lacking, value),
            }
        })
        .collect()
}

fn unconfirmed_reason(a: &Attachment, lacking: &[String], value: PKeyValue) -> String {
    let lacking = if lacking.is_empty() {
        "no covered port is present".to_owned()
    } else {
        format!("{value} missing on {}", lacking.join(", "))
    };
    format!(
        "the store may predate this attachment's release (restored from a copy, or an unclean \
         stop left a change unsent); {lacking} at the first read after the start: the key is \
         withheld until the control plane sends the attach of {} again (or releases it)",
        a.instance_id
    )
}

/// Why an attachment that is waiting has not moved, when the reason lies with the node rather
/// than with an unreachable subnet manager (that error is shown instead). Always `Some` (never
/// empty) for a waiting state (PENDING, PROGRAMMING, DRIFTED, RELEASING): it names what the
/// attachment waits for (the subnet manager's acknowledgement, which covered port, what the
/// subnet manager holds). None only for the other states.
/// `others` are the node's other attachments (an instance of the same partition on a covered
/// port keeps the key there).
pub fn waiting_reason(
    a: &Attachment,
    others: &[Attachment],
    observed: Observed<'_>,
) -> Option<String> {
    if !is_waiting_state(a.state) {
        return None;
    }
    Some(specific_reason(a, others, observed).unwrap_or_else(|| waits_for(a, observed)))
}

fn is_waiting_state(state: AttachmentState) -> bool {
    matches!(
        state,
        AttachmentState::Programming
            | AttachmentState::Drifted
            | AttachmentState::Releasing
            | AttachmentState::Pending
    )
}

/// What a waiting attachment that no specific rule explains waits for, spelled from the
/// subnet manager's acknowledgement and the covered ports' read (the fallback of
/// [`waiting_reason`]; the runner re-sends the set when such a wait outlasts
/// `stall::REAPPLY_AFTER`).
fn waits_for(a: &Attachment, observed: Observed<'_>) -> String {
    let value = a.pkey_value();
    let key = a.partition.pkey;
    let Some(inventory) = observed.inventory else {
        return format!("{value}: the ports could not be read; no state change until they are");
    };
    let cover = Coverage::of(a, Some(inventory), observed.gone);
    if cover.guids.is_empty() {
        return format!("{value}: no covered fabric port is present on this node");
    }
    let acked = observed.sm.ack().map(|ack| ack.generation);
    let reapply = super::stall::REAPPLY_AFTER.as_secs();
    match a.state {
        AttachmentState::Releasing => {
            let holding =
                cover.lacking(|p| !(p.state.table_counts() && p.holds_base(value.base())));
            match acked {
                Some(g) if !holding.is_empty() => format!(
                    "the subnet manager acknowledged a set without {value} (generation {g}), but covered port {} still holds it: waiting for the subnet manager's master to program the port (the set is sent again if this lasts {reapply}s)",
                    holding.join(", ")
                ),
                Some(g) => format!(
                    "the subnet manager acknowledged a set without {value} (generation {g}); waiting for a port read taken after that acknowledgement"
                ),
                None => format!(
                    "waiting for the subnet manager to acknowledge a set without {value}"
                ),
            }
        }
        _ => {
            if !observed
                .sm
                .acked_with(key, a.membership, &cover.present_guids())
            {
                return format!(
                    "waiting for the subnet manager to acknowledge a set with {value} on the covered ports{}",
                    acked.map_or_else(String::new, |g| format!(
                        " (its last acknowledged set, generation {g}, lacks it)"
                    ))
                );
            }
            let g = acked.unwrap_or_default();
            let lacking = cover.lacking(|p| p.state.is_up() && p.holds(value));
            let mut lacking = lacking;
            lacking.extend(
                cover
                    .gone
                    .iter()
                    .map(|p| format!("{p} (gone from the fabric)")),
            );
            if lacking.is_empty() {
                format!(
                    "the subnet manager acknowledged {value} (generation {g}) and every covered port holds it: waiting for a port read taken after that acknowledgement"
                )
            } else {
                format!(
                    "the subnet manager acknowledged {value} (generation {g}), but covered port {} lacks it: waiting for the subnet manager's master to program the port (the set is sent again if this lasts {reapply}s)",
                    lacking.join(", ")
                )
            }
        }
    }
}

/// Whether sending the set again may end `a`'s wait (the bounded re-apply, `stall`): it
/// waits on the fabric side, not on the node. False when a covered port is unreadable, missing
/// or (for a key wanted) down, when no covered port is present, or when another instance of
/// the partition keeps the key on a covered port.
pub fn re_apply_may_help(a: &Attachment, others: &[Attachment], observed: Observed<'_>) -> bool {
    if !is_waiting_state(a.state) || a.restored.is_some() {
        return false;
    }
    let cover = Coverage::of(a, observed.inventory, observed.gone);
    if observed.inventory.is_none() || !cover.blocked.is_empty() || cover.present.is_empty() {
        return false;
    }
    if a.state == AttachmentState::Releasing {
        return held_by_partition_mate(a, others, observed).is_none();
    }
    cover.present.iter().all(|p| p.state.is_up())
}

/// The rules that explain a wait by something specific (a blocked port read, a partition mate,
/// a key in doubt, the posture, a port down).
fn specific_reason(
    a: &Attachment,
    others: &[Attachment],
    observed: Observed<'_>,
) -> Option<String> {
    let key = a.partition.pkey;
    let cover = Coverage::of(a, observed.inventory, observed.gone);
    let waiting = matches!(
        a.state,
        AttachmentState::Programming
            | AttachmentState::Drifted
            | AttachmentState::Releasing
            | AttachmentState::Pending
    );
    if waiting && observed.inventory.is_some() && !cover.blocked.is_empty() {
        let verb = if a.state == AttachmentState::Releasing {
            "RELEASED"
        } else {
            "ACTIVE"
        };
        return Some(format!(
            "covered port {}: no {verb} until every covered port is read",
            cover.blocked.join("; ")
        ));
    }
    match a.state {
        AttachmentState::Releasing => {
            if let Some(held) = held_by_partition_mate(a, others, observed) {
                return Some(held);
            }
            (!observed.sm.acked_without_on(key, &cover.guids)).then(|| {
                format!(
                    "{} in doubt: waiting for the subnet manager to acknowledge a set without it",
                    a.pkey_value()
                )
            })
        }
        AttachmentState::Programming | AttachmentState::Drifted if !observed.posture_ok => Some(
            "a fabric port is a full member of the default partition (0xffff): tenant keys are \
             not reported ACTIVE until allow_full_default = true"
                .into(),
        ),
        AttachmentState::Programming | AttachmentState::Drifted => {
            let down: Vec<String> = cover
                .present
                .iter()
                .filter(|p| !p.state.is_up())
                .map(|p| format!("{}/{} is {:?}", p.device, p.port_number, p.state))
                .collect();
            (!down.is_empty()).then(|| {
                format!(
                    "covered port {}: no ACTIVE until every covered port is ACTIVE",
                    down.join("; ")
                )
            })
        }
        _ => None,
    }
}

fn missing(cover: &Coverage<'_>, value: PKeyValue) -> String {
    let mut lacking = cover.lacking(|p| p.state.is_up() && p.holds(value));
    lacking.extend(
        cover
            .gone
            .iter()
            .map(|g| format!("{g} (gone from the fabric)")),
    );
    format!("{value} missing on {}", lacking.join(", "))
}

/// The RELEASED reason's note on covered ports judged by the subnet manager's word.
fn gone_note(cover: &Coverage<'_>) -> String {
    if cover.gone.is_empty() {
        return String::new();
    }
    format!(
        " ({} missing here and no longer shown by the subnet manager)",
        cover.gone.join(", ")
    )
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

/// The node's desired memberships: every key an attachment in a key-wanting state asks for,
/// given to the covered ports among `port_guids` (the fabric ports read now). A key none of
/// whose covered ports is present is left out: no port could take it.
pub fn desired(
    node_id: &NodeId,
    port_guids: Vec<Guid>,
    inventory: Option<&Inventory>,
    attachments: &[Attachment],
) -> NodeMemberships {
    let mut set = NodeMemberships {
        node_id: node_id.clone(),
        port_guids,
        keys: Default::default(),
    };
    for a in attachments.iter().filter(|a| a.wants_key()) {
        let ports: BTreeSet<Guid> = a
            .covered_guids(inventory)
            .into_iter()
            .filter(|g| set.port_guids.contains(g))
            .collect();
        if ports.is_empty() {
            continue;
        }
        let entry = set
            .keys
            .entry(a.partition.pkey)
            .or_insert_with(|| KeySetting {
                membership: a.membership,
                name: a.partition.name.clone(),
                ports: Some(BTreeSet::new()),
            });
        entry.ports.get_or_insert_with(BTreeSet::new).extend(ports);
        // Two instances of one partition on a node: full wins, so neither loses reachability.
        if a.membership == Membership::Full {
            entry.membership = Membership::Full;
        }
    }
    set
}

/// The grants that justify `desired` on a fabric side that requires grants: those of the
/// attachments that want their key, whose key and membership the set carries exactly (when two
/// instances share a key with different memberships the set carries full, and only the full
/// grant justifies it). Releasing attachments carry none: releases need no grant.
pub fn grants(
    desired: &NodeMemberships,
    attachments: &[Attachment],
) -> Vec<crate::domain::SignedGrant> {
    attachments
        .iter()
        .filter(|a| a.wants_key())
        .filter_map(|a| a.grant.clone())
        .filter(|g| {
            desired
                .keys
                .get(&g.grant.pkey)
                .is_some_and(|k| k.membership == g.grant.membership)
        })
        .collect()
}

#[cfg(test)]
mod tests;
