use super::{Guid, NodeId, PKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
