//! Bytes OpenSM rejected, against a fake OpenSM that rejects the reloads it is told to (or every
//! file giving one key to one port): a release whose file OpenSM rejected once still goes
//! through, a rejected set is never answered OK, what a node was acknowledged stays in the file,
//! and other rejected bytes are held back for a hold that doubles, then written again. Another
//! node's release is not held up by a held or just rejected addition: written at once without
//! it, in the same commit or during the hold. After three rejections of the same addition it is
//! refused (no more fail-open windows) until the node's set changes. The same on the ibsim rig:
//! `tests/opensm/isolation.rs`.

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

/// Rejects the next `reject_next` reloads (a parse error not caused by the bytes), and every
/// file that gives the `poison` (key, port); records the bytes of every file it was asked to
/// re-read.
#[derive(Default)]
struct FakeOpenSm {
    path: PathBuf,
    reject_next: AtomicUsize,
    /// The next reloads that do not see OpenSM re-read the file (it is slow or stopped).
    unseen_next: AtomicUsize,
    poison: Mutex<Option<(u32, u64)>>,
    seen: Mutex<Vec<Vec<u8>>>,
}

#[async_trait]
impl Reloader for FakeOpenSm {
    fn checkpoint(&self) -> u64 {
        0
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        let bytes = std::fs::read(&self.path).unwrap();
        let poisoned = self
            .poison
            .lock()
            .unwrap()
            .is_some_and(|(key, guid)| gives(&bytes, key, guid));
        self.seen.lock().unwrap().push(bytes);
        if take_one(&self.unseen_next) {
            return Ok(ReloadReport { file_read: false });
        }
        if poisoned || take_one(&self.reject_next) {
            return Err(ReloadError::Rejected("PARSE ERROR: line 2".into()));
        }
        Ok(ReloadReport { file_read: true })
    }
}

/// Takes one from `n`; false when it is 0.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
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
        gives(&std::fs::read(&self.path).unwrap(), key, guid)
    }

    fn reloads(&self) -> usize {
        self.opensm.seen.lock().unwrap().len()
    }
}

/// Whether `file` gives `key` to port `guid`.
fn gives(file: &[u8], key: u32, guid: u64) -> bool {
    members_of(file, PKey::new(key).unwrap())
        .unwrap()
        .iter()
        .any(|m| m.guid.0 == guid)
}

fn set(keys: &[u32]) -> NodeMemberships {
    node_set("node-a", 0x10, keys)
}

fn node_set(node: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    common::memberships(
        node,
        [guid],
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

/// node-a holds 7 on port 0x10, node-b holds 9 on port 0x20; OpenSM rejects every file giving
/// 8 to node-b's port.
async fn two_nodes_and_a_poisoned_addition() -> Host {
    let h = Host::new();
    h.backend.set_node(set(&[7]), 1).await.unwrap();
    h.backend
        .set_node(node_set("node-b", 0x20, &[9]), 1)
        .await
        .unwrap();
    *h.opensm.poison.lock().unwrap() = Some((8, 0x20));
    h
}

#[tokio::test(start_paused = true)]
async fn another_nodes_release_goes_through_while_an_addition_is_held() {
    let h = two_nodes_and_a_poisoned_addition().await;
    let e = h
        .backend
        .set_node(node_set("node-b", 0x20, &[9, 8]), 2)
        .await
        .unwrap_err();
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    // node-a's release, during node-b's hold: one write, without node-b's addition, confirmed.
    let before = h.reloads();
    h.backend.set_node(set(&[]), 2).await.unwrap();
    assert_eq!(h.reloads(), before + 1);
    assert!(!h.file_gives(7, 0x10) && h.file_gives(9, 0x20) && !h.file_gives(8, 0x20));
    assert_eq!(
        std::fs::read(accepted_copy_path(&h.path)).unwrap(),
        std::fs::read(&h.path).unwrap()
    );
    // node-b is still held, never answered OK; the rejection stays shown.
    let e = h
        .backend
        .set_node(node_set("node-b", 0x20, &[9, 8]), 2)
        .await
        .unwrap_err();
    assert!(held(&e).is_some_and(|s| (1..=60).contains(&s)), "{e}");
    assert!(h
        .backend
        .conditions_now()
        .iter()
        .any(|c| c.kind == fabric_agent::domain::ConditionKind::PartitionsFileRejected));
    // node-a's own addition is not held back either.
    h.backend.set_node(set(&[6]), 3).await.unwrap();
    assert!(h.file_gives(6, 0x10) && !h.file_gives(8, 0x20));
    // A restarted agent still holds node-b's addition back and lets node-a's next release
    // through.
    let restarted = Host::backend(&h.path, &h.opensm, &h.store);
    restarted.set_node(set(&[]), 4).await.unwrap();
    assert!(!h.file_gives(6, 0x10) && !h.file_gives(8, 0x20));
    // After the hold, with OpenSM taking it now, node-b's addition is written and confirmed.
    *h.opensm.poison.lock().unwrap() = None;
    tokio::time::advance(Duration::from_secs(61)).await;
    restarted
        .set_node(node_set("node-b", 0x20, &[9, 8]), 2)
        .await
        .unwrap();
    assert!(h.file_gives(8, 0x20));
    assert!(restarted.conditions_now().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_release_in_the_same_commit_as_a_rejected_addition_goes_through() {
    let h = two_nodes_and_a_poisoned_addition().await;
    let before = h.reloads();
    let (release, addition) = tokio::join!(
        h.backend.set_node(set(&[]), 2),
        h.backend.set_node(node_set("node-b", 0x20, &[9, 8]), 2)
    );
    let seen = h.opensm.seen.lock().unwrap()[before..].to_vec();
    // One group: its file (the release and the addition) rejected, the accepted file put back,
    // then the file with the release alone.
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(!gives(&seen[0], 7, 0x10) && gives(&seen[0], 8, 0x20));
    assert!(gives(&seen[1], 7, 0x10));
    assert!(!gives(&seen[2], 7, 0x10) && !gives(&seen[2], 8, 0x20) && gives(&seen[2], 9, 0x20));
    release.unwrap();
    let e = addition.unwrap_err();
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    assert_eq!(std::fs::read(&h.path).unwrap(), seen[2]);
}

#[tokio::test(start_paused = true)]
async fn a_release_after_an_unconfirmed_addition_goes_through_when_opensm_rejects_that() {
    let h = two_nodes_and_a_poisoned_addition().await;
    // node-b's addition is written but OpenSM is not seen re-reading it: unconfirmed, no verdict.
    h.opensm.unseen_next.store(1, Ordering::SeqCst);
    let e = h
        .backend
        .set_node(node_set("node-b", 0x20, &[9, 8]), 2)
        .await
        .unwrap_err();
    assert!(matches!(e, OpenSmError::Unconfirmed { .. }), "{e}");
    // node-a's release renders node-b's unconfirmed addition too; OpenSM rejects that file, and
    // the file without the addition is written and confirmed in the same commit.
    h.backend.set_node(set(&[]), 2).await.unwrap();
    assert!(!h.file_gives(7, 0x10) && h.file_gives(9, 0x20) && !h.file_gives(8, 0x20));
    let e = h
        .backend
        .set_node(node_set("node-b", 0x20, &[9, 8]), 2)
        .await
        .unwrap_err();
    assert!(held(&e).is_some(), "{e}");
}

fn refused(e: &OpenSmError) -> bool {
    matches!(e, OpenSmError::Rejected(Rejection::Refused { .. }))
}

fn rejected_shown(h: &Host) -> bool {
    h.backend
        .conditions_now()
        .iter()
        .any(|c| c.kind == fabric_agent::domain::ConditionKind::PartitionsFileRejected)
}

#[tokio::test(start_paused = true)]
async fn an_addition_rejected_three_times_is_refused_until_the_nodes_set_changes() {
    let h = two_nodes_and_a_poisoned_addition().await;
    let b = |keys: &[u32]| node_set("node-b", 0x20, keys);
    // Three rejections of node-b's addition, each after its hold (1 min, then 2 min).
    for wait in [0, 61, 121] {
        tokio::time::advance(Duration::from_secs(wait)).await;
        let e = h.backend.set_node(b(&[9, 8]), 2).await.unwrap_err();
        assert!(
            matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
            "{e}"
        );
    }
    // Refused now: however long it waits, the same set is not written again (no fail-open
    // window per retry), never answered OK, and the rejection stays shown.
    let before = h.reloads();
    for _ in 0..4 {
        tokio::time::advance(Duration::from_secs(700)).await;
        let e = h.backend.set_node(b(&[9, 8]), 2).await.unwrap_err();
        assert!(refused(&e), "{e}");
        assert!(e.to_string().contains("3 times"), "{e}");
    }
    assert_eq!(h.reloads(), before);
    assert!(!h.file_gives(8, 0x20) && h.file_gives(9, 0x20));
    assert!(rejected_shown(&h));
    // Another node's attach and release go through meanwhile, without node-b's addition.
    h.backend.set_node(set(&[7, 6]), 2).await.unwrap();
    h.backend.set_node(set(&[6]), 3).await.unwrap();
    assert!(h.file_gives(6, 0x10) && !h.file_gives(7, 0x10) && !h.file_gives(8, 0x20));
    assert!(rejected_shown(&h));
    // node-b's set changes (one key more): written once more; OpenSM rejects it again, and it
    // is refused again at once, with no hold to wait out.
    let before = h.reloads();
    let e = h.backend.set_node(b(&[9, 8, 5]), 3).await.unwrap_err();
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    assert!(h.reloads() > before);
    let before = h.reloads();
    tokio::time::advance(Duration::from_secs(700)).await;
    let e = h.backend.set_node(b(&[9, 8, 5]), 3).await.unwrap_err();
    assert!(refused(&e), "{e}");
    assert_eq!(h.reloads(), before);
    // A set without the rejected key is written and confirmed; the condition clears.
    h.backend.set_node(b(&[9, 5]), 4).await.unwrap();
    assert!(h.file_gives(5, 0x20) && !h.file_gives(8, 0x20));
    assert!(!rejected_shown(&h));
}
