//! The fabric side's grant ledger, in process (OpenSM backends on their own files, reloads
//! accepted, grants required): a never-used grant past its lifetime is refused while an admitted
//! one keeps working across resends and restarts; a retired P_Key refuses every grant issued
//! before its retirement (a node holding it loses it) while the next tenant's new grant works,
//! across a restart; grants consumed on one SM host and keys retired there are applied by its
//! peer at its next pull, before any set, so a node that releases to one host and replays its
//! grant to the other is refused there; `SM_HOSTS_DISAGREE` compares the sets, not only the
//! generations; a set repeating one grant thousands of times costs one verification.

use testkit::common;

use async_trait::async_trait;
use common::grants::{grant, GrantSigner};
use common::memberships::memberships;
use common::sm_host::AcceptingReloader;
use fabric_agent::api::grant_v1::signed_grant_from_proto;
use fabric_agent::domain::{
    FabricName, GrantError, GrantKeys, GrantLifetime, GrantPolicy, Membership, NodeMemberships,
    PKey, SignedGrant,
};
use fabric_agent::sm::opensm::sync::{GatedStore, Peer, PeerAnswer, PeerSync};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OpenSmError,
    OwnershipConfig,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY: u32 = 0x0a11;
const HOUR_MS: u64 = 3_600_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn file_in(dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(format!("{name}.partitions.conf"));
    if !file.exists() {
        std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    }
    file
}

fn backend(
    file: &Path,
    store: Arc<dyn NodeMembershipStore>,
    cp: &GrantSigner,
    lifetime: GrantLifetime,
) -> OpenSmBackend {
    let key = fabric_agent::config::decode_public_key(&cp.id, &cp.public_b64()).unwrap();
    OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: file.to_owned(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            grants: Some(GrantPolicy {
                require: true,
                fabric: FabricName::parse("fab1").unwrap(),
                keys: GrantKeys::new([key]).unwrap().with_lifetime(lifetime),
            }),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        store,
        Arc::new(AcceptingReloader),
    )
    .unwrap()
}

fn hour() -> GrantLifetime {
    GrantLifetime {
        max_age_ms: HOUR_MS,
        max_clock_skew_ms: 300_000,
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

/// A grant of `KEY` issued at `issued`.
fn signed_at(cp: &GrantSigner, id: &str, node: &str, instance: &str, issued: u64) -> SignedGrant {
    let mut g = grant(id, "fab1", node, instance, KEY, Membership::Full);
    g.issued_at_unix_ms = issued;
    signed_grant_from_proto(&cp.sign(&g)).unwrap()
}

fn has_key(file: &Path) -> bool {
    std::fs::read_to_string(file)
        .unwrap()
        .contains(&format!("{KEY:#06x}"))
}

fn refusal(e: &OpenSmError) -> &GrantError {
    match e {
        OpenSmError::GrantRefused { error, .. } => error,
        other => panic!("not a grant refusal: {other}"),
    }
}

#[tokio::test]
async fn a_never_used_grant_past_its_lifetime_is_refused_and_an_admitted_one_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(dir.path(), "a");
    let store = Arc::new(InMemoryNodeStore::default());
    let cp = GrantSigner::new("cp");
    let short = GrantLifetime {
        max_age_ms: 1_000,
        max_clock_skew_ms: 0,
    };
    let sm = backend(&file, store.clone(), &cp, short);

    // Issued 400 days ago, never used: refused, nothing written.
    let old = signed_at(
        &cp,
        "g-old",
        "node1",
        "i-old",
        now_ms() - 400 * 24 * HOUR_MS,
    );
    let e = sm
        .set_node_granted(set("node1", 1, &[KEY]), &[old], 1)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Expired { .. }), "{e}");
    assert!(e.to_string().contains("expired"), "{e}");
    assert!(sm.node("node1").is_none());
    assert!(!has_key(&file));
    // Issued further ahead of this host's clock than the skew allows: refused too.
    let ahead = signed_at(&cp, "g-ahead", "node1", "i-a", now_ms() + HOUR_MS);
    let e = sm
        .set_node_granted(set("node1", 1, &[KEY]), &[ahead], 1)
        .await
        .unwrap_err();
    assert!(
        matches!(refusal(&e), GrantError::FromTheFuture { .. }),
        "{e}"
    );

    // A fresh grant is admitted; once past its lifetime the node still resends it (a new
    // generation, a restart of the SM host): it was admitted, so it keeps working.
    let fresh = signed_at(&cp, "g-1", "node1", "i-1", now_ms());
    sm.set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&fresh), 2)
        .await
        .unwrap();
    assert!(has_key(&file));
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    sm.set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&fresh), 3)
        .await
        .unwrap();
    drop(sm);
    let sm = backend(&file, store, &cp, short);
    sm.set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&fresh), 4)
        .await
        .unwrap();
    assert!(has_key(&file));
    // The same grant presented for another node is a first admission there: expired.
    let e = sm
        .set_node_granted(
            set("node2", 2, &[KEY]),
            &[signed_at(&cp, "g-2", "node2", "i-2", now_ms() - 2_000)],
            1,
        )
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Expired { .. }), "{e}");
}

#[tokio::test]
async fn a_retired_pkey_refuses_every_older_grant_and_takes_the_next_tenants_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(dir.path(), "a");
    let store = Arc::new(InMemoryNodeStore::default());
    let cp = GrantSigner::new("cp");
    let sm = backend(&file, store.clone(), &cp, hour());

    // Tenant A's partition: node1 holds the key; node2 holds an unused grant for it.
    let t0 = now_ms() - 10_000;
    sm.set_node_granted(
        set("node1", 1, &[KEY]),
        &[signed_at(&cp, "ga-1", "node1", "ia-1", t0)],
        1,
    )
    .await
    .unwrap();
    assert!(has_key(&file));
    let unused = signed_at(&cp, "ga-2", "node2", "ia-2", t0 + 1);

    // Bad retirements change nothing.
    for bad in [0, now_ms() + 2 * HOUR_MS] {
        let e = sm
            .retire_pkey(PKey::new(KEY).unwrap(), bad)
            .await
            .unwrap_err();
        assert!(matches!(e, OpenSmError::Invalid(_)), "{e}");
    }
    assert!(sm.retired().is_empty());

    // The control plane deletes the partition and retires its key.
    let retired_at = now_ms();
    let out = sm
        .retire_pkey(PKey::new(KEY).unwrap(), retired_at)
        .await
        .unwrap();
    assert!(out.recorded);
    assert_eq!(out.removed.len(), 1, "{out:?}");
    assert_eq!(out.removed[0].1, vec!["ga-1".to_owned()]);
    assert!(!has_key(&file), "node1 still holds the retired key");
    // Idempotent.
    assert!(
        !sm.retire_pkey(PKey::new(KEY).unwrap(), retired_at)
            .await
            .unwrap()
            .recorded
    );

    // No old grant gets the key back: node2's unused one, nor a rooted node1 replaying.
    let e = sm
        .set_node_granted(set("node2", 2, &[KEY]), std::slice::from_ref(&unused), 1)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Retired { .. }), "{e}");
    let other_old = signed_at(&cp, "ga-9", "node1", "ia-9", retired_at);
    let e = sm
        .set_node_granted(set("node1", 1, &[KEY]), &[other_old], 2)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Retired { .. }), "{e}");
    assert!(!has_key(&file));

    // Tenant B gets the key with a grant issued after the retirement.
    let b = signed_at(&cp, "gb-1", "node3", "ib-1", retired_at + 1);
    sm.set_node_granted(set("node3", 3, &[KEY]), std::slice::from_ref(&b), 1)
        .await
        .unwrap();
    assert!(has_key(&file));

    // After a restart the retirement holds and tenant B keeps the key.
    drop(sm);
    let sm = backend(&file, store, &cp, hour());
    assert_eq!(
        sm.retired().retired_at(PKey::new(KEY).unwrap()),
        Some(retired_at)
    );
    let e = sm
        .set_node_granted(set("node2", 2, &[KEY]), &[unused], 1)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Retired { .. }), "{e}");
    sm.set_node_granted(set("node3", 3, &[KEY]), &[b], 2)
        .await
        .unwrap();
    assert!(has_key(&file));
}

/// A peer answering with another host's sync, or a fixed answer.
struct TestPeer {
    real: Mutex<Option<Arc<PeerSync>>>,
    forged: Mutex<Option<PeerAnswer>>,
}

#[async_trait]
impl Peer for TestPeer {
    fn name(&self) -> &str {
        "peer"
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

struct Host {
    file: PathBuf,
    backend: OpenSmBackend,
    sync: Arc<PeerSync>,
}

fn host(
    dir: &Path,
    name: &str,
    store: Arc<InMemoryNodeStore>,
    cp: &GrantSigner,
    peer: Arc<TestPeer>,
) -> Host {
    let file = file_in(dir, name);
    let backend = backend(
        &file,
        Arc::new(GatedStore(store as Arc<dyn NodeMembershipStore>)),
        cp,
        hour(),
    );
    let sync = PeerSync::new(
        backend.clone(),
        name.into(),
        vec![peer as Arc<dyn Peer>],
        None,
    );
    Host {
        file,
        backend,
        sync,
    }
}

fn peer() -> Arc<TestPeer> {
    Arc::new(TestPeer {
        real: Mutex::new(None),
        forged: Mutex::new(None),
    })
}

/// Two hosts pulling each other.
fn pair(dir: &Path, cp: &GrantSigner) -> (Host, Host, Arc<TestPeer>) {
    let (to_b, to_a) = (peer(), peer());
    let a = host(dir, "a", Arc::default(), cp, to_b.clone());
    let b = host(dir, "b", Arc::default(), cp, to_a.clone());
    *to_b.real.lock().unwrap() = Some(b.sync.clone());
    *to_a.real.lock().unwrap() = Some(a.sync.clone());
    (a, b, to_a)
}

#[tokio::test]
async fn a_grant_consumed_on_one_sm_host_is_refused_by_the_other_after_one_pull() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let (a, b, _) = pair(dir.path(), &cp);
    a.sync.round().await;
    b.sync.round().await;
    let g = signed_at(&cp, "g-1", "node1", "i-1", now_ms());
    for h in [&a, &b] {
        h.backend
            .set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&g), 1)
            .await
            .unwrap();
        assert!(has_key(&h.file));
    }
    // A rooted node1 sends its release to a only, and {KEY, g-1} at a higher generation to b.
    a.backend
        .set_node_granted(set("node1", 1, &[]), &[], 2)
        .await
        .unwrap();
    assert!(!has_key(&a.file));
    b.backend
        .set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&g), 3)
        .await
        .unwrap();
    assert!(has_key(&b.file), "b has not heard of the release yet");
    // One pull: b consumes g-1 too, and its set loses the key it alone justified.
    b.sync.round().await;
    assert!(!has_key(&b.file), "b still programs the released key");
    assert!(b.backend.node("node1").unwrap().consumed.contains("g-1"));
    let e = b
        .backend
        .set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&g), 4)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Consumed { .. }), "{e}");
    // And a, pulling b's newer (now empty) set, stays without the key.
    a.sync.round().await;
    assert!(!has_key(&a.file));

    // Release to a first, pull, then replay to b: refused at once.
    let g2 = signed_at(&cp, "g-2", "node2", "i-2", now_ms());
    for h in [&a, &b] {
        h.backend
            .set_node_granted(set("node2", 2, &[KEY]), std::slice::from_ref(&g2), 1)
            .await
            .unwrap();
    }
    a.backend
        .set_node_granted(set("node2", 2, &[]), &[], 2)
        .await
        .unwrap();
    b.sync.round().await;
    let e = b
        .backend
        .set_node_granted(set("node2", 2, &[KEY]), &[g2], 3)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Consumed { .. }), "{e}");
}

#[tokio::test]
async fn a_retirement_on_one_sm_host_is_applied_by_the_other_and_survives_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let store_b = Arc::new(InMemoryNodeStore::default());
    let (to_b, to_a) = (peer(), peer());
    let a = host(dir.path(), "a", Arc::default(), &cp, to_b.clone());
    let b = host(dir.path(), "b", store_b.clone(), &cp, to_a.clone());
    *to_b.real.lock().unwrap() = Some(b.sync.clone());
    *to_a.real.lock().unwrap() = Some(a.sync.clone());
    let old = signed_at(&cp, "ga-1", "node1", "ia-1", now_ms() - 5_000);
    b.backend
        .set_node_granted(set("node1", 1, &[KEY]), std::slice::from_ref(&old), 1)
        .await
        .unwrap();
    assert!(has_key(&b.file));
    let at = now_ms();
    a.backend
        .retire_pkey(PKey::new(KEY).unwrap(), at)
        .await
        .unwrap();
    b.sync.round().await;
    assert_eq!(
        b.backend.retired().retired_at(PKey::new(KEY).unwrap()),
        Some(at)
    );
    assert!(!has_key(&b.file), "b still programs the retired key");
    assert!(b.backend.node("node1").unwrap().consumed.contains("ga-1"));
    // b restarts on its store (no peer answering): the retirement holds for a grant of the
    // old partition that was never used.
    drop((b, old));
    let b = host(dir.path(), "b", store_b, &cp, peer());
    let unused = signed_at(&cp, "ga-2", "node2", "ia-2", at - 1);
    let e = b
        .backend
        .set_node_granted(set("node2", 2, &[KEY]), &[unused], 1)
        .await
        .unwrap_err();
    assert!(matches!(refusal(&e), GrantError::Retired { .. }), "{e}");
}

#[tokio::test]
async fn sm_hosts_disagree_when_they_hold_other_sets_at_the_same_generation() {
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let (_, b, to_a) = pair(dir.path(), &cp);
    let g = signed_at(&cp, "g-1", "node1", "i-1", now_ms());
    b.backend
        .set_node_granted(set("node1", 1, &[KEY]), &[g], 1)
        .await
        .unwrap();
    b.sync.round().await;
    let mut forged = b.sync.answer("b");
    forged.sets[0].memberships.keys.clear();
    *to_a.forged.lock().unwrap() = Some(forged);
    b.sync.round().await;
    b.sync.round().await;
    let c = b.sync.conditions();
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(c[0].detail.contains("another set"), "{}", c[0].detail);
}

#[tokio::test]
async fn thousands_of_copies_of_one_grant_cost_one_and_stall_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(dir.path(), "a");
    let cp = GrantSigner::new("cp");
    let sm = backend(&file, Arc::new(InMemoryNodeStore::default()), &cp, hour());
    let g = signed_at(&cp, "g-1", "node1", "i-1", now_ms());
    let flood: Vec<SignedGrant> = std::iter::repeat_n(g, 20_000).collect();
    let started = Instant::now();
    sm.set_node_granted(set("node1", 1, &[KEY]), &flood, 1)
        .await
        .unwrap();
    let took = started.elapsed();
    eprintln!("set with 20000 copies of one grant: {took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    // Two different grants for the same key and instance refuse the set.
    let twin = signed_at(&cp, "g-2", "node2", "i-2", now_ms());
    let other = signed_at(&cp, "g-3", "node2", "i-2", now_ms());
    let e = sm
        .set_node_granted(set("node2", 2, &[KEY]), &[twin, other], 1)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("one grant per key and instance"),
        "{e}"
    );
}
