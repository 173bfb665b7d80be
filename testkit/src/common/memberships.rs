//! Desired memberships of one node, as the SM backends (OpenSM, UFM) take them.

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};

/// `node`'s desired memberships: its ports `guids`, each `(key, membership)` of `keys` named
/// `name(key)`.
pub fn memberships(
    node: &str,
    guids: impl IntoIterator<Item = u64>,
    keys: impl IntoIterator<Item = (u32, Membership)>,
    name: impl Fn(u32) -> String,
) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse(node)
            .unwrap_or_else(|e| panic!("{node:?}: {e}")),
        port_guids: guids.into_iter().map(Guid).collect(),
        keys: keys
            .into_iter()
            .map(|(k, membership)| {
                let key = PKey::new(k).unwrap_or_else(|e| panic!("{k:#x}: {e}"));
                (
                    key,
                    KeySetting {
                        membership,
                        name: name(k),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}
