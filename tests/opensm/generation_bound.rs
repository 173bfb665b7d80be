//! Peers cannot strand a node at the generation bound: a peer's set above 2^53 - 2^32, or more
//! than 2^20 above this host's stored generation, is not adopted; and a node stranded before
//! (stored at 2^53 on every SM host) is recovered by `reset_stranded`, the step
//! `fabric-agent reset-node-generation` runs on each SM host with its agent stopped: after it,
//! the node's next set is accepted, its set was kept meanwhile, the other nodes are untouched,
//! and a host already reset does not take the bound-breaking generation back from a peer not
//! yet reset.

use testkit::common;

use async_trait::async_trait;
use common::memberships::memberships;
use common::sm_host::AcceptingReloader;
use fabric_agent::domain::{Membership, NodeMemberships};
use fabric_agent::sm::opensm::fabric_side::OpenSmSide;
use fabric_agent::sm::opensm::generation_bound::{
    reset_stranded, ADOPT_CEILING, NODE_GENERATION_MAX, PEER_LEAD,
};
use fabric_agent::sm::opensm::store::StoredNode;
use fabric_agent::sm::opensm::sync::{GatedStore, Peer, PeerAnswer, PeerSet, PeerSync};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
};
use fabric_agent::sm::FabricSide;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

struct ForgedPeer(Mutex<Vec<PeerSet>>);

#[async_trait]
impl Peer for ForgedPeer {
    fn name(&self) -> &str {
        "b"
    }
    async fn pull(&self, _from: &str) -> Result<PeerAnswer, String> {
        Ok(PeerAnswer {
            host: "b".into(),
            caught_up: true,
            sets: self.0.lock().unwrap().clone(),
            revocations: Vec::new(),
            ..PeerAnswer::default()
        })
    }
}

struct Host {
    file: PathBuf,
    backend: OpenSmBackend,
    sync: Arc<PeerSync>,
    side: OpenSmSide,
}

fn host(dir: &Path, store: Arc<InMemoryNodeStore>, peer: Arc<ForgedPeer>) -> Host {
    let file = dir.join("a.partitions.conf");
    if !file.exists() {
        std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    }
    let backend = OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: file.clone(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            ..OpenSmConfig::default()
        },
        "a".into(),
        Arc::new(GatedStore(store as Arc<dyn NodeMembershipStore>)),
        Arc::new(AcceptingReloader),
    )
    .unwrap();
    let sync = PeerSync::new(
        backend.clone(),
        "a".into(),
        vec![peer as Arc<dyn Peer>],
        None,
    );
    let side = OpenSmSide::new(backend.clone(), None).with_sync(Some(sync.clone()));
    Host {
        file,
        backend,
        sync,
        side,
    }
}

fn set(node: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    memberships(
        node,
        [guid],
        keys.iter().map(|k| (*k, Membership::Full)),
        |k| format!("t{k:x}"),
    )
}

fn peer_set(node: &str, guid: u64, keys: &[u32], generation: u64) -> PeerSet {
    PeerSet {
        memberships: set(node, guid, keys),
        generation,
        grants: Vec::new(),
        confirmed: true,
    }
}

fn generation(h: &Host, node: &str) -> Option<u64> {
    h.backend.node(node).map(|n| n.generation)
}

#[tokio::test]
async fn a_peer_cannot_push_a_node_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Arc::new(ForgedPeer(Mutex::new(Vec::new())));
    let a = host(dir.path(), Arc::default(), peer.clone());
    a.side
        .set_node(set("node1", 1, &[0x0a11]), &[], 5)
        .await
        .unwrap();

    // At the protocol's bound, and too far ahead of this host's 5: neither is adopted.
    *peer.0.lock().unwrap() = vec![
        peer_set("node1", 1, &[0x0a12], NODE_GENERATION_MAX),
        peer_set("node2", 2, &[0x0a21], NODE_GENERATION_MAX),
    ];
    a.sync.round().await;
    assert_eq!(generation(&a, "node1"), Some(5));
    assert_eq!(generation(&a, "node2"), None);
    *peer.0.lock().unwrap() = vec![peer_set("node1", 1, &[0x0a12], 6 + PEER_LEAD)];
    a.sync.round().await;
    assert_eq!(generation(&a, "node1"), Some(5));
    // Within the lead, and a node this host does not know at the ceiling: adopted.
    *peer.0.lock().unwrap() = vec![
        peer_set("node1", 1, &[0x0a12], 5 + PEER_LEAD),
        peer_set("node2", 2, &[0x0a21], ADOPT_CEILING),
    ];
    a.sync.round().await;
    assert_eq!(generation(&a, "node1"), Some(5 + PEER_LEAD));
    assert_eq!(generation(&a, "node2"), Some(ADOPT_CEILING));
    // node1 can still send newer generations.
    a.side
        .set_node(set("node1", 1, &[0x0a11]), &[], 6 + PEER_LEAD)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stranded_node_is_recovered_by_a_reset_on_each_host() {
    let dir = tempfile::tempdir().unwrap();
    // Stored before the bound existed: node1 at 2^53, node2 at 7.
    let store = Arc::new(InMemoryNodeStore::default());
    store
        .put_group(
            &[
                StoredNode::new(set("node1", 1, &[0x0a11]), NODE_GENERATION_MAX),
                StoredNode::new(set("node2", 2, &[0x0a21]), 7),
            ],
            None,
        )
        .unwrap();
    // The peer, not reset yet, still holds node1 at 2^53.
    let peer = Arc::new(ForgedPeer(Mutex::new(vec![peer_set(
        "node1",
        1,
        &[0x0a11],
        NODE_GENERATION_MAX,
    )])));
    {
        let a = host(dir.path(), store.clone(), peer.clone());
        // The node (its counter reset too) sends generation 1: refused as older.
        assert!(a
            .side
            .set_node(set("node1", 1, &[0x0a11]), &[], 1)
            .await
            .is_err());
    }
    // The agent is stopped; the reset.
    assert_eq!(
        reset_stranded(&*store, "node1").unwrap(),
        NODE_GENERATION_MAX
    );
    assert!(
        reset_stranded(&*store, "node2").is_err(),
        "node2 is not stranded"
    );
    let a = host(dir.path(), store.clone(), peer.clone());
    let file_before = std::fs::read_to_string(&a.file).unwrap();
    // The peer's 2^53 is not taken back.
    a.sync.round().await;
    assert_eq!(generation(&a, "node1"), Some(0));
    assert_eq!(std::fs::read_to_string(&a.file).unwrap(), file_before);
    // The node's next set is accepted; node2 kept its generation.
    a.side
        .set_node(set("node1", 1, &[0x0a11]), &[], 1)
        .await
        .unwrap();
    assert_eq!(generation(&a, "node1"), Some(1));
    assert_eq!(generation(&a, "node2"), Some(7));
    assert!(std::fs::read_to_string(&a.file).unwrap().contains("0x0a11"));
}
