//! The UFM backend's ledger against the in-process fake UFM: every GUID this node ever put in a
//! key is removed at release, visible now or not; entries are recorded before the add is sent
//! and dropped only once a read of UFM showed the GUID gone; Ok means the read agrees.

use testkit::common;
use testkit::fake_ufm;

use common::cred::CredFile;
use fabric_agent::domain::{Guid, Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, NoAnswer, UfmConfig, UfmError, UfmLedger, UfmSm};
use fabric_agent::sm::{SmError, SmFailure, SubnetManager};
use fake_ufm::{FakeMember, FakeUfm, LoggedRequest, Quirks};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const G1: u64 = 0x0002_c903_000e_0b72;
const G2: u64 = 0x0002_c903_000e_0b73;
const OTHER: u64 = 0x0002_c903_00ff_0001;
const K: u16 = 0x0a12;

struct Rig {
    fake: FakeUfm,
    cred: CredFile,
    /// The node's store: backends built by [`Rig::sm`] share it, like restarts of the agent.
    store: MemoryLedgerStore,
}

impl Rig {
    async fn new() -> Rig {
        Rig {
            fake: FakeUfm::start().await,
            cred: CredFile::new("admin:123456"),
            store: MemoryLedgerStore::new(),
        }
    }

    fn config(&self) -> UfmConfig {
        // No stamp read: these tests pin each apply's exact partition reads
        // (tests/ufm/fleet.rs covers skipping).
        self.fake.test_config(self.cred.path().to_owned(), 1)
    }

    /// A backend as a (re)started agent builds it: the node's store, nothing in memory.
    fn sm(&self) -> UfmSm {
        UfmSm::new(&self.config(), Arc::new(self.store.clone())).unwrap()
    }

    /// A backend whose requests time out after 150 ms, and whose unanswered adds stay watched
    /// for 1 s (time-scaled: the default is 10 minutes).
    fn impatient_sm(&self) -> UfmSm {
        let mut c = self.config();
        c.request_timeout_ms = 150;
        c.late_write_window_ms = 1_000;
        UfmSm::new(&c, Arc::new(self.store.clone())).unwrap()
    }

    fn ledger(&self) -> UfmLedger {
        self.store.ledger().unwrap()
    }

    /// Another node's GUID in `key`, which this node must never remove.
    fn seed_other_node(&self, key: u16) {
        let mut p = self.fake.partition(key).expect("partition exists");
        p.members.insert(
            OTHER,
            FakeMember {
                membership: Membership::Full,
                index0: false,
            },
        );
        self.fake.insert_partition(key, p);
    }
}

fn node(guids: &[u64], keys: &[u16]) -> NodeMemberships {
    common::memberships(
        "node-a",
        guids.iter().copied(),
        keys.iter().map(|k| (u32::from(*k), Membership::Full)),
        |k| format!("part-{k:x}"),
    )
}

fn pkey(k: u16) -> PKey {
    PKey::new(u32::from(k)).unwrap()
}

fn guids(g: &[u64]) -> BTreeSet<Guid> {
    g.iter().map(|g| Guid(*g)).collect()
}

fn calls(log: &[LoggedRequest]) -> Vec<String> {
    log.iter()
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect()
}

fn members(pairs: &[u64]) -> BTreeMap<u64, Membership> {
    pairs.iter().map(|g| (*g, Membership::Full)).collect()
}

#[tokio::test]
async fn a_release_after_a_restart_with_fewer_ports_removes_the_hidden_guid_too() {
    let rig = Rig::new().await;
    rig.sm().apply(&node(&[G1, G2], &[K]), 1).await.unwrap();
    rig.seed_other_node(K);
    assert_eq!(rig.ledger().guids(pkey(K)), guids(&[G1, G2]));

    // The agent restarts and the HCA behind G2 does not enumerate; then the key is released.
    let sm = rig.sm();
    rig.fake.clear_requests();
    sm.apply(&node(&[G1], &[]), 2).await.unwrap();
    let log = rig.fake.requests();
    assert_eq!(
        calls(&log),
        [
            "GET /ufmRest/resources/pkeys?guids_data=true 200",
            "POST /ufmRest/actions/remove_guids_from_pkey 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
    assert_eq!(
        log[1].body,
        Some(json!({"pkey": "0x0a12", "guids": ["0002c903000e0b72", "0002c903000e0b73"]}))
    );
    assert_eq!(
        rig.fake.members(K),
        members(&[OTHER]),
        "another node's GUID stays"
    );
    assert!(rig.ledger().is_empty(), "{:?}", rig.ledger());

    // Confirmed and forgotten: nothing more to ask.
    rig.fake.clear_requests();
    sm.apply(&node(&[G1], &[]), 3).await.unwrap();
    assert!(
        rig.fake.requests().is_empty(),
        "{:?}",
        calls(&rig.fake.requests())
    );
}

#[tokio::test]
async fn without_the_ledger_the_hidden_guid_would_stay() {
    // The same story with a store that lost the ledger: only what is visible can be found.
    let rig = Rig::new().await;
    rig.sm().apply(&node(&[G1, G2], &[K]), 1).await.unwrap();
    let forgetful = UfmSm::new(&rig.config(), Arc::new(MemoryLedgerStore::new())).unwrap();
    forgetful.apply(&node(&[G1], &[]), 2).await.unwrap();
    assert_eq!(rig.fake.members(K), members(&[G2]));
    // The node's own store still knows G2: a backend built on it removes it.
    rig.sm().apply(&node(&[G1], &[]), 3).await.unwrap();
    assert!(rig.fake.members(K).is_empty());
}

#[tokio::test]
async fn a_port_gone_after_a_restart_leaves_a_key_still_desired() {
    let rig = Rig::new().await;
    rig.sm().apply(&node(&[G1, G2], &[K]), 1).await.unwrap();
    let sm = rig.sm();
    sm.apply(&node(&[G1], &[K]), 2).await.unwrap();
    assert_eq!(rig.fake.members(K), members(&[G1]));
    assert_eq!(rig.ledger().guids(pkey(K)), guids(&[G1]));
}

#[tokio::test]
async fn a_release_with_no_visible_port_still_removes_every_ledger_guid() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1, G2], &[K, 0x0b00]), 1).await.unwrap();
    // Every HCA failed to enumerate, and every key is released.
    sm.apply(&node(&[], &[]), 2).await.unwrap();
    assert!(rig.fake.members(K).is_empty());
    assert!(rig.fake.members(0x0b00).is_empty());
    assert!(rig.ledger().is_empty());
    rig.fake.clear_requests();
    sm.apply(&node(&[], &[]), 3).await.unwrap();
    assert_eq!(rig.fake.request_count(), 0, "nothing left to remove");
}

#[tokio::test]
async fn a_removal_that_timed_out_but_took_effect_is_confirmed_by_the_next_apply() {
    let rig = Rig::new().await;
    let sm = rig.impatient_sm();
    sm.apply(&node(&[G1, G2], &[K]), 1).await.unwrap();
    // Both attempts (1 + 1 retry) remove the GUIDs, and both answers are lost.
    rig.fake.answer_writes_late(2, Duration::from_millis(600));
    let err = sm.apply(&node(&[G1, G2], &[]), 2).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(timed_out(&err), "{err:?}");
    assert!(rig.fake.members(K).is_empty(), "the removal took effect");
    assert_eq!(
        rig.ledger().guids(pkey(K)),
        guids(&[G1, G2]),
        "no read showed them gone yet"
    );

    rig.fake.clear_requests();
    sm.apply(&node(&[G1, G2], &[]), 3).await.unwrap();
    assert_eq!(
        calls(&rig.fake.requests()),
        ["GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200"],
        "the read confirms the removal; nothing is sent again"
    );
    assert!(rig.ledger().is_empty());
    rig.fake.clear_requests();
    sm.apply(&node(&[G1, G2], &[]), 4).await.unwrap();
    assert_eq!(rig.fake.request_count(), 0);
}

#[tokio::test]
async fn an_add_that_failed_after_taking_effect_is_in_the_ledger() {
    let rig = Rig::new().await;
    rig.fake.answer_writes_late(2, Duration::from_millis(600));
    let err = rig
        .impatient_sm()
        .apply(&node(&[G1, G2], &[K]), 1)
        .await
        .unwrap_err();
    assert!(timed_out(&err), "{err:?}");
    assert_eq!(
        rig.fake.members(K),
        members(&[G1, G2]),
        "the add took effect"
    );
    assert_eq!(rig.ledger().guids(pkey(K)), guids(&[G1, G2]));

    // Restart with G2 hidden, and the attachment is withdrawn: both GUIDs leave K at once,
    // but the unanswered add could still land: not acknowledged until its window ended. The
    // new life re-arms the watch to its own window from its first load (the same 1 s here).
    let mut c = rig.config();
    c.late_write_window_ms = 1_000;
    let sm = UfmSm::new(&c, Arc::new(rig.store.clone())).unwrap();
    let err = sm.apply(&node(&[G1], &[]), 2).await.unwrap_err();
    assert!(
        matches!(
            err,
            SmError::Unreachable(SmFailure::Ufm(UfmError::LateWriteWindow { .. }))
        ),
        "{err:?}"
    );
    assert!(rig.fake.members(K).is_empty());
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    sm.apply(&node(&[G1], &[]), 3).await.unwrap();
    assert!(rig.fake.members(K).is_empty());
    assert!(rig.ledger().is_empty());
}

#[tokio::test]
async fn an_add_is_not_sent_until_the_ledger_records_it() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    rig.store.refuse_saves(true);
    let err = sm.apply(&node(&[G1], &[K]), 1).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("UFM ledger"), "{err}");
    assert!(
        rig.fake.requests().iter().all(|r| r.method == "GET"),
        "{:?}",
        calls(&rig.fake.requests())
    );
    assert!(rig.fake.members(K).is_empty());

    // The store accepts writes again: the same apply records, then adds.
    rig.store.refuse_saves(false);
    sm.apply(&node(&[G1], &[K]), 2).await.unwrap();
    assert_eq!(rig.fake.members(K), members(&[G1]));
    assert_eq!(rig.ledger().guids(pkey(K)), guids(&[G1]));
}

#[tokio::test]
async fn a_read_back_still_showing_a_guid_is_an_error_and_keeps_the_ledger() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1, G2], &[K]), 1).await.unwrap();
    rig.fake.set_quirks(Quirks {
        ignore_writes: true,
        ..Quirks::default()
    });
    let err = sm.apply(&node(&[G1, G2], &[]), 2).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        err.to_string()
            .contains("reading it back shows 0 GUID(s) still to add and 2 to remove"),
        "{err}"
    );
    assert_eq!(rig.ledger().guids(pkey(K)), guids(&[G1, G2]));

    rig.fake.set_quirks(Quirks::default());
    sm.apply(&node(&[G1, G2], &[]), 3).await.unwrap();
    assert!(rig.fake.members(K).is_empty());
    assert!(rig.ledger().is_empty());
}

#[tokio::test]
async fn a_read_back_with_the_wrong_membership_is_an_error() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1], &[K]), 1).await.unwrap();
    rig.fake.set_quirks(Quirks {
        ignore_writes: true,
        ..Quirks::default()
    });
    let mut limited = node(&[G1], &[K]);
    limited.keys.get_mut(&pkey(K)).unwrap().membership = Membership::Limited;
    let err = sm.apply(&limited, 2).await.unwrap_err();
    assert!(err.to_string().contains("1 GUID(s) still to add"), "{err}");
}

#[tokio::test]
async fn each_key_leaves_the_ledger_only_when_a_read_showed_it_clear() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1], &[K, 0x0b00]), 1).await.unwrap();
    // An operator deletes 0x0b00; then UFM stops applying writes, and both keys are released.
    rig.fake.drop_partition(0x0b00);
    rig.fake.set_quirks(Quirks {
        ignore_writes: true,
        ..Quirks::default()
    });
    let err = sm.apply(&node(&[G1], &[]), 2).await.unwrap_err();
    assert!(err.to_string().contains("0x0a12"), "{err}");
    let ledger = rig.ledger();
    assert_eq!(ledger.guids(pkey(K)), guids(&[G1]), "K is still in doubt");
    assert!(
        ledger.guids(pkey(0x0b00)).is_empty(),
        "the read showed 0x0b00 without G1"
    );
}

#[tokio::test]
async fn a_corrupt_ledger_is_refused_and_nothing_is_sent() {
    use fabric_agent::sm::ufm::UfmLedgerStore;
    let rig = Rig::new().await;
    rig.store
        .save(b"{\"version\":1,\"keys\":{\"0x0a12\":[\"zz\"]}}")
        .unwrap();
    let err = rig.sm().apply(&node(&[G1], &[K]), 1).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("UFM ledger"), "{err}");
    assert_eq!(rig.fake.request_count(), 0);
}

/// Whether the apply failed because UFM's answers timed out.
fn timed_out(err: &SmError) -> bool {
    matches!(
        err,
        SmError::Unreachable(SmFailure::Ufm(UfmError::NoAnswer(NoAnswer::Transport { source, .. })))
            if source.is_timeout()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_ufm_executes_late_is_removed_and_the_key_released_only_after_the_window() {
    let rig = Rig::new().await;
    let mut config = rig.config();
    // Time-scaled: the default window is 10 minutes; the late add lands 0.8 s after it was
    // sent, well inside this 2 s window.
    config.late_write_window_ms = 2_000;
    let build = || UfmSm::new(&config, Arc::new(rig.store.clone())).unwrap();
    let sm = build();
    let key = PKey::new(u32::from(K)).unwrap();
    rig.fake.execute_adds_late(1, Duration::from_millis(800));
    let sent = std::time::Instant::now();
    // The first attempt is answered 503 (and will still be executed); the retry lands.
    sm.apply(&node(&[G1], &[K]), 1).await.unwrap();
    assert!(rig.fake.members(K).contains_key(&G1));
    assert!(
        rig.ledger().watched_until(key).is_some(),
        "a retried add is watched"
    );

    // Release: UFM shows the key clear, yet the first attempt can still land: no
    // acknowledgement (so no RELEASED), and the key stays in the ledger.
    let late_window = |r: Result<_, SmError>| match r {
        Err(SmError::Unreachable(SmFailure::Ufm(UfmError::LateWriteWindow { key: k, .. }))) => {
            assert_eq!(k, key)
        }
        other => panic!("a watched key must not be acknowledged as released: {other:?}"),
    };
    late_window(sm.apply(&node(&[G1], &[]), 2).await);
    assert!(!rig.fake.members(K).contains_key(&G1));
    assert!(rig.ledger().guids(key).contains(&Guid(G1)));
    // A restarted agent's backend holds the same watch (it is durable).
    late_window(build().apply(&node(&[G1], &[]), 3).await);

    // UFM executes the stale add: the GUID is back in the released key.
    let deadline = sent + Duration::from_millis(1_800);
    while !rig.fake.members(K).contains_key(&G1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the late add never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next apply removes it at once and reports the late write.
    late_window(sm.apply(&node(&[G1], &[]), 4).await);
    assert!(!rig.fake.members(K).contains_key(&G1), "removed at once");
    let conditions = sm.conditions();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0].kind.name(), "UFM_LATE_WRITE");
    assert!(
        conditions[0].detail.contains("0x0a12"),
        "{}",
        conditions[0].detail
    );

    // Past the window (measured from the last attempt's send, which a loaded machine delays),
    // a read shows the key clear: acknowledged, forgotten, condition cleared. Never before the
    // first attempt's window is over.
    tokio::time::sleep(
        (sent + Duration::from_millis(2_100)).saturating_duration_since(std::time::Instant::now()),
    )
    .await;
    let mut generation = 5;
    loop {
        match sm.apply(&node(&[G1], &[]), generation).await {
            Ok(_) => break,
            other => late_window(other),
        }
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "the release was never acknowledged after the window"
        );
        generation += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sent.elapsed() >= Duration::from_millis(2_000));
    assert!(rig.ledger().is_empty(), "{:?}", rig.ledger());
    assert!(sm.conditions().is_empty());
    assert!(!rig.fake.members(K).contains_key(&G1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_answered_at_its_first_attempt_leaves_nothing_watched() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    let key = PKey::new(u32::from(K)).unwrap();
    sm.apply(&node(&[G1], &[K]), 1).await.unwrap();
    assert_eq!(rig.ledger().watched_until(key), None);
    // Released at once, no window to wait out.
    sm.apply(&node(&[G1], &[]), 2).await.unwrap();
    assert!(rig.ledger().is_empty());
}
