//! Pure comparison of two port inventories into events: P_Key table changes, port state changes
//! and keys nobody asked for.

use crate::domain::{EventKind, Inventory, PKeyValue, PortInfo};
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
}
