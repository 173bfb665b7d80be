//! A node's identity and the rules a node's desired set must satisfy, in one place for every
//! side that reads one: the agent's configuration, the SM host's `fabric.sm.v1` service and its
//! OpenSM backend.

use super::{validate_label, DomainError, LabelRules, NodeMemberships};
use serde::{Deserialize, Serialize};
use std::fmt;

const NODE_ID_RULES: LabelRules = LabelRules {
    max_len: 128,
    punctuation: "._:-",
};

/// A node's id: 1-128 characters `[A-Za-z0-9._:-]`, starting with a letter or digit. Stored
/// and sent as its text; deserializing validates it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl TryFrom<String> for NodeId {
    type Error = DomainError;

    fn try_from(s: String) -> Result<Self, DomainError> {
        validate_label("node_id", &s, NODE_ID_RULES)?;
        Ok(NodeId(s))
    }
}

impl From<NodeId> for String {
    fn from(id: NodeId) -> String {
        id.0
    }
}

impl std::borrow::Borrow<str> for NodeId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl NodeId {
    /// Validates a node id.
    pub fn parse(s: &str) -> Result<Self, DomainError> {
        validate_label("node_id", s, NODE_ID_RULES)?;
        Ok(NodeId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest key name (an OpenSM partition name, a UFM partition label): OpenSM keeps partition
/// names in a 32-byte buffer, so 31 characters survive.
pub const KEY_NAME_MAX: usize = 31;

/// Whether `name` may name a key: 1-31 characters `[A-Za-z0-9_.-]`.
pub fn is_safe_key_name(name: &str) -> bool {
    (1..=KEY_NAME_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl NodeMemberships {
    /// Most port GUIDs one node may list.
    pub const MAX_PORTS: usize = 64;

    /// Checks the set on its own (the node id is valid by construction): at most [`NodeMemberships::MAX_PORTS`] distinct
    /// non-zero port GUIDs, and key names (empty, or [`is_safe_key_name`]).
    pub fn validate(&self) -> Result<(), DomainError> {
        if self.port_guids.len() > Self::MAX_PORTS {
            return Err(DomainError::invalid(
                "port_guids",
                format!(
                    "{} port GUIDs, at most {}",
                    self.port_guids.len(),
                    Self::MAX_PORTS
                ),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.port_guids {
            if g.0 == 0 {
                return Err(DomainError::invalid(
                    "port_guids",
                    "port GUID 0 is not a port",
                ));
            }
            if !seen.insert(*g) {
                return Err(DomainError::invalid(
                    "port_guids",
                    format!("port GUID {g} listed twice"),
                ));
            }
        }
        for (key, s) in &self.keys {
            if let Some(g) = s
                .ports
                .iter()
                .flatten()
                .find(|g| !self.port_guids.contains(g))
            {
                return Err(DomainError::invalid(
                    "keys",
                    format!("key {key}: port {g} is not one of the set's port_guids"),
                ));
            }
            if !s.name.is_empty() && !is_safe_key_name(&s.name) {
                return Err(DomainError::invalid(
                    "keys",
                    format!(
                        "key {key}: name {:?} must be 1-{KEY_NAME_MAX} characters [A-Za-z0-9_.-]",
                        s.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Guid, KeySetting, Membership, PKey};

    fn set(guids: &[u64], name: &str) -> NodeMemberships {
        NodeMemberships {
            node_id: NodeId::parse("node-1").unwrap(),
            port_guids: guids.iter().map(|g| Guid(*g)).collect(),
            keys: [(
                PKey::new(0x10).unwrap(),
                KeySetting {
                    membership: Membership::Full,
                    name: name.into(),
                    ports: None,
                },
            )]
            .into(),
        }
    }

    #[test]
    fn node_ids_follow_one_rule() {
        assert_eq!(
            NodeId::parse("node-1.a:b_c").unwrap().as_str(),
            "node-1.a:b_c"
        );
        for bad in ["", "-n", "n/1", "n 1", &"n".repeat(129)] {
            let e = NodeId::parse(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    DomainError::Invalid {
                        field: "node_id",
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sets_validate_ids_guids_and_names() {
        assert_eq!(set(&[1, 2], "t1").validate(), Ok(()));
        assert_eq!(set(&[], "").validate(), Ok(()));
        let field = |m: NodeMemberships| match m.validate() {
            Err(DomainError::Invalid { field, .. }) => field,
            Ok(()) => panic!("{m:?} must be refused"),
        };
        assert_eq!(field(set(&[0], "")), "port_guids");
        assert_eq!(field(set(&[1, 1], "")), "port_guids");
        let many: Vec<u64> = (1..=65).collect();
        assert_eq!(field(set(&many, "")), "port_guids");
        assert_eq!(field(set(&[1], "bad name")), "keys");
        assert_eq!(field(set(&[1], &"n".repeat(32))), "keys");
        let mut outside = set(&[1, 2], "t1");
        let only = |s: &mut NodeMemberships, g: &[u64]| {
            for k in s.keys.values_mut() {
                k.ports = Some(g.iter().map(|g| Guid(*g)).collect());
            }
        };
        only(&mut outside, &[2]);
        assert_eq!(outside.validate(), Ok(()));
        let key = PKey::new(0x10).unwrap();
        assert_eq!(outside.guids_for(key), vec![Guid(2)]);
        assert!(outside.gives(key, Guid(2)) && !outside.gives(key, Guid(1)));
        only(&mut outside, &[3]);
        assert_eq!(field(outside), "keys");
    }

    #[test]
    fn stored_sets_keep_their_json_and_ids_are_checked_on_load() {
        let m = set(&[1], "storage");
        let json = serde_json::to_value(&m).unwrap();
        // The node id is stored as plain text, as before it was typed.
        assert_eq!(json["node_id"], serde_json::json!("node-1"));
        assert_eq!(
            serde_json::from_value::<NodeMemberships>(json.clone()).unwrap(),
            m
        );
        let mut bad = json;
        bad["node_id"] = serde_json::json!("node 1");
        assert!(serde_json::from_value::<NodeMemberships>(bad).is_err());
    }
}
