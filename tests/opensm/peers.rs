//! Anti-entropy between SM hosts, in process (two OpenSM backends on their own files, reloads
//! accepted, grants required): a set learned from a peer is judged by this host (the forwarded
//! grant verified with its own keys), so a peer cannot put in a key the control plane never
//! granted, nor one signed by another key; per node the highest generation wins; a restarted
//! host holds back every stored set (its file has none of their keys) until a caught-up peer or
//! the node confirms it, and a set released while it was down never comes back. A revocation on
//! one host reaches the others by the same pull (a host down during it included): the revoked
//! key leaves their files, and a set still carrying the revoked grant is refused there too. The
//! fabric-level story (two OpenSMs, failover, smpquery) is tests/opensm/ha.rs.

use testkit::common;

use async_trait::async_trait;
use common::grants::{grant, GrantSigner};
use common::memberships::memberships;
use common::sm_host::AcceptingReloader;
use fabric_agent::api::grant_v1::signed_grant_from_proto;
use fabric_agent::domain::{
    FabricName, GrantKey, GrantKeys, GrantPolicy, Membership, NodeMemberships, SignedGrant,
};
use fabric_agent::sm::opensm::fabric_side::OpenSmSide;
use fabric_agent::sm::opensm::sync::{GatedStore, Peer, PeerAnswer, PeerSet, PeerSync};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
};
use fabric_agent::sm::FabricSide;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const KEY: u32 = 0x0a11;

/// One SM host: its file, store, backend, sync and service side.
struct Host {
    file: PathBuf,
    store: Arc<InMemoryNodeStore>,
    backend: OpenSmBackend,
    sync: Arc<PeerSync>,
    side: OpenSmSide,
}

/// A peer answering with another host's sync, or with a fixed (forged) answer.
struct TestPeer {
    name: String,
    real: Mutex<Option<Arc<PeerSync>>>,
    forged: Mutex<Option<PeerAnswer>>,
}

#[async_trait]
impl Peer for TestPeer {
    fn name(&self) -> &str {
        &self.name
    }
    async fn pull(&self, from: &str) -> Result<PeerAnswer, String> {
        if let Some(a) = self.forged.lock().unwrap().clone() {
            return Ok(a);
        }
        match self.real.lock().unwrap().as_ref() {
            Some(s) => Ok(s.answer(from)),
            None => Err("unreachable".into()),
        }
    }
}

fn test_peer(name: &str) -> Arc<TestPeer> {
    Arc::new(TestPeer {
        name: name.into(),
        real: Mutex::new(None),
        forged: Mutex::new(None),
    })
}

fn host(
    dir: &Path,
    name: &str,
    store: Arc<InMemoryNodeStore>,
    signer: &GrantSigner,
    peer: Arc<TestPeer>,
) -> Host {
    let file = dir.join(format!("{name}.partitions.conf"));
    if !file.exists() {
        std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    }
    let key = fabric_agent::config::decode_public_key(&signer.id, &signer.public_b64()).unwrap();
    let backend = OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: file.clone(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            grants: Some(GrantPolicy {
                require: true,
                fabric: FabricName::parse("fab1").unwrap(),
                keys: GrantKeys::new([key as GrantKey]).unwrap(),
            }),
            ..OpenSmConfig::default()
        },
        name.into(),
        Arc::new(GatedStore(store.clone() as Arc<dyn NodeMembershipStore>)),
        Arc::new(AcceptingReloader),
    )
    .unwrap();
    let sync = PeerSync::new(
        backend.clone(),
        name.into(),
        vec![peer as Arc<dyn Peer>],
        None,
    );
    let side = OpenSmSide::new(backend.clone(), None).with_sync(Some(sync.clone()));
    Host {
        file,
        store,
        backend,
        sync,
        side,
    }
}

/// Hosts `a` and `b` (`b` on `store_b`), each pulling the other; and the peers `a` and `b`
/// pull through (to b, to a).
fn pair(
    dir: &Path,
    signer: &GrantSigner,
    store_b: Arc<InMemoryNodeStore>,
) -> (Host, Host, Arc<TestPeer>, Arc<TestPeer>) {
    let (to_b, to_a) = (test_peer("b"), test_peer("a"));
    let a = host(dir, "a", Arc::default(), signer, to_b.clone());
    let b = host(dir, "b", store_b, signer, to_a.clone());
    *to_b.real.lock().unwrap() = Some(b.sync.clone());
    *to_a.real.lock().unwrap() = Some(a.sync.clone());
    (a, b, to_b, to_a)
}

fn set(node: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    memberships(
        node,
        [guid],
        keys.iter().map(|k| (*k, Membership::Full)),
        |k| format!("t{k:x}"),
    )
}

fn signed(s: &GrantSigner, id: &str, node: &str, key: u32) -> SignedGrant {
    signed_grant_from_proto(&s.sign(&grant(id, "fab1", node, "i-1", key, Membership::Full)))
        .unwrap()
}

fn file_has(h: &Host, key: u32) -> bool {
    std::fs::read_to_string(&h.file)
        .unwrap()
        .contains(&format!("{key:#06x}"))
}

#[tokio::test]
async fn a_peer_set_is_judged_here_and_the_highest_generation_wins() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let (a, b, to_b, _) = pair(dir.path(), &cp, Arc::default());

    // node1's set reaches B only; A learns it from B, the grant verified here.
    let g = signed(&cp, "g1", "node1", KEY);
    b.side
        .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g), 3)
        .await
        .unwrap();
    a.sync.round().await;
    assert_eq!(a.backend.node("node1").unwrap().generation, 3);
    assert!(file_has(&a, KEY));
    assert!(a.sync.status().caught_up);

    // A forged answer: a key with no grant, and one with a grant signed by another key, for
    // node2; an older generation of node1 without its key. None of it is taken.
    let rogue = GrantSigner::new("cp");
    *to_b.forged.lock().unwrap() = Some(PeerAnswer {
        host: "b".into(),
        caught_up: true,
        sets: vec![
            PeerSet {
                memberships: set("node2", 2, &[0x0a22]),
                generation: 9,
                grants: Vec::new(),
                confirmed: true,
            },
            PeerSet {
                memberships: set("node3", 3, &[0x0a33]),
                generation: 9,
                grants: vec![signed(&rogue, "g3", "node3", 0x0a33)],
                confirmed: true,
            },
            PeerSet {
                memberships: set("node1", 1, &[]),
                generation: 2,
                grants: Vec::new(),
                confirmed: true,
            },
        ],
        revocations: Vec::new(),
        ..PeerAnswer::default()
    });
    a.sync.round().await;
    assert!(a.backend.node("node2").is_none());
    assert!(a.backend.node("node3").is_none());
    assert!(!file_has(&a, 0x0a22) && !file_has(&a, 0x0a33));
    assert_eq!(a.backend.node("node1").unwrap().generation, 3);
    assert!(file_has(&a, KEY));
    // The peer keeps holding what this host refused: after a second pull, SM_HOSTS_DISAGREE.
    assert!(
        a.sync.conditions().is_empty(),
        "one pull is not yet a disagreement"
    );
    a.sync.round().await;
    let c = a.sync.conditions();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].kind.name(), "SM_HOSTS_DISAGREE");
    assert!(
        c[0].detail.contains("node2: this host none, b 9"),
        "{}",
        c[0].detail
    );
    // A set nobody confirmed on the peer is not taken either.
    *to_b.forged.lock().unwrap() = Some(PeerAnswer {
        host: "b".into(),
        caught_up: false,
        sets: vec![PeerSet {
            memberships: set("node1", 1, &[]),
            generation: 7,
            grants: Vec::new(),
            confirmed: false,
        }],
        revocations: Vec::new(),
        ..PeerAnswer::default()
    });
    a.sync.round().await;
    assert_eq!(a.backend.node("node1").unwrap().generation, 3);
    *to_b.forged.lock().unwrap() = None;

    // The release (generation 4, no grant needed) reaches B; A takes it on the next round.
    b.side.set_node(set("node1", 1, &[]), &[], 4).await.unwrap();
    a.sync.round().await;
    assert_eq!(a.backend.node("node1").unwrap().generation, 4);
    assert!(!file_has(&a, KEY));
    assert!(a.sync.conditions().is_empty(), "{:?}", a.sync.conditions());
}

#[tokio::test]
async fn a_restarted_host_holds_every_set_back_until_it_is_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let (to_b, to_a) = (test_peer("b"), test_peer("a"));
    let store_a: Arc<InMemoryNodeStore> = Arc::default();
    let a = host(dir.path(), "a", store_a.clone(), &cp, to_b.clone());
    let b = host(dir.path(), "b", Arc::default(), &cp, to_a.clone());
    *to_b.real.lock().unwrap() = Some(b.sync.clone());

    // Both hosts hold node1 (key 0x0a11) and node2 (key 0x0a22) at generation 5.
    let k2 = 0x0a22;
    for h in [&a, &b] {
        h.side
            .set_node(
                set("node1", 1, &[KEY]),
                &[signed(&cp, "g1", "node1", KEY)],
                5,
            )
            .await
            .unwrap();
        h.side
            .set_node(set("node2", 2, &[k2]), &[signed(&cp, "g2", "node2", k2)], 5)
            .await
            .unwrap();
    }
    assert!(file_has(&a, KEY) && file_has(&a, k2));
    let Host { backend, sync, .. } = a;
    drop((backend, sync));
    // A is down; node1 releases through B alone.
    b.side.set_node(set("node1", 1, &[]), &[], 6).await.unwrap();

    // A restarts with its peer unreachable: every stored set is held back, and its rewritten
    // file holds none of their keys (its stale file gave node1 the released key).
    *to_b.real.lock().unwrap() = None;
    let a = host(dir.path(), "a", store_a.clone(), &cp, to_b.clone());
    assert!(file_has(&a, KEY), "the stale file before the agent ran");
    assert!(!a.sync.catch_up(std::time::Duration::from_secs(1)).await);
    assert!(!file_has(&a, KEY) && !file_has(&a, k2));
    assert_eq!(a.sync.status().gated_nodes.len(), 2);
    assert!(a.sync.status().waiting_for.contains(&"b".to_owned()));
    // A peer's pull sees none of the held-back sets.
    assert!(a.sync.answer("b").sets.is_empty());

    // The peer answers: node1's release (newer) and node2's set (same generation, confirmed
    // there, its grant forwarded) are taken; the released key stays out.
    *to_b.real.lock().unwrap() = Some(b.sync.clone());
    a.sync.round().await;
    assert!(a.sync.status().caught_up);
    assert!(a.sync.status().gated_nodes.is_empty());
    assert!(!file_has(&a, KEY));
    assert!(file_has(&a, k2));
    assert_eq!(a.backend.node("node1").unwrap().generation, 6);

    // A node's own same-generation set also confirms a held-back one.
    let Host { backend, sync, .. } = a;
    drop((backend, sync));
    *to_b.real.lock().unwrap() = None;
    let a = host(dir.path(), "a", store_a, &cp, to_b);
    a.backend.resync().await.unwrap();
    assert!(!file_has(&a, k2));
    a.side
        .set_node(set("node2", 2, &[k2]), &[signed(&cp, "g2", "node2", k2)], 5)
        .await
        .unwrap();
    assert!(file_has(&a, k2));
    let _ = a.store.transactions();
}

fn refused_as_denied(r: Result<u64, fabric_agent::sm::FabricSideError>) {
    let e = r.expect_err("a set carrying a revoked grant must be refused");
    let status = fabric_agent::api::sm_v1::convert::status_of_fabric_side(&e);
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
}

fn durably_revoked(store: &InMemoryNodeStore, node: &str, grant: &str) -> bool {
    store.load_all().unwrap().iter().any(|n| {
        n.memberships.node_id.as_str() == node
            && n.revoked_instances.contains("i-1")
            && n.consumed.contains(grant)
    })
}

#[tokio::test]
async fn a_revocation_on_one_host_is_applied_by_its_peer_and_the_grant_refused_there() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let (a, b, _, to_a) = pair(dir.path(), &cp, Arc::default());

    // node1 reached both hosts; node2 (key 0x0a22) reached A only.
    let (g1, g2) = (
        signed(&cp, "g1", "node1", KEY),
        signed(&cp, "g2", "node2", 0x0a22),
    );
    for h in [&a, &b] {
        h.side
            .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g1), 3)
            .await
            .unwrap();
    }
    a.side
        .set_node(set("node2", 2, &[0x0a22]), std::slice::from_ref(&g2), 5)
        .await
        .unwrap();

    // The control plane revokes both instances on A alone.
    for node in ["node1", "node2"] {
        let node = fabric_agent::domain::NodeId::parse(node).unwrap();
        a.side.revoke_instance(&node, "i-1").await.unwrap();
    }
    assert!(!file_has(&a, KEY) && !file_has(&a, 0x0a22));
    assert!(file_has(&b, KEY), "B has not pulled yet");

    // B pulls A: it revokes the same, durably, and its file loses the key.
    b.sync.round().await;
    assert!(!file_has(&b, KEY));
    assert!(durably_revoked(&b.store, "node1", "g1"));
    assert!(durably_revoked(&b.store, "node2", "g2"));
    assert_eq!(b.backend.node("node1").unwrap().generation, 3);

    // The node keeps sending sets carrying the revoked grant, to B: refused, nothing written.
    refused_as_denied(
        b.side
            .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g1), 4)
            .await,
    );
    refused_as_denied(
        b.side
            .set_node(set("node2", 2, &[0x0a22]), std::slice::from_ref(&g2), 6)
            .await,
    );
    assert!(!file_has(&b, KEY) && !file_has(&b, 0x0a22));

    // A peer cannot un-revoke: an answer without the revocations (and a set carrying the
    // revoked grant) changes nothing here.
    *to_a.forged.lock().unwrap() = Some(PeerAnswer {
        host: "a".into(),
        caught_up: true,
        sets: vec![PeerSet {
            memberships: set("node1", 1, &[KEY]),
            generation: 9,
            grants: vec![g1.clone()],
            confirmed: true,
        }],
        revocations: Vec::new(),
        ..PeerAnswer::default()
    });
    b.sync.round().await;
    assert!(!file_has(&b, KEY));
    assert!(durably_revoked(&b.store, "node1", "g1"));
    // B forwards the revocations it learned, and never the revoked grant.
    let answer = b.sync.answer("c");
    assert_eq!(answer.revocations.len(), 2);
    assert!(answer.sets.iter().all(|s| s.grants.is_empty()));
}

#[tokio::test]
async fn a_host_down_during_a_revocation_learns_it_at_its_next_pull() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let store_b: Arc<InMemoryNodeStore> = Arc::default();
    let (a, b, _, to_a) = pair(dir.path(), &cp, store_b.clone());
    let g1 = signed(&cp, "g1", "node1", KEY);
    for h in [&a, &b] {
        h.side
            .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g1), 3)
            .await
            .unwrap();
    }

    // B is down while the control plane revokes on A.
    let Host { backend, sync, .. } = b;
    drop((backend, sync));
    let node1 = fabric_agent::domain::NodeId::parse("node1").unwrap();
    a.side.revoke_instance(&node1, "i-1").await.unwrap();

    // B restarts and catches up from A: the revocation is recorded in its store.
    let b = host(dir.path(), "b", store_b.clone(), &cp, to_a.clone());
    assert!(file_has(&b, KEY), "the stale file before the agent ran");
    assert!(b.sync.catch_up(std::time::Duration::from_secs(1)).await);
    assert!(!file_has(&b, KEY));
    assert!(durably_revoked(&store_b, "node1", "g1"));

    // A's revoked set confirmed B's held-back one, so the node's retry of its old set is not
    // the same set any more, and its next set still carries the revoked grant: both refused,
    // and the key stays out of B's file.
    assert!(b
        .side
        .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g1), 3)
        .await
        .is_err());
    refused_as_denied(
        b.side
            .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g1), 4)
            .await,
    );
    assert!(!file_has(&b, KEY));
    // And a restart of B keeps it (durable), even with A unreachable.
    let Host { backend, sync, .. } = b;
    drop((backend, sync));
    *to_a.real.lock().unwrap() = None;
    let b = host(dir.path(), "b", store_b, &cp, to_a);
    assert!(!b.sync.catch_up(std::time::Duration::from_secs(1)).await);
    refused_as_denied(
        b.side
            .set_node(set("node1", 1, &[KEY]), std::slice::from_ref(&g1), 5)
            .await,
    );
    assert!(!file_has(&b, KEY));
}
