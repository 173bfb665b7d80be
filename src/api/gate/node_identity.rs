//! Which node a verified certificate speaks for on the SM host: by default a DNS SAN equal to
//! the node id or to a configured template (`{node}.nodes.fab2.example`); alternatively an
//! explicit table from typed identities to node ids.

use super::auth::{CertIdentity, ClientId, ClientIdError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The placeholder a name template must contain exactly once.
pub const NODE_PLACEHOLDER: &str = "{node}";

/// How certificate identities map to node ids.
#[derive(Debug, Clone)]
pub enum NodeMapping {
    /// A DNS SAN equal to the node id or, with a template, to the template with `{node}`
    /// replaced by the node id.
    Names {
        /// E.g. `{node}.nodes.fab2.example`.
        template: Option<String>,
    },
    /// Only these identities, each speaking for one node.
    Table(Arc<BTreeMap<ClientId, String>>),
}

impl Default for NodeMapping {
    fn default() -> Self {
        NodeMapping::Names { template: None }
    }
}

/// Why the identity -> node mapping is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeMappingError {
    /// Both a template and a table.
    #[error("set either node_name_template or [listen.tls.node_identities], not both")]
    Both,
    /// A table entry's identity does not parse.
    #[error(transparent)]
    Identity(#[from] ClientIdError),
    /// A table entry maps to an empty node id.
    #[error("{0} maps to an empty node id")]
    EmptyNode(ClientId),
    /// The template is not a DNS name holding `{node}` once.
    #[error(
        "{0:?} must be a DNS name holding {NODE_PLACEHOLDER} exactly once, e.g. \"{{node}}.nodes.fab2.example\""
    )]
    Template(String),
}

impl NodeMapping {
    /// Builds the mapping from configuration: a non-empty table wins; else the template (checked
    /// to hold `{node}` once and to look like a DNS name around it).
    pub fn from_config(
        template: Option<&str>,
        table: &BTreeMap<String, String>,
    ) -> Result<NodeMapping, NodeMappingError> {
        if !table.is_empty() {
            if template.is_some() {
                return Err(NodeMappingError::Both);
            }
            let mut map = BTreeMap::new();
            for (id, node) in table {
                let id = ClientId::parse(id)?;
                if node.is_empty() {
                    return Err(NodeMappingError::EmptyNode(id));
                }
                map.insert(id, node.clone());
            }
            return Ok(NodeMapping::Table(Arc::new(map)));
        }
        match template {
            None => Ok(NodeMapping::default()),
            Some(t) => {
                let rest = t.replacen(NODE_PLACEHOLDER, "n", 1);
                if t.matches(NODE_PLACEHOLDER).count() != 1
                    || rest.contains(['{', '}', '*', '/', ':', ' '])
                {
                    return Err(NodeMappingError::Template(t.to_owned()));
                }
                Ok(NodeMapping::Names {
                    template: Some(t.to_owned()),
                })
            }
        }
    }

    /// Whether `identity` speaks for `node`. Node ids are case-sensitive, so the node's part of
    /// a DNS SAN must equal it exactly (`NODE1` never speaks for `node1`, nor the reverse);
    /// only a template's fixed DNS labels compare case-insensitively.
    pub fn maps(&self, identity: &CertIdentity, node: &str) -> bool {
        match self {
            NodeMapping::Names { template } => identity.dns_names_as_written().any(|d| {
                d == node
                    || template
                        .as_deref()
                        .is_some_and(|t| matches_template(t, d, node))
            }),
            NodeMapping::Table(table) => identity
                .names()
                .iter()
                .any(|n| table.get(n).is_some_and(|mapped| mapped == node)),
        }
    }
}

/// Whether DNS name `d` is template `t` with `{node}` replaced by exactly `node`: the fixed
/// parts compare as DNS does (case-insensitively), the node's part byte for byte.
fn matches_template(t: &str, d: &str, node: &str) -> bool {
    let Some((pre, post)) = t.split_once(NODE_PLACEHOLDER) else {
        return false;
    };
    let mid = pre.len() + node.len();
    d.len() == mid + post.len()
        && d.get(..pre.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(pre))
        && d.get(pre.len()..mid) == Some(node)
        && d.get(mid..).is_some_and(|p| p.eq_ignore_ascii_case(post))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn identity(sans: &[&str]) -> CertIdentity {
        let p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let der = p.self_signed(&KeyPair::generate().unwrap()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        CertIdentity::verify(&[der.der().to_vec()], now).unwrap()
    }

    #[test]
    fn names_and_templates() {
        let plain = NodeMapping::default();
        assert!(plain.maps(&identity(&["node1"]), "node1"));
        assert!(!plain.maps(&identity(&["node1"]), "node2"));
        let t =
            NodeMapping::from_config(Some("{node}.nodes.fab2.example"), &BTreeMap::new()).unwrap();
        assert!(t.maps(&identity(&["node1.nodes.fab2.example"]), "node1"));
        assert!(t.maps(&identity(&["node1"]), "node1"));
        assert!(!t.maps(&identity(&["node1.nodes.fab2.example"]), "node2"));
        assert!(!t.maps(&identity(&["node1.nodes.fab2.example"]), "node1.nodes"));
        // Node ids are case-sensitive: a case variant never maps, either way round.
        assert!(!plain.maps(&identity(&["node1"]), "NODE1"));
        assert!(!plain.maps(&identity(&["NODE1"]), "node1"));
        assert!(plain.maps(&identity(&["NODE1"]), "NODE1"));
        assert!(!t.maps(&identity(&["node1.nodes.fab2.example"]), "NODE1"));
        assert!(t.maps(&identity(&["node1.NODES.fab2.example"]), "node1"));
        for bad in ["nodes.example", "{node}.{node}.x", "*.{node}.x", "{node} x"] {
            assert_eq!(
                NodeMapping::from_config(Some(bad), &BTreeMap::new()).err(),
                Some(NodeMappingError::Template(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn table_is_exclusive() {
        let table: BTreeMap<String, String> = [
            ("dns:gpu-a.example".to_owned(), "node1".to_owned()),
            ("uri:spiffe://fab2/node/2".to_owned(), "node2".to_owned()),
        ]
        .into();
        let m = NodeMapping::from_config(None, &table).unwrap();
        assert!(m.maps(&identity(&["gpu-a.example"]), "node1"));
        assert!(!m.maps(&identity(&["node1"]), "node1"));
        assert!(!m.maps(&identity(&["gpu-a.example"]), "node2"));
        assert_eq!(
            NodeMapping::from_config(Some("{node}.x"), &table).err(),
            Some(NodeMappingError::Both)
        );
        let untyped: BTreeMap<String, String> = [("gpu-a".to_owned(), "n".to_owned())].into();
        assert_eq!(
            NodeMapping::from_config(None, &untyped).err(),
            Some(NodeMappingError::Identity(ClientIdError::Untyped(
                "gpu-a".into()
            )))
        );
    }
}
