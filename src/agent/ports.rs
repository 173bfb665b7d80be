//! Pure comparison of two port inventories into events: P_Key table changes, port state changes
//! and keys nobody asked for; and which covered ports missing from a read the subnet manager no
//! longer shows.

use crate::domain::{Attachment, AttachmentState, EventKind, Guid, Inventory, PKeyValue, PortInfo};
use crate::observe::{PortObserver, Presence};
use std::collections::BTreeSet;

/// Events describing how `next` differs from `prev` (None: first inventory, nothing to compare).
pub fn changes(prev: Option<&Inventory>, next: &Inventory) -> Vec<EventKind> {
    let Some(prev) = prev else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for port in &next.ports {
        let Some(old) = prev.ports.iter().find(|p| same_port(p, port)) else {
            continue;
        };
        if old.state != port.state {
            out.push(EventKind::PortStateChanged {
                device: port.device.clone(),
                port_number: port.port_number,
                port_guid: port.port_guid,
                from: old.state,
                to: port.state,
            });
        }
        let before: BTreeSet<PKeyValue> = old.entries().collect();
        let after: BTreeSet<PKeyValue> = port.entries().collect();
        if before != after {
            out.push(EventKind::PKeyTableChanged {
                device: port.device.clone(),
                port_number: port.port_number,
                port_guid: port.port_guid,
                added: after.difference(&before).copied().collect(),
                removed: before.difference(&after).copied().collect(),
            });
        }
    }
    out
}

fn same_port(a: &PortInfo, b: &PortInfo) -> bool {
    a.device == b.device && a.port_number == b.port_number
}

/// Tenant keys on fabric ports whose base no attachment accounts for (`known` holds the bases of
/// attachments that want or are releasing a key), as (port, entry) pairs.
pub fn foreign_keys<'a>(
    inventory: &'a Inventory,
    known: &'a BTreeSet<u16>,
) -> impl Iterator<Item = (&'a PortInfo, PKeyValue)> + 'a {
    inventory.fabric_ports().flat_map(move |p| {
        p.entries()
            .filter(|k| k.tenant_key().is_some() && !known.contains(&k.base()))
            .map(move |k| (p, k))
    })
}

/// The covered ports of RELEASING attachments that `inventory` misses and that the subnet
/// manager, asked now (after the read), provably no longer shows. Asks nothing when no such
/// port is missing. A port the SA cannot be asked about is left out: it keeps blocking RELEASED.
pub async fn gone_from_fabric(
    observer: &dyn PortObserver,
    inventory: &Inventory,
    attachments: &[Attachment],
) -> BTreeSet<Guid> {
    let missing: Vec<Guid> = missing_covered(inventory, attachments)
        .into_iter()
        .collect();
    if missing.is_empty() {
        return BTreeSet::new();
    }
    let answers = observer.fabric_presence(&missing).await;
    let mut gone = BTreeSet::new();
    for (guid, answer) in missing.into_iter().zip(answers) {
        match answer {
            Presence::Gone => {
                gone.insert(guid);
            }
            Presence::Shown => {}
            Presence::Unknown(why) => {
                tracing::debug!(port_guid = %guid, %why, "a missing covered port stays blocking");
            }
        }
    }
    gone
}

/// GUIDs covered by RELEASING attachments and absent from `inventory`.
fn missing_covered(inventory: &Inventory, attachments: &[Attachment]) -> BTreeSet<Guid> {
    attachments
        .iter()
        .filter(|a| a.state == AttachmentState::Releasing)
        .flat_map(|a| a.covered_guids(Some(inventory)))
        .filter(|g| inventory.port(*g).is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Guid, PortState};

    fn port(state: PortState, keys: &[u16]) -> PortInfo {
        PortInfo {
            device: "d".into(),
            port_number: 1,
            port_guid: Guid(7),
            state,
            pkeys: keys.iter().map(|k| PKeyValue(*k)).collect(),
            fabric_port: true,
            ..Default::default()
        }
    }

    #[test]
    fn reports_table_and_state_changes() {
        let a = Inventory {
            ports: vec![port(PortState::Active, &[0xFFFF, 0x8001, 0])],
        };
        let b = Inventory {
            ports: vec![port(PortState::Down, &[0xFFFF, 0x8002, 0])],
        };
        assert!(changes(None, &a).is_empty());
        assert!(changes(Some(&a), &a).is_empty());
        let ev = changes(Some(&a), &b);
        assert_eq!(ev.len(), 2);
        assert!(
            matches!(&ev[1], EventKind::PKeyTableChanged { added, removed, .. }
            if added == &[PKeyValue(0x8002)] && removed == &[PKeyValue(0x8001)])
        );
    }

    #[test]
    fn foreign_keys_skip_default_and_known() {
        let inv = Inventory {
            ports: vec![port(PortState::Active, &[0xFFFF, 0x8001, 0x0005, 0])],
        };
        let known = BTreeSet::from([0x0001]);
        let f: Vec<PKeyValue> = foreign_keys(&inv, &known).map(|(_, k)| k).collect();
        assert_eq!(f, vec![PKeyValue(0x0005)]);
    }

    /// An observer whose SA says `gone` are gone, `shown` shown, anything else unknown; it
    /// records what it was asked.
    struct Sa {
        gone: Vec<Guid>,
        shown: Vec<Guid>,
        asked: std::sync::Mutex<Vec<Guid>>,
    }

    #[async_trait::async_trait]
    impl PortObserver for Sa {
        fn kind(&self) -> &'static str {
            "test"
        }
        async fn inventory(&self) -> Result<Inventory, crate::observe::ObserveError> {
            Ok(Inventory::default())
        }
        async fn changed(&self, _pending: bool) {}
        async fn fabric_presence(&self, guids: &[Guid]) -> Vec<Presence> {
            self.asked.lock().unwrap().extend_from_slice(guids);
            guids
                .iter()
                .map(|g| {
                    if self.gone.contains(g) {
                        Presence::Gone
                    } else if self.shown.contains(g) {
                        Presence::Shown
                    } else {
                        Presence::Unknown("no answer".into())
                    }
                })
                .collect()
        }
    }

    fn covering(instance: &str, state: AttachmentState, guids: &[u64]) -> Attachment {
        Attachment::on_named_ports(instance, 0x12, state, guids)
    }

    #[tokio::test]
    async fn only_missing_ports_of_releasing_attachments_are_asked_and_only_gone_ones_count() {
        let sa = Sa {
            gone: vec![Guid(8), Guid(9)],
            shown: vec![Guid(10)],
            asked: Default::default(),
        };
        let inv = Inventory {
            ports: vec![port(PortState::Active, &[0xFFFF])],
        };
        let attachments = [
            // Port 7 is read; 8 (gone), 10 (shown) and 11 (no answer) are missing.
            covering("x", AttachmentState::Releasing, &[7, 8, 10, 11]),
            // An ACTIVE attachment's missing port is not asked about: it blocks ACTIVE anyway.
            covering("y", AttachmentState::Active, &[9]),
        ];
        let gone = gone_from_fabric(&sa, &inv, &attachments).await;
        assert_eq!(gone, BTreeSet::from([Guid(8)]));
        assert_eq!(*sa.asked.lock().unwrap(), vec![Guid(8), Guid(10), Guid(11)]);

        // Nothing missing: the SA is not asked at all.
        sa.asked.lock().unwrap().clear();
        let present = [covering("x", AttachmentState::Releasing, &[7])];
        assert!(gone_from_fabric(&sa, &inv, &present).await.is_empty());
        assert!(sa.asked.lock().unwrap().is_empty());
    }
}
