//! The node's standing conditions (raised, changed, cleared: one event each) and the foreign
//! P_Keys reported once per (port, key). No I/O: the runner commits the events.

use super::ports;
use crate::domain::{
    Attachment, AttachmentState, Condition, ConditionKind, EventKind, Guid, Inventory, PKeyValue,
};
use std::collections::{BTreeMap, BTreeSet};

/// What the node last reported.
pub(super) struct Conditions {
    standing: BTreeMap<ConditionKind, String>,
    foreign_reported: BTreeSet<(Guid, PKeyValue)>,
}

impl Conditions {
    /// Starts from the conditions the log last reported standing.
    pub(super) fn new(standing: BTreeMap<ConditionKind, String>) -> Conditions {
        Conditions {
            standing,
            foreign_reported: BTreeSet::new(),
        }
    }

    /// The standing conditions now: the backend's (`from_sm`) and the node's own posture.
    /// Without a port read (`full_default` None) the posture stays as last seen. `acked`: an
    /// apply was acknowledged in this life.
    pub(super) fn now(
        &self,
        from_sm: Vec<Condition>,
        full_default: Option<Vec<String>>,
        allow_full_default: bool,
        acked: bool,
    ) -> BTreeMap<ConditionKind, String> {
        let mut now: BTreeMap<ConditionKind, String> =
            from_sm.into_iter().map(|c| (c.kind, c.detail)).collect();
        let kind = ConditionKind::FullDefaultMembership;
        match full_default {
            Some(ports) if !ports.is_empty() => {
                let accepted = if allow_full_default {
                    "; accepted by allow_full_default"
                } else {
                    "; tenant keys are not reported ACTIVE until allow_full_default = true"
                };
                now.insert(
                    kind,
                    format!(
                        "{} full member of the default partition (0xffff): every tenant can reach this node{accepted}",
                        ports.join(", ")
                    ),
                );
            }
            Some(_) => {}
            None => {
                if let Some(d) = self.standing.get(&kind) {
                    now.insert(kind, d.clone());
                }
            }
        }
        // A store rollback stands until this process's first acknowledged apply: its
        // generations lie above the restored ledger's floor, so the fabric side then holds the
        // node's current set again.
        // So does an unclean stop's new epoch: whatever the lost life sent, the fabric side
        // then holds this life's set.
        for kind in [ConditionKind::StoreRolledBack, ConditionKind::UncleanStop] {
            if let (false, Some(d)) = (acked, self.standing.get(&kind)) {
                now.insert(kind, d.clone());
            }
        }
        now
    }

    /// Events for conditions raised, changed or cleared; records `now` as standing.
    pub(super) fn changes(&mut self, now: BTreeMap<ConditionKind, String>) -> Vec<EventKind> {
        let mut events = Vec::new();
        for (kind, detail) in &now {
            // Logged once, when the event commits (`Agent::log_event`).
            if self.standing.get(kind) != Some(detail) {
                events.push(EventKind::ConditionChanged {
                    condition: *kind,
                    active: true,
                    detail: detail.clone(),
                });
            }
        }
        for (kind, detail) in &self.standing {
            if !now.contains_key(kind) {
                events.push(EventKind::ConditionChanged {
                    condition: *kind,
                    active: false,
                    detail: detail.clone(),
                });
            }
        }
        self.standing = now;
        events
    }

    /// The standing conditions, for the node's status.
    pub(super) fn standing(&self) -> Vec<Condition> {
        self.standing
            .iter()
            .map(|(kind, detail)| Condition {
                kind: *kind,
                detail: detail.clone(),
            })
            .collect()
    }

    /// Before this life's first acknowledgement, the subnet manager holding a newer generation
    /// (`stored`) than the one `sent` proves the store lost writes: the detail of the
    /// `STORE_ROLLED_BACK` condition to raise, or None when it already stands. Call
    /// [`Conditions::raised`] once its event is committed.
    pub(super) fn rolled_back(&self, sent: u64, stored: u64) -> Option<String> {
        (!self.standing.contains_key(&ConditionKind::StoreRolledBack)).then(|| {
            format!("the subnet manager holds generation {stored} of this node, newer than any the store sent ({sent}): the store lost writes (restored or replaced), or another agent uses this node id")
        })
    }

    /// Records a condition raised outside a pass (its event committed).
    pub(super) fn raised(&mut self, kind: ConditionKind, detail: String) {
        self.standing.insert(kind, detail);
    }

    /// `FOREIGN_PKEY` events for keys on fabric ports that no live attachment asked for, each
    /// (port, key) once while it stays.
    pub(super) fn foreign(
        &mut self,
        inv: &Inventory,
        attachments: &[Attachment],
    ) -> Vec<EventKind> {
        let known: BTreeSet<u16> = attachments
            .iter()
            .filter(|a| a.state != AttachmentState::Released)
            .map(|a| a.partition.pkey.base())
            .collect();
        let mut events = Vec::new();
        let mut seen = BTreeSet::new();
        for (port, key) in ports::foreign_keys(inv, &known) {
            seen.insert((port.port_guid, key));
            if !self.foreign_reported.contains(&(port.port_guid, key)) {
                tracing::warn!(device = %port.device, port = port.port_number, pkey = %key, "foreign P_Key on a fabric port");
                events.push(EventKind::ForeignPKey {
                    device: port.device.clone(),
                    port_number: port.port_number,
                    port_guid: port.port_guid,
                    pkey_value: key,
                });
            }
        }
        self.foreign_reported = seen;
        events
    }
}
