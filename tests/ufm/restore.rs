//! A UFM node whose store is restored from a copy: the restored ledger lacks the adds sent after
//! the copy, which may be in UFM or still land late. The backend, told of the restore at start
//! (`UfmSm::after_restore`, from `Store::rolled_back`), reads UFM's whole list and removes the
//! node's GUIDs from every key it does not give them until the late-write window from the start
//! is over, and acknowledges nothing before a read after that window showed every key right.

use testkit::common;
use testkit::fake_ufm;
use testkit::sim::model_ufm::StoreLedger;

use common::cred::CredFile;
use fabric_agent::domain::{Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{UfmConfig, UfmError, UfmLedger, UfmLedgerStore, UfmSm};
use fabric_agent::sm::{SmError, SmFailure, SubnetManager};
use fabric_agent::store::Store;
use fake_ufm::{FakeMember, FakePartition, FakeUfm};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const G1: u64 = 0x0002_c903_000e_0b72;
const K: u16 = 0x0a12;
/// Time-scaled late-write window (the default is 10 minutes).
const WINDOW_MS: u64 = 2_000;

/// The fake UFM and the node's store on disk, with a backup copy of its database file.
struct Rig {
    fake: FakeUfm,
    cred: CredFile,
    dir: tempfile::TempDir,
    backup: Option<Vec<u8>>,
}

impl Rig {
    async fn new() -> Rig {
        Rig {
            fake: FakeUfm::start().await,
            cred: CredFile::new("admin:123456"),
            dir: tempfile::tempdir().unwrap(),
            backup: None,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("state.redb")
    }

    fn open(&self) -> Arc<Store> {
        Arc::new(Store::open(&self.path(), u64::MAX).unwrap())
    }

    fn config(&self) -> UfmConfig {
        let mut c = self.fake.test_config(self.cred.path().to_owned(), 1);
        c.late_write_window_ms = WINDOW_MS;
        c
    }

    /// A backend as the daemon builds it on `store`.
    fn sm(&self, store: &Arc<Store>) -> UfmSm {
        UfmSm::new(&self.config(), Arc::new(StoreLedger(store.clone())))
            .unwrap()
            .after_restore(store.rolled_back())
            .unwrap()
    }

    /// Copies the database file (a backup).
    fn back_up(&mut self) {
        self.backup = Some(std::fs::read(self.path()).unwrap());
    }

    /// A backup taken before K was attached, then K attached (the ledger records it after the
    /// copy); the agent then goes down.
    async fn back_up_then_attach_k(&mut self) {
        let store = self.open();
        self.sm(&store).apply(&node(&[]), 1).await.unwrap();
        self.back_up();
        self.sm(&store).apply(&node(&[K]), 2).await.unwrap();
    }

    /// Puts the backup back (the agent is down: no handle on the store is left) and opens it.
    fn restore(&self) -> Arc<Store> {
        std::fs::write(self.path(), self.backup.as_ref().unwrap()).unwrap();
        let store = self.open();
        assert!(store.rolled_back().is_some(), "the store sees the restore");
        store
    }
}

fn node(keys: &[u16]) -> NodeMemberships {
    common::memberships(
        "node-a",
        [G1],
        keys.iter().map(|k| (u32::from(*k), Membership::Full)),
        |k| format!("part-{k:x}"),
    )
}

fn ledger(store: &Arc<Store>) -> UfmLedger {
    match StoreLedger(store.clone()).load().unwrap() {
        Some(bytes) => UfmLedger::decode(&bytes).unwrap(),
        None => UfmLedger::default(),
    }
}

/// The apply was not acknowledged because of the restore watch.
fn restore_watch<T: std::fmt::Debug>(r: Result<T, SmError>) -> bool {
    match r {
        Err(SmError::Unreachable(SmFailure::Ufm(UfmError::RestoreWatch {
            list_unread, ..
        }))) => list_unread,
        other => panic!("a node with a restored store must not be acknowledged: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_add_the_restored_ledger_forgot_is_removed_and_nothing_acknowledged_before_the_window(
) {
    let mut rig = Rig::new().await;
    let store = rig.open();
    rig.sm(&store).apply(&node(&[]), 1).await.unwrap();
    // The backup: taken before the node ever sent K.
    rig.back_up();

    // After the copy: K is attached; the first add is answered 503 and executed 0.8 s later,
    // the retry lands. The live ledger knows K; the backup does not.
    rig.fake.execute_adds_late(1, Duration::from_millis(800));
    let sent = Instant::now();
    rig.sm(&store).apply(&node(&[K]), 2).await.unwrap();
    assert!(rig.fake.members(K).contains_key(&G1));
    assert!(!ledger(&store)
        .guids(PKey::new(u32::from(K)).unwrap())
        .is_empty());

    // The agent goes down, its store is put back to the copy, and it starts again on it:
    // its desired set no longer carries K.
    drop(store);
    let store = rig.restore();
    assert!(ledger(&store).is_empty(), "the restored ledger forgot K");
    let restarted = Instant::now();
    let sm = rig.sm(&store);
    assert!(
        ledger(&store).restore_watched_until().is_some(),
        "the restore watch is durable before the first apply"
    );
    // The first apply finds G1 in K (the list read) and removes it, but acknowledges nothing:
    // the add executed late has not landed yet.
    assert!(!restore_watch(sm.apply(&node(&[]), 3).await));
    assert!(!rig.fake.members(K).contains_key(&G1), "removed at once");

    // UFM executes the stale add: G1 is back in K.
    while !rig.fake.members(K).contains_key(&G1) {
        assert!(
            sent.elapsed() < Duration::from_millis(1_800),
            "the late add never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next apply removes it again and reports the late write.
    assert!(!restore_watch(sm.apply(&node(&[]), 4).await));
    assert!(!rig.fake.members(K).contains_key(&G1));
    let conditions = sm.conditions();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0].kind.name(), "UFM_LATE_WRITE");

    // Acknowledged only after the window from the restart, by a read that shows K clear.
    let mut generation = 5;
    loop {
        let r = sm.apply(&node(&[]), generation).await;
        if r.is_ok() {
            break;
        }
        restore_watch(r);
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "never acknowledged"
        );
        generation += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(restarted.elapsed() >= Duration::from_millis(WINDOW_MS));
    assert!(!rig.fake.members(K).contains_key(&G1));
    assert!(ledger(&store).is_empty(), "{:?}", ledger(&store));
    assert!(sm.conditions().is_empty());
}

#[tokio::test]
async fn the_restore_watch_survives_a_crash_right_after_the_start() {
    let mut rig = Rig::new().await;
    rig.back_up_then_attach_k().await;
    let store = rig.restore();
    drop(rig.sm(&store));
    // Crash before any apply; the next start no longer sees the restore.
    drop(store);
    let store = rig.open();
    assert!(store.rolled_back().is_none());
    assert!(!restore_watch(rig.sm(&store).apply(&node(&[]), 3).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_list_keeps_the_restore_watch_standing() {
    let mut rig = Rig::new().await;
    rig.back_up_then_attach_k().await;
    // Another ~10 MB of partitions: the list answer exceeds the 8 MiB cap.
    for k in 0..1_600u16 {
        let members = (0..100u64)
            .map(|g| {
                let member = FakeMember {
                    membership: Membership::Full,
                    index0: false,
                };
                (0x0008_0000_0000_0000 + u64::from(k) * 1_000 + g, member)
            })
            .collect();
        let partition = FakePartition {
            name: format!("big{k}"),
            ip_over_ib: true,
            members,
        };
        rig.fake.insert_partition(0x2000 + k, partition);
    }
    let mut config = rig.config();
    config.late_write_window_ms = 100;
    config.request_timeout_ms = 20_000;
    let store = rig.restore();
    let sm = UfmSm::new(&config, Arc::new(StoreLedger(store.clone())))
        .unwrap()
        .after_restore(store.rolled_back())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Past the window, but no read of the whole list: still not acknowledged.
    assert!(restore_watch(sm.apply(&node(&[]), 3).await));
    assert!(restore_watch(sm.apply(&node(&[]), 4).await));
}
