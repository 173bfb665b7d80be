//! Keys as the model keeps them (base -> entry value and the port GUIDs that get it): what a
//! node's set gives, the table an SM programs from them, and their trace form.

use super::constants::{DEFAULT_ENTRY, PORT_GUID_BASE, TABLE_SIZE};
use std::collections::BTreeMap;

/// Keys by base -> the entry value (membership bit included) and the port GUIDs that get it.
pub type Keys = BTreeMap<u16, (u16, Vec<u64>)>;

/// What a node's set gives, as the model keeps it.
pub fn keys_of(desired: &fabric_agent::domain::NodeMemberships) -> Keys {
    desired
        .keys
        .iter()
        .map(|(k, s)| {
            let ports = desired.guids_for(*k).into_iter().map(|g| g.0).collect();
            (k.base(), (k.value(s.membership).0, ports))
        })
        .collect()
}

/// Whether `keys` give `base` to the port `guid`.
pub fn gives(keys: &Keys, base: u16, guid: u64) -> bool {
    keys.get(&base)
        .is_some_and(|(_, ports)| ports.contains(&guid))
}

/// The table the SM programs on port `guid` for a config: the default entry, then the keys the
/// config gives that port, then empty slots.
pub fn program_table(keys: &Keys, guid: u64) -> Vec<u16> {
    let mut t = vec![DEFAULT_ENTRY];
    t.extend(
        keys.values()
            .filter(|(_, ports)| ports.contains(&guid))
            .map(|(v, _)| *v),
    );
    t.resize(TABLE_SIZE.max(t.len()), 0);
    t.truncate(TABLE_SIZE);
    t
}

/// Formats keys as `{0x8012@[0,1], 0x0034@[1]}` (the model ports, by index, that get each).
pub fn show_keys(keys: &Keys) -> String {
    let v: Vec<String> = keys
        .values()
        .map(|(v, ports)| {
            let idx: Vec<String> = ports
                .iter()
                .map(|g| (g - PORT_GUID_BASE).to_string())
                .collect();
            format!("{v:#06x}@[{}]", idx.join(","))
        })
        .collect();
    format!("{{{}}}", v.join(", "))
}
