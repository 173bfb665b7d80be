//! `OpenSmBackend::shutdown`: the backend ends where it stands, as a crash of its process would.
//! Its group-commit loop is aborted at its await point (no later group is written or
//! signalled), waiting callers get an error, and later requests are refused unstored.

use testkit::common;

use async_trait::async_trait;
use fabric_agent::domain::{Membership, NodeMemberships};
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OpenSmError,
    OwnershipConfig,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// OpenSM taking `delay` to re-read the file; counts the signals.
struct SlowReloader {
    delay: Duration,
    calls: AtomicUsize,
}

#[async_trait]
impl Reloader for SlowReloader {
    fn checkpoint(&self) -> u64 {
        0
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        Ok(ReloadReport { file_read: true })
    }
}

fn node(id: &str, guid: u64, key: u32) -> NodeMemberships {
    common::memberships(id, [guid], [(key, Membership::Full)], |_| String::new())
}

/// A backend on the partitions file at `path` (no log watch, no ownership checks).
fn start(
    path: &std::path::Path,
    store: &Arc<InMemoryNodeStore>,
    reloader: &Arc<SlowReloader>,
) -> OpenSmBackend {
    let config = OpenSmConfig {
        partitions_file: path.to_owned(),
        watch_ms: 0,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    let store = Arc::clone(store) as Arc<dyn NodeMembershipStore>;
    let reloader = Arc::clone(reloader) as Arc<dyn Reloader>;
    OpenSmBackend::with_reloader(config, "smhost".into(), store, reloader).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_shut_down_backend_writes_and_signals_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partitions.conf");
    std::fs::write(&path, b"").unwrap();
    let reloader = Arc::new(SlowReloader {
        delay: Duration::from_secs(5),
        calls: AtomicUsize::new(0),
    });
    let store = Arc::new(InMemoryNodeStore::default());
    let backend = start(&path, &store, &reloader);
    // The first set's commit is waiting for OpenSM; the second joins the next group.
    let first = tokio::spawn({
        let b = backend.clone();
        async move { b.set_node(node("a", 0x10, 7), 1).await }
    });
    while reloader.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = tokio::spawn({
        let b = backend.clone();
        async move { b.set_node(node("b", 0x20, 8), 1).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let written = std::fs::read(&path).unwrap();

    backend.shutdown();
    assert!(backend.is_shut_down());
    for waiter in [first, second] {
        let r = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("a waiting caller is answered at once")
            .unwrap();
        assert!(matches!(r, Err(OpenSmError::Task { .. })), "{r:?}");
    }
    // Long after OpenSM would have answered: no second group written or signalled.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(reloader.calls.load(Ordering::SeqCst), 1);
    assert_eq!(std::fs::read(&path).unwrap(), written);
    // A later request is refused before anything is stored.
    let r = backend.set_node(node("c", 0x30, 9), 1).await;
    assert!(matches!(r, Err(OpenSmError::Task { .. })), "{r:?}");
    assert!(backend.node("c").is_none());
    assert!(store
        .load_all()
        .unwrap()
        .iter()
        .all(|n| n.memberships.node_id.as_str() != "c"));
    // A new backend on the same store starts from what was stored.
    let again = start(&path, &store, &reloader);
    again.set_node(node("c", 0x30, 9), 1).await.unwrap();
    assert!(again.node("c").is_some());
}
