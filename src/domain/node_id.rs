//! A node's id: the name the control plane and the SM host know this node by.

use super::ident::{validate_label, LabelRules};
use super::DomainError;
use serde::{Deserialize, Serialize};
use std::fmt;

const NODE_ID_RULES: LabelRules = LabelRules {
    max_len: 128,
    punctuation: "._:-",
};

/// A node id: 1-128 characters `[A-Za-z0-9._:-]`, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(String);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_follow_the_label_rules() {
        assert_eq!(
            NodeId::parse("gpu-17.rack:a").unwrap().as_str(),
            "gpu-17.rack:a"
        );
        for bad in ["", "-a", "a b", "a/b", &"n".repeat(129)] {
            assert!(NodeId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
