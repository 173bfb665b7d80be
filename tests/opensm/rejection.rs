//! Bytes OpenSM rejected, against a fake OpenSM that rejects the reloads it is told to: a
//! release whose file OpenSM rejected once still goes through, a rejected set is never answered
//! OK, what a node was acknowledged stays in the file, and other rejected bytes are held back for
//! a hold that doubles, then written again.

use testkit::common;

use async_trait::async_trait;
use fabric_agent::domain::{Membership, NodeMemberships, PKey};
use fabric_agent::sm::opensm::file::accepted_copy_path;
use fabric_agent::sm::opensm::members::members_of;
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OpenSmError,
    OwnershipConfig, Rejection,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Rejects the next `reject_next` reloads (a parse error not caused by the bytes); records the
/// bytes of every file it was asked to re-read.
#[derive(Default)]
struct FakeOpenSm {
    path: PathBuf,
    reject_next: AtomicUsize,
    seen: Mutex<Vec<Vec<u8>>>,
}

#[async_trait]
impl Reloader for FakeOpenSm {
    fn checkpoint(&self) -> u64 {
        0
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        self.seen
            .lock()
            .unwrap()
            .push(std::fs::read(&self.path).unwrap());
        if self
            .reject_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ReloadError::Rejected("PARSE ERROR: line 2".into()));
        }
        Ok(ReloadReport { file_read: true })
    }
}

struct Host {
    _dir: tempfile::TempDir,
    path: PathBuf,
    opensm: Arc<FakeOpenSm>,
    store: Arc<InMemoryNodeStore>,
    backend: OpenSmBackend,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("partitions.conf");
        std::fs::write(&path, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
        let opensm = Arc::new(FakeOpenSm {
            path: path.clone(),
            ..FakeOpenSm::default()
        });
        let store = Arc::new(InMemoryNodeStore::default());
        let backend = Host::backend(&path, &opensm, &store);
        Host {
            _dir: dir,
            path,
            opensm,
            store,
            backend,
        }
    }

    /// A backend on the same file, store and OpenSM (a restarted agent).
    fn backend(
        path: &std::path::Path,
        opensm: &Arc<FakeOpenSm>,
        store: &Arc<InMemoryNodeStore>,
    ) -> OpenSmBackend {
        OpenSmBackend::with_reloader(
            OpenSmConfig {
                partitions_file: path.to_owned(),
                pid: Some(12345),
                watch_ms: 0,
                ownership: OwnershipConfig::disabled(),
                ..OpenSmConfig::default()
            },
            "smhost".into(),
            Arc::clone(store) as Arc<dyn NodeMembershipStore>,
            Arc::clone(opensm) as Arc<dyn Reloader>,
        )
        .unwrap()
    }

    /// Whether the partitions file gives `key` to port `guid`.
    fn file_gives(&self, key: u32, guid: u64) -> bool {
        let bytes = std::fs::read(&self.path).unwrap();
        members_of(&bytes, PKey::new(key).unwrap())
            .unwrap()
            .iter()
            .any(|m| m.guid.0 == guid)
    }

    fn reloads(&self) -> usize {
        self.opensm.seen.lock().unwrap().len()
    }
}

fn set(keys: &[u32]) -> NodeMemberships {
    common::memberships(
        "node-a",
        [0x10],
        keys.iter().map(|k| (*k, Membership::Full)),
        |_| String::new(),
    )
}

fn held(e: &OpenSmError) -> Option<u64> {
    match e {
        OpenSmError::Rejected(Rejection::Repeated { wait_s, .. }) => Some(*wait_s),
        _ => None,
    }
}

#[tokio::test]
async fn a_release_whose_file_opensm_rejected_once_goes_through() {
    let h = Host::new();
    h.backend.set_node(set(&[7]), 1).await.unwrap();
    let acked = std::fs::read(&h.path).unwrap();
    // The release's write is rejected: answered with the rejection, never OK, and the file the
    // node was acknowledged is put back (key 7 is still served: nothing acknowledged is lost).
    h.opensm.reject_next.store(1, Ordering::SeqCst);
    let e = h.backend.set_node(set(&[]), 2).await.unwrap_err();
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    assert_eq!(std::fs::read(&h.path).unwrap(), acked);
    assert!(h.file_gives(7, 0x10));
    // The retry renders the very bytes OpenSM rejected: they only take away from the accepted
    // file, so they are written again and the release commits.
    let before = h.reloads();
    h.backend.set_node(set(&[]), 2).await.unwrap();
    assert_eq!(h.reloads(), before + 1);
    assert!(!h.file_gives(7, 0x10));
    assert_eq!(
        std::fs::read(accepted_copy_path(&h.path)).unwrap(),
        std::fs::read(&h.path).unwrap()
    );
    assert!(h.backend.conditions_now().is_empty());
}

#[tokio::test]
async fn a_release_rejected_again_is_never_answered_ok_and_goes_through_after_a_restart() {
    let h = Host::new();
    h.backend.set_node(set(&[7, 8]), 1).await.unwrap();
    for _ in 0..2 {
        h.opensm.reject_next.store(1, Ordering::SeqCst);
        let e = h.backend.set_node(set(&[8]), 2).await.unwrap_err();
        assert!(
            matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
            "{e}"
        );
        assert!(h.file_gives(7, 0x10) && h.file_gives(8, 0x10));
    }
    assert!(h.store.load_commit_state().unwrap().rejected.is_some());
    // A restarted agent reads the rejected bytes back from beside the file and still lets the
    // release through.
    let restarted = Host::backend(&h.path, &h.opensm, &h.store);
    restarted.set_node(set(&[8]), 2).await.unwrap();
    assert!(!h.file_gives(7, 0x10) && h.file_gives(8, 0x10));
}

#[tokio::test(start_paused = true)]
async fn rejected_bytes_that_add_are_held_back_for_a_doubling_hold_then_written_again() {
    let h = Host::new();
    h.backend.set_node(set(&[7]), 1).await.unwrap();
    h.opensm.reject_next.store(1, Ordering::SeqCst);
    let e = h.backend.set_node(set(&[7, 8]), 2).await.unwrap_err();
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    // Held: the same bytes are not written again, and never answered OK.
    let before = h.reloads();
    let e = h.backend.set_node(set(&[7, 8]), 2).await.unwrap_err();
    assert!(held(&e).is_some_and(|s| (1..=60).contains(&s)), "{e}");
    assert_eq!(h.reloads(), before);
    assert!(!h.file_gives(8, 0x10));
    // After the hold they are written again; rejected a second time, the hold doubles.
    tokio::time::advance(Duration::from_secs(61)).await;
    h.opensm.reject_next.store(1, Ordering::SeqCst);
    let e = h.backend.set_node(set(&[7, 8]), 2).await.unwrap_err();
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    assert!(h.file_gives(7, 0x10) && !h.file_gives(8, 0x10));
    tokio::time::advance(Duration::from_secs(61)).await;
    let e = h.backend.set_node(set(&[7, 8]), 2).await.unwrap_err();
    assert!(held(&e).is_some_and(|s| (1..=60).contains(&s)), "{e}");
    tokio::time::advance(Duration::from_secs(60)).await;
    h.backend.set_node(set(&[7, 8]), 2).await.unwrap();
    assert!(h.file_gives(7, 0x10) && h.file_gives(8, 0x10));
    assert!(h.backend.conditions_now().is_empty());
}
