use super::{Guid, NodeId, PKey};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Partition membership: full members talk to everyone in the partition, limited members only
/// to full members.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Membership {
    /// Bit 15 set.
    #[default]
    Full,
    /// Bit 15 clear.
    Limited,
}

impl fmt::Display for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Membership::Full => "full",
            Membership::Limited => "limited",
        })
    }
}

/// How one key should be programmed for this node's ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySetting {
    /// Full or limited.
    pub membership: Membership,
    /// The partition's name, for backends that label keys (OpenSM entry names, UFM).
    pub name: String,
    /// The port GUIDs that get this key, a subset of the set's `port_guids`; None means every
    /// one of them (whole-node attachments, and sets stored before keys named their ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<BTreeSet<Guid>>,
}

/// The complete set of keys one node wants on its fabric ports. Backends receive the whole set
/// every time (declarative), so a retry is always safe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMemberships {
    /// The node's id (validated where it is parsed, stored as its text).
    pub node_id: NodeId,
    /// Port GUIDs of the node's fabric ports.
    pub port_guids: Vec<Guid>,
    /// Every tenant key the ports should hold.
    pub keys: BTreeMap<PKey, KeySetting>,
}

impl NodeMemberships {
    /// The port GUIDs that get `key`: its own port set, or every port of the set when the key
    /// names none. Empty when the set lacks the key.
    pub fn guids_for(&self, key: PKey) -> Vec<Guid> {
        match self.keys.get(&key) {
            None => Vec::new(),
            Some(KeySetting {
                ports: Some(ports), ..
            }) => self
                .port_guids
                .iter()
                .copied()
                .filter(|g| ports.contains(g))
                .collect(),
            Some(_) => self.port_guids.clone(),
        }
    }

    /// Whether the set gives `key` to the port `guid`.
    pub fn gives(&self, key: PKey, guid: Guid) -> bool {
        self.keys.get(&key).is_some_and(|s| {
            self.port_guids.contains(&guid) && s.ports.as_ref().is_none_or(|p| p.contains(&guid))
        })
    }
}
