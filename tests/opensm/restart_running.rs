//! The master SM host's agent restarted while its OpenSM keeps running (an agent upgrade), on
//! ibsim with two real OpenSMs and an SM-host agent beside each: node1's set is confirmed on
//! both hosts, then the master's agent is stopped (SIGTERM) and started again, killed (SIGKILL)
//! and started again, and stopped and started again while the peer's agent is down (so it
//! cannot catch up). A thread polls node1's port with `smpquery` throughout: the tenant key
//! never leaves it, and the master's partitions file never loses it (no commit before the
//! catch-up, held-back sets keep the keys the running file holds). Skipped when ibsim/OpenSM
//! are not installed.

use testkit::common;
use testkit::rig;

use common::sm_requests::set_memberships;
use common::{free_port, wait_until};
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::ha::{
    ha_sm_config, pkeys_of, region_of, sm_host_status, start_two_sms, SmHostAgent, TwoSmFiles,
};
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

/// What the poller saw: reads that answered, and each that lacked the key (with when).
#[derive(Default)]
struct Seen {
    reads: u64,
    files: u64,
    missing: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_masters_agent_beside_its_running_opensm_keeps_every_tenant_key() {
    let Some((fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let (pa, pb) = (free_port(), free_port());
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (a_files, b_files) = (files.sm_a(), files.sm_b());
    let a_part = files.a.0.clone();
    let mut sm_a = SmHostAgent::start(
        &fabric,
        "smhost",
        &ha_sm_config(&fabric, "smhost", pa, &a_files, &[pb]),
    );
    let mut sm_b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &ha_sm_config(&fabric, "smhost2", pb, &b_files, &[pa]),
    );
    let guid1 = fabric.node_info("node1").port_guid;
    let key = 0x0a41u32;
    let full = 0x8000 | key as u16;
    for port in [pa, pb] {
        let mut c = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect");
        c.set_node_memberships(set_memberships("node1", &[guid1], &[key], 1))
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}\n{}", sm_a.log_text(), sm_b.log_text()));
    }
    wait_until("node1 holds the key", LONG, || async {
        fabric.pkeys("node1").contains(&full)
    })
    .await;
    wait_until("both agents caught up", LONG, || async {
        sm_host_status(&sm_a).await.caught_up && sm_host_status(&sm_b).await.caught_up
    })
    .await;

    // Poll node1's port (smpquery) and the master's file from here to the end.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (seen, done) = (seen.clone(), done.clone());
        let (sock, dir) = (fabric.sock_name().to_owned(), fabric.dir().to_owned());
        let part = a_part.clone();
        let start = Instant::now();
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let port = pkeys_of(&sock, &dir, "node1");
                let region = region_of(&part);
                let mut s = seen.lock().unwrap();
                if let Some(keys) = port {
                    s.reads += 1;
                    if !keys.contains(&full) {
                        s.missing
                            .push(format!("port at {:?}: {keys:04x?}", start.elapsed()));
                    }
                }
                if !region.is_empty() {
                    s.files += 1;
                    if !region.contains(&format!("{key:#06x}")) {
                        s.missing
                            .push(format!("file at {:?}: {region}", start.elapsed()));
                    }
                }
            }
        })
    };

    // 1. SIGTERM and start again: catches up with the peer.
    assert!(sm_a.stop().success());
    sm_a.spawn();
    wait_until("the restarted agent caught up", LONG, || async {
        sm_host_status(&sm_a).await.caught_up
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 2. SIGKILL and start again.
    sm_a.crash();
    sm_a.spawn();
    wait_until("the restarted agent caught up again", LONG, || async {
        sm_host_status(&sm_a).await.caught_up
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 3. The peer's agent down: the restarted agent cannot catch up (READY after the
    // catch-up's timeout), and still the running file keeps node1's key.
    assert!(sm_b.stop().success());
    assert!(sm_a.stop().success());
    sm_a.spawn();
    let status = sm_host_status(&sm_a).await;
    assert!(!status.caught_up, "{status:?}");
    assert!(
        status.held_back_nodes.contains(&"node1".to_owned()),
        "{status:?}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;

    done.store(true, Ordering::SeqCst);
    poller.join().expect("poller");
    let s = seen.lock().unwrap();
    eprintln!(
        "{} port reads and {} file reads during three restarts of the master's agent",
        s.reads, s.files
    );
    assert!(
        s.reads > 10 && s.files > 10,
        "too few reads: {} {}",
        s.reads,
        s.files
    );
    assert!(
        s.missing.is_empty(),
        "the key left: {:#?}\n{}",
        s.missing,
        sm_a.log_text()
    );
    assert!(fabric.pkeys("node1").contains(&full));
    assert!(sm_a.stop().success());
    sm_b.spawn();
    assert!(sm_b.stop().success());
}

/// The commit gate alone (an OpenSM whose pid the agent cannot check, so nothing is kept from
/// its file): from the start until the catch-up's commit, a node's set waits and nothing is
/// written or signalled; the catch-up's commit writes, then the waiting set commits.
#[tokio::test]
async fn no_commit_for_a_node_before_the_catch_up_commit() {
    use async_trait::async_trait;
    use fabric_agent::daemon::StoredSmNodes;
    use fabric_agent::domain::Membership;
    use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader};
    use fabric_agent::sm::opensm::{
        NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
    };
    use fabric_agent::store::Store;
    use std::sync::atomic::AtomicU64;

    /// OpenSM re-reading every file at once, counting the signals.
    struct Opensm(AtomicU64);
    #[async_trait]
    impl Reloader for Opensm {
        fn checkpoint(&self) -> u64 {
            0
        }
        async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(ReloadReport { file_read: true })
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("partitions.conf");
    std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let store = Arc::new(Store::open(&dir.path().join("state.redb"), 1000).unwrap());
    let config = OpenSmConfig {
        partitions_file: file.clone(),
        watch_ms: 0,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    let opensm = Arc::new(Opensm(AtomicU64::new(0)));
    let nodes = Arc::new(StoredSmNodes(store)) as Arc<dyn NodeMembershipStore>;
    let b = OpenSmBackend::with_reloader(config, "smhost".into(), nodes, opensm.clone()).unwrap();
    b.hold_commits_until_caught_up();
    assert!(b.commits_held());
    let set = common::memberships("node1", [0x11], [(0x0a12, Membership::Full)], |_| {
        String::new()
    });
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.set_node_from_node(set, &[], 1).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a node's set committed before the catch-up"
    );
    assert_eq!((b.writes(), opensm.0.load(Ordering::SeqCst)), (0, 0));
    assert!(b.node("node1").is_none(), "admitted before the catch-up");
    b.caught_up_commit().await.expect("the catch-up's commit");
    assert!(!b.commits_held());
    waiting
        .await
        .unwrap()
        .expect("the node's set after the catch-up");
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .contains("0x0000000000000011"));
}
