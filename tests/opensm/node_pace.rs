//! The per-node commit rate on the SM host (`node_commit_interval_ms`): a node that changes its
//! set as fast as it can gets at most one admission per interval, so it cannot keep OpenSM
//! sweeping; every change is still stored and answered only once committed; a burst of
//! concurrent changes shares one slot; and another node's change meanwhile is not held.

use testkit::common;

use common::memberships::memberships;
use common::sm_host::AcceptingReloader;
use fabric_agent::domain::{Membership, NodeMemberships};
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend, OpenSmConfig, OwnershipConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INTERVAL: Duration = Duration::from_millis(250);

fn set(node: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    memberships(
        node,
        [guid],
        keys.iter().map(|k| (*k, Membership::Full)),
        |_| String::new(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_node_is_paced_and_another_node_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partitions.conf");
    std::fs::write(&path, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let backend = OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: path.clone(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            node_commit_interval_ms: INTERVAL.as_millis() as u64,
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::new(InMemoryNodeStore::default()),
        Arc::new(AcceptingReloader),
    )
    .unwrap();

    // node1 toggles a key as fast as its answers come: 8 real changes.
    let fast = {
        let backend = backend.clone();
        let path = path.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            for g in 1..=8u64 {
                let keys: &[u32] = if g % 2 == 1 {
                    &[0x0a11, 0x0a12]
                } else {
                    &[0x0a11]
                };
                backend.set_node(set("node1", 0x10, keys), g).await.unwrap();
                // Answered only once committed: the file holds what this generation asked.
                let text = std::fs::read_to_string(&path).unwrap();
                assert_eq!(
                    text.contains("0x0a12"),
                    g % 2 == 1,
                    "generation {g}: {text}"
                );
            }
            t0.elapsed()
        })
    };
    // Meanwhile node2's change is answered without waiting for node1's slots.
    tokio::time::sleep(INTERVAL / 2).await;
    let t = Instant::now();
    backend
        .set_node(set("node2", 0x20, &[0x0a21]), 1)
        .await
        .unwrap();
    assert!(t.elapsed() < INTERVAL, "node2 waited {:?}", t.elapsed());
    let took = fast.await.unwrap();
    // 8 admissions, one per interval at most: at least 7 intervals.
    assert!(took >= INTERVAL * 7, "node1's 8 changes took {took:?}");
    assert_eq!(backend.node("node1").unwrap().generation, 8);

    // A burst of concurrent changes shares one slot: one commit, the newest set wins.
    let sweeps = backend.sweeps();
    let burst = (9..=12u64).map(|g| {
        let backend = backend.clone();
        async move {
            let keys: Vec<u32> = (0..g as u32 - 8).map(|i| 0x0b00 + i).collect();
            backend.set_node(set("node1", 0x10, &keys), g).await
        }
    });
    for answer in futures::future::join_all(burst).await {
        // Each is stored and answered, or found superseded by a newer one of the same slot.
        if let Err(e) = answer {
            assert!(e.to_string().contains("generation"), "{e}");
        }
    }
    assert_eq!(backend.node("node1").unwrap().generation, 12);
    assert!(
        backend.sweeps() - sweeps <= 2,
        "{} sweeps",
        backend.sweeps() - sweeps
    );
}
