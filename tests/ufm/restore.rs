//! A UFM node whose store is restored from a copy: the restored ledger lacks the adds sent after
//! the copy, which may be in UFM or still land late. The backend, told of the restore at start
//! (`UfmSm::after_restore`, from `Store::rolled_back`), reads UFM's whole list and removes the
//! node's GUIDs from every key it does not give them until the late-write window from the start
//! is over, and acknowledges nothing before a read after that window showed every key right.

use fabric_agent::daemon::StoredUfmLedger;
use testkit::common;
use testkit::fake_ufm;

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
        UfmSm::new(&self.config(), Arc::new(StoredUfmLedger(store.clone())))
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
    match StoredUfmLedger(store.clone()).load().unwrap() {
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
    let sm = UfmSm::new(&config, Arc::new(StoredUfmLedger(store.clone())))
        .unwrap()
        .after_restore(store.rolled_back())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Past the window, but no read of the whole list: still not acknowledged.
    assert!(restore_watch(sm.apply(&node(&[]), 3).await));
    assert!(restore_watch(sm.apply(&node(&[]), 4).await));
}

/// The daemon started on a store restored from a copy: its UFM backend is told at start, so
/// even with per-key reads configured every apply reads the whole list and none is
/// acknowledged (the restore watch of the default 10-minute window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_on_a_restored_store_reads_the_whole_list_and_acknowledges_nothing() {
    let fake = FakeUfm::start().await;
    let cred = CredFile::new("admin:123456");
    let tmp = tempfile::tempdir().unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/mlx5-8x");
    let extra = format!(
        "[subnet_manager]\nbackend = \"ufm\"\n\
         [subnet_manager.ufm]\nurl = \"{}\"\ncredentials_file = \"{}\"\n\
         connect_timeout_ms = 500\nrequest_timeout_ms = 2000\nretries = 1\n\
         backoff_initial_ms = 50\nbackoff_max_ms = 100\nlist_reads = false\n\
         [observer]\nkind = \"sysfs\"\nsysfs_root = \"{}\"\n\
         [reconciler]\nbackoff_initial_ms = 100\nbackoff_max_ms = 300\n",
        fake.url(),
        cred.path().display(),
        fixture.display(),
    );
    let mut d = common::Daemon::prepare(tmp.path(), &extra);
    let db = tmp.path().join("state").join("state.redb");
    d.spawn(&[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !node_status(&d).await.subnet_manager.unwrap().reachable {
        assert!(Instant::now() < deadline, "the first start's apply");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(d.stop().success());
    let copy = std::fs::read(&db).unwrap();
    d.spawn(&[]);
    assert!(d.stop().success());

    // Put the old database back; its mirror beside it still names the newer one.
    std::fs::write(&db, copy).unwrap();
    fake.clear_requests();
    d.spawn(&[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sm = node_status(&d).await.subnet_manager.unwrap();
        assert!(!sm.reachable, "acknowledged after a restore: {sm:?}");
        if sm.applies >= 2 {
            assert!(sm.last_error.contains("restored from a copy"), "{sm:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no apply after the restore: {sm:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lists = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/ufmRest/resources/pkeys?guids_data=true")
        .count();
    assert!(
        lists >= 2,
        "every apply reads the whole list: {:?}",
        fake.requests()
    );
    assert!(d.stop().success());
}

async fn node_status(d: &common::Daemon) -> fabric_agent::proto::agent::GetNodeResponse {
    let request = fabric_agent::proto::agent::GetNodeRequest {};
    d.client()
        .await
        .get_node(request)
        .await
        .unwrap()
        .into_inner()
}
