#![no_main]
//! Feeds arbitrary node requests (node id, port GUIDs, keys with memberships and names) to the
//! SM host's request validation. It may not panic, and a request it accepts must render into a
//! region whose file the strict parser (OpenSM's grammar) loads with exactly the requested
//! members: a validated request can never make OpenSM drop the file.

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeId, NodeMemberships, PKey};
use fabric_agent::sm::opensm::backend::validate;
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::region::{render_region, tenant_entry_name, RegionPlan, TenantEntry};
use std::collections::BTreeMap;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0xff);
    let Some(node) = parts.next() else { return };
    let Ok(node_id) = NodeId::parse(&String::from_utf8_lossy(node)) else {
        return;
    };
    let guids: Vec<Guid> = parts
        .next()
        .unwrap_or_default()
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            Guid(u64::from_be_bytes(b))
        })
        .collect();
    let mut keys = BTreeMap::new();
    for k in parts {
        if k.len() < 3 {
            continue;
        }
        let Ok(key) = PKey::new(u32::from(u16::from_be_bytes([k[0], k[1]]))) else {
            continue;
        };
        let membership = if k[2] & 1 == 0 {
            Membership::Full
        } else {
            Membership::Limited
        };
        let name = String::from_utf8_lossy(&k[3..]).into_owned();
        keys.insert(
            key,
            KeySetting {
                membership,
                name,
                ports: None,
            },
        );
    }
    let desired = NodeMemberships {
        node_id,
        port_guids: guids,
        keys,
    };
    if validate(&desired, 64).is_err() {
        return;
    }
    let mut tenants = BTreeMap::new();
    for (key, setting) in &desired.keys {
        let members: BTreeMap<Guid, Membership> = desired
            .port_guids
            .iter()
            .map(|g| (*g, setting.membership))
            .collect();
        if members.is_empty() {
            continue;
        }
        tenants.insert(
            *key,
            TenantEntry {
                name: tenant_entry_name(*key, &setting.name),
                members,
            },
        );
    }
    let plan = RegionPlan {
        default_entry: Some(Membership::Limited),
        tenants,
    };
    let region = render_region(&plan);
    let conf = parse(region.as_bytes()).expect("a validated request renders a file OpenSM loads");
    assert!(conf.has_explicit_default());
    for (key, t) in &plan.tenants {
        let got = conf
            .effective()
            .get(&key.base())
            .map_or(0, |p| p.members.len());
        assert_eq!(got, t.members.len(), "key {key}");
    }
});
