//! Which ports a node may claim on the UFM broker, and how often a claim may read UFM's port
//! inventory for it.
//!
//! The rule is the OpenSM SM host's (`crate::sm::opensm::ownership`: channel-adapter ports
//! only): UFM must show the port as a host's port, its `description` exactly
//! [`CHANNEL_ADAPTER_PORT`] (`Computer IB Port`), in the node ([`super::super::UfmPort::belongs_to`]).
//! A switch's, a router's or gateway's port, one with no description or any other kind, is never
//! a node's.
//!
//! Each node keeps the inventory its last claim read. While that read is younger than
//! [`NODE_READ_INTERVAL`] the node's claims are judged by it without reading again (accepted or
//! refused, with the same reasons as a fresh read), so a node whose claims keep being refused
//! costs at most one full inventory read per interval, and other nodes keep their own budget. A
//! port UFM showed in the node at most that long ago counts as the node's (ports move between
//! hosts only when hardware is moved).

use super::super::UfmPort;
use crate::domain::NodeId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::time::{Duration, Instant};

/// UFM's `description` of a host's (channel adapter's) port.
pub const CHANNEL_ADAPTER_PORT: &str = "Computer IB Port";

/// How long a node's cached ports stand in for a read.
pub const NODE_READ_INTERVAL: Duration = Duration::from_secs(10);

/// Whether UFM's inventory shows `port` as a channel-adapter port of `node`.
pub fn owned_by(port: &UfmPort, node: &NodeId) -> bool {
    port.description == CHANNEL_ADAPTER_PORT && port.belongs_to(node.as_str())
}

/// One inventory read as a node's claims last used it, and when it was made.
type Read = (Instant, Arc<Vec<UfmPort>>);

/// Each node's last inventory read, with when.
#[derive(Debug, Default)]
pub struct NodeInventories {
    nodes: Mutex<BTreeMap<NodeId, Read>>,
    reads: std::sync::atomic::AtomicU64,
}

impl NodeInventories {
    /// `node`'s last read while it is younger than [`NODE_READ_INTERVAL`], and its age.
    pub fn cached(&self, node: &NodeId) -> Option<(Arc<Vec<UfmPort>>, Duration)> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let (at, ports) = nodes.get(node)?;
        let age = at.elapsed();
        (age < NODE_READ_INTERVAL).then(|| (ports.clone(), age))
    }

    /// Records a full inventory read made for `node`'s claim.
    pub fn record(&self, node: &NodeId, inventory: Arc<Vec<UfmPort>>) {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.insert(node.clone(), (Instant::now(), inventory));
    }

    /// Full inventory reads made for claims since start.
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Guid;

    fn port(guid: u64, system: &str, description: &str) -> UfmPort {
        UfmPort {
            guid: Guid(guid),
            system_name: system.into(),
            node_description: format!("{system} mlx5_0"),
            description: description.into(),
        }
    }

    #[test]
    fn only_a_hosts_channel_adapter_port_is_the_nodes() {
        let n = NodeId::try_from("node1".to_owned()).unwrap();
        assert!(owned_by(&port(1, "node1", "Computer IB Port"), &n));
        for kind in [
            "Switch IB Port",
            "Router IB Port",
            "Gateway IB Port",
            "",
            "computer ib port",
        ] {
            assert!(!owned_by(&port(1, "node1", kind), &n), "{kind:?}");
        }
        assert!(!owned_by(&port(1, "node2", "Computer IB Port"), &n));
    }

    #[tokio::test(start_paused = true)]
    async fn a_young_read_stands_in_and_an_old_one_does_not() {
        let inv = NodeInventories::default();
        let n = NodeId::try_from("node1".to_owned()).unwrap();
        assert!(inv.cached(&n).is_none());
        inv.record(&n, Arc::new(vec![port(1, "node1", "Computer IB Port")]));
        assert_eq!(inv.cached(&n).unwrap().0.len(), 1);
        let other = NodeId::try_from("node2".to_owned()).unwrap();
        assert!(inv.cached(&other).is_none(), "each node has its own");
        tokio::time::advance(NODE_READ_INTERVAL).await;
        assert!(inv.cached(&n).is_none());
        assert_eq!(inv.reads(), 1);
    }
}
