//! The delete guard: may this partition be deleted?
//!
//! Yes only when (1) every instance the control plane attached in the partition through this
//! client (the attach ledger) is RELEASED on its node, and (2) the fabric's own view
//! (`ListPartitionMembers` on every SM host configured for the partition's fabric) holds none of
//! those nodes' ports in the partition's P_Key. Otherwise No with every blocker. When the fabric
//! side cannot be read and the nodes alone do not already say No, there is no answer
//! ([`GuardError`]): a guard that cannot see the fabric never says Yes.

use crate::store::AttachRecord;
use crate::view::{state_name, View};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One reason a partition may not be deleted yet.
#[derive(Debug, Clone, PartialEq)]
pub enum Blocker {
    /// An instance attached through this client is not RELEASED on its node.
    Instance {
        /// The instance.
        instance_id: String,
        /// Its node.
        node_id: String,
        /// The node's last reported state (`ACTIVE`, ...); `RE-ATTACHED (not seen since)` when
        /// the only RELEASED known predates the attach; or `UNKNOWN` when the node never
        /// reported this instance (attach not seen yet, or its state directory was wiped).
        state: String,
        /// When the node reported that state (ms since the Unix epoch).
        since_ms: Option<u64>,
        /// The node's last reason for it.
        last_error: String,
        /// Since when the node's follower cannot reach it.
        unreachable_since_ms: Option<u64>,
        /// Events the follower has not applied yet.
        lag: u64,
    },
    /// The fabric's own view still holds a port of an attached node in the P_Key.
    FabricHolds {
        /// The port.
        port_guid: String,
        /// The node that port belongs to (from this client's view).
        node_id: String,
        /// P_Key base.
        pkey: u32,
        /// The fabric.
        fabric: String,
        /// Where the SM host read it (`sa`, `ufm`).
        source: String,
    },
}

fn ms(v: Option<u64>) -> String {
    crate::view::time_text(v)
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::Instance {
                instance_id,
                node_id,
                state,
                since_ms,
                last_error,
                unreachable_since_ms,
                lag,
            } => {
                write!(
                    f,
                    "instance {instance_id} on node {node_id} is {state} since {}",
                    ms(*since_ms)
                )?;
                if !last_error.is_empty() {
                    write!(f, "; last error: {last_error}")?;
                }
                if unreachable_since_ms.is_some() {
                    write!(f, "; node unreachable since {}", ms(*unreachable_since_ms))?;
                }
                if *lag > 0 {
                    write!(f, "; {lag} events not yet applied")?;
                }
                Ok(())
            }
            Blocker::FabricHolds {
                port_guid,
                node_id,
                pkey,
                fabric,
                source,
            } => write!(
                f,
                "fabric {fabric} still holds port {port_guid} (node {node_id}) in {pkey:#06x} \
                 (SM host view, source {source})"
            ),
        }
    }
}

/// The guard's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Every attached instance is RELEASED and the fabric holds none of their ports.
    Yes,
    /// Not yet: every blocker found.
    No(Vec<Blocker>),
}

/// Why the guard could not answer.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The store failed (ledger unreadable, or view records not written).
    #[error("fleet store: {0}")]
    Store(String),
    /// No SM host is configured for the fabric.
    #[error("no [[sm_host]] is configured for fabric {0}: the fabric's own view cannot be read")]
    NoSmHost(String),
    /// An SM host did not answer ListPartitionMembers.
    #[error("SM host for fabric {fabric} ({endpoint}): {message}")]
    Fabric {
        /// The fabric.
        fabric: String,
        /// Which SM host.
        endpoint: String,
        /// The status.
        message: String,
    },
}

/// What the fabric side must be asked: (fabric, P_Key base) -> the ports to look for, each
/// with its node.
pub type FabricQuestions = BTreeMap<(String, u32), BTreeMap<String, String>>;

/// The node side of the guard (pure): blockers, and the fabric questions to ask.
pub fn node_side(attaches: &[AttachRecord], view: &View) -> (Vec<Blocker>, FabricQuestions) {
    let mut blockers = Vec::new();
    let mut questions: FabricQuestions = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for a in attaches {
        if !seen.insert((&a.node_id, &a.instance_id)) {
            continue;
        }
        let node = view.nodes.get(&a.node_id);
        let ports = questions.entry((a.fabric.clone(), a.pkey)).or_default();
        if let Some(n) = node {
            for p in &n.durable.ports {
                ports.insert(p.clone(), a.node_id.clone());
            }
        }
        let instance = node.and_then(|n| n.durable.instances.get(&a.instance_id));
        let stale = |i: &crate::view::InstanceView| {
            a.released_before.as_ref() == Some(&(i.epoch.clone(), i.seq))
        };
        if instance.is_some_and(|i| i.released() && !stale(i)) {
            continue;
        }
        blockers.push(Blocker::Instance {
            instance_id: a.instance_id.clone(),
            node_id: a.node_id.clone(),
            state: match instance {
                Some(i) if stale(i) => "RE-ATTACHED (not seen since)".to_owned(),
                Some(i) => state_name(i.state).to_owned(),
                None => "UNKNOWN".to_owned(),
            },
            since_ms: instance.map(|i| i.since_ms),
            last_error: instance.map(|i| i.last_error.clone()).unwrap_or_default(),
            unreachable_since_ms: node.and_then(|n| n.live.unreachable_since_ms),
            lag: node.map_or(0, |n| n.lag()),
        });
    }
    (blockers, questions)
}

/// The fabric side of the guard (pure): which of `ports` the fabric's members list holds.
pub fn fabric_side(
    fabric: &str,
    pkey: u32,
    ports: &BTreeMap<String, String>,
    members: &[crate::proto::sm::PartitionMember],
    source: &str,
) -> Vec<Blocker> {
    let mut out = Vec::new();
    for m in members {
        let guid = m.port_guid.to_ascii_lowercase();
        if let Some(node) = ports.get(&guid) {
            out.push(Blocker::FabricHolds {
                port_guid: guid,
                node_id: node.clone(),
                pkey,
                fabric: fabric.to_owned(),
                source: source.to_owned(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::agent::AttachmentState;
    use crate::proto::sm::PartitionMember;
    use crate::view::{InstanceView, NodeView};

    fn attach(node: &str, instance: &str) -> AttachRecord {
        AttachRecord {
            node_id: node.into(),
            instance_id: instance.into(),
            partition_id: "ibpart_a".into(),
            fabric: "f".into(),
            pkey: 0x10,
            grant_id: "g".into(),
            recorded_at_ms: 0,
            released_before: None,
        }
    }

    fn node(instance: &str, state: AttachmentState, port: &str) -> NodeView {
        let mut n = NodeView::default();
        n.durable.ports.insert(port.into());
        n.durable.instances.insert(
            instance.into(),
            InstanceView {
                instance_id: instance.into(),
                partition_id: "ibpart_a".into(),
                pkey_value: 0x8010,
                state: state as i32,
                since_ms: 5,
                last_error: "sm down".into(),
                epoch: "e".into(),
                seq: 4,
            },
        );
        n
    }

    #[test]
    fn every_unreleased_or_unknown_instance_blocks() {
        let mut view = View::default();
        view.nodes
            .insert("n1".into(), node("i1", AttachmentState::Released, "0x1"));
        view.nodes
            .insert("n2".into(), node("i2", AttachmentState::Releasing, "0x2"));
        let (b, q) = node_side(
            &[attach("n1", "i1"), attach("n2", "i2"), attach("n3", "i3")],
            &view,
        );
        assert_eq!(b.len(), 2);
        assert!(
            b[0].to_string().contains("i2 on node n2 is RELEASING"),
            "{}",
            b[0]
        );
        assert!(b[0].to_string().contains("sm down"));
        assert!(
            b[1].to_string().contains("i3 on node n3 is UNKNOWN"),
            "{}",
            b[1]
        );
        let ports = &q[&("f".to_owned(), 0x10)];
        assert_eq!(ports.len(), 2);
        let members = [PartitionMember {
            port_guid: "0x1".into(),
            node_id: String::new(),
            full: true,
        }];
        let f = fabric_side("f", 0x10, ports, &members, "sa");
        assert_eq!(f.len(), 1);
        assert!(f[0]
            .to_string()
            .contains("still holds port 0x1 (node n1) in 0x0010"));
    }

    #[test]
    fn a_release_seen_before_a_re_attach_does_not_count_for_it() {
        let mut view = View::default();
        view.nodes
            .insert("n1".into(), node("i1", AttachmentState::Released, "0x1"));
        let mut again = attach("n1", "i1");
        again.released_before = Some(("e".into(), 4));
        let (b, _) = node_side(std::slice::from_ref(&again), &view);
        assert!(b[0].to_string().contains("RE-ATTACHED"), "{}", b[0]);
        // A newer RELEASED (another seq) counts.
        let n1 = view.nodes.get_mut("n1").unwrap();
        n1.durable.instances.get_mut("i1").unwrap().seq = 9;
        assert!(node_side(&[again], &view).0.is_empty());
    }
}
