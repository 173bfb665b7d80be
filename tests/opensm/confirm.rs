//! Confirmation comes from OpenSM itself, on an ibsim fabric with a real OpenSM: with OpenSM
//! stopped (SIGSTOP, by the pid the rig started) and a thread reading the partitions file every
//! 2 ms, a set adding a key is never answered OK; once OpenSM runs again (SIGCONT) the next
//! attempt is confirmed and the key reaches the port. Skipped when ibsim/OpenSM are missing.

use testkit::common;
use testkit::rig;

use fabric_agent::domain::{Membership, NodeMemberships};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, OpenSmBackend, OpenSmConfig, OpenSmError, OwnershipConfig,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rig::{Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS, SM_HOST};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn node(id: &str, guid: u64, keys: &[(u32, Membership)]) -> NodeMemberships {
    common::memberships(id, [guid], keys.iter().copied(), |k| format!("tenant{k:x}"))
}

fn backend(fabric: &Fabric, reload_check_ms: u64) -> OpenSmBackend {
    let config = OpenSmConfig {
        partitions_file: fabric.partitions_path(),
        log_file: fabric.opensm_log_path(),
        pid_file: Some(fabric.opensm_pid_path()),
        ownership: OwnershipConfig::disabled(),
        reload_check_ms,
        watch_ms: 0,
        ..OpenSmConfig::default()
    };
    OpenSmBackend::new(
        config,
        SM_HOST.into(),
        Arc::new(InMemoryNodeStore::default()),
    )
    .unwrap()
}

/// Sends SIGCONT to OpenSM when dropped: a failing assertion never leaves it stopped.
struct Continue(Pid);

impl Drop for Continue {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// Reads `path` every 2 ms until `stop` (moving its access time like a backup or `cat` would);
/// counts the reads.
fn reader(path: std::path::PathBuf, stop: Arc<AtomicBool>, reads: Arc<AtomicU64>) {
    while !stop.load(Ordering::SeqCst) {
        if std::fs::read(&path).is_ok() {
            reads.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_the_file_cannot_confirm_a_write_while_opensm_is_stopped() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    let g1 = fabric.node_info("node1").port_guid;
    let backend = backend(&fabric, 1500);
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reading = {
        let (path, stop, reads) = (fabric.partitions_path(), stop.clone(), reads.clone());
        std::thread::spawn(move || reader(path, stop, reads))
    };

    // A first key, confirmed while OpenSM runs: the fence works with the reader racing.
    let first = backend
        .set_node(node("node1", g1, &[(0x0a12, Membership::Full)]), 1)
        .await
        .unwrap();
    assert!(first.detail.contains("without error"), "{}", first.detail);

    let pid = Pid::from_raw(fabric.opensm_pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let resume = Continue(pid);
    let reads_before = reads.load(Ordering::SeqCst);
    let started = Instant::now();
    let stopped = backend
        .set_node(
            node(
                "node1",
                g1,
                &[(0x0a12, Membership::Full), (0x0b34, Membership::Full)],
            ),
            2,
        )
        .await;
    let reads_during = reads.load(Ordering::SeqCst) - reads_before;
    match &stopped {
        Err(OpenSmError::Unconfirmed { .. }) => {}
        other => panic!("a write OpenSM never swept was answered {other:?}"),
    }
    assert!(
        reads_during > 50,
        "the reader read the file only {reads_during} times"
    );
    assert!(started.elapsed() >= Duration::from_millis(1400));
    let conditions = backend.conditions_now();
    assert!(
        conditions
            .iter()
            .any(|c| c.kind == fabric_agent::domain::ConditionKind::PartitionsFileUnconfirmed),
        "{conditions:?}"
    );
    assert!(!fabric.pkeys("node1").contains(&0x8b34));

    drop(resume);
    // The retry (same generation, same set) is confirmed by OpenSM's own sweeps.
    let again = backend
        .set_node(
            node(
                "node1",
                g1,
                &[(0x0a12, Membership::Full), (0x0b34, Membership::Full)],
            ),
            2,
        )
        .await
        .unwrap();
    assert!(again.detail.contains("without error"), "{}", again.detail);
    assert!(backend.conditions_now().is_empty());
    common::wait_for("node1 to hold 0x8b34", Duration::from_secs(10), || {
        fabric.pkeys("node1").contains(&0x8b34)
    });
    stop.store(true, Ordering::SeqCst);
    reading.join().unwrap();
}

/// Commit-to-confirmed latency with the sweep fence (two heavy sweeps after the write), printed
/// for docs/PERFORMANCE.md: `cargo test --test opensm confirm:: -- --nocapture latency`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_commit_latency() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    let g1 = fabric.node_info("node1").port_guid;
    let backend = backend(&fabric, 3000);
    let mut times = Vec::new();
    for generation in 1..=10u64 {
        let key = 0x0c00 + generation as u32;
        let started = Instant::now();
        backend
            .set_node(node("node1", g1, &[(key, Membership::Full)]), generation)
            .await
            .unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    eprintln!(
        "confirmed commit latency over {} commits: min {:?}, median {:?}, max {:?}",
        times.len(),
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
    assert!(times[times.len() / 2] < Duration::from_millis(1500));
}
