//! The OpenSM backend against a fake reloader: region ownership, atomic writes, refusals,
//! validation, fenced generations, fail-closed confirmation, restoring the last accepted file,
//! the insecure-Default posture, tenant names that cannot resolve operator entries,
//! persistence and group commit.

use testkit::common;

use async_trait::async_trait;
use fabric_agent::domain::ConditionKind;
use fabric_agent::domain::{Guid, Membership, NodeMemberships};
use fabric_agent::sm::opensm::file::{accepted_copy_path, rejected_copy_path};
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::region::{
    split_region, Collision, RegionError, BEGIN_MARKER, END_MARKER,
};
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader, Unsignalled};
use fabric_agent::sm::opensm::OwnershipConfig;
use fabric_agent::sm::opensm::{
    FullDefault, InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OpenSmError,
    Rejection, Restored, TableOverflow,
};
use fabric_agent::sm::{SmError, SubnetManager};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counts reloads, checks every file it is asked to reload parses, and can fail on demand: every
/// reload (`fail`), the next `reject_next` reloads (rejected), or by not seeing the re-read
/// (`unseen`). `foreign` lines are rejections OpenSM logged on its own (the fake log).
struct FakeReloader {
    path: PathBuf,
    delay: Duration,
    calls: AtomicUsize,
    unparsable: AtomicUsize,
    fail: Mutex<Option<ReloadError>>,
    reject_next: AtomicUsize,
    unseen: std::sync::atomic::AtomicBool,
    foreign: Mutex<Vec<String>>,
    /// Every file reloaded, in order.
    seen: Mutex<Vec<Vec<u8>>>,
}

impl FakeReloader {
    fn new(path: &Path, delay: Duration) -> Arc<Self> {
        Arc::new(FakeReloader {
            path: path.to_owned(),
            delay,
            calls: AtomicUsize::new(0),
            unparsable: AtomicUsize::new(0),
            fail: Mutex::new(None),
            reject_next: AtomicUsize::new(0),
            unseen: std::sync::atomic::AtomicBool::new(false),
            foreign: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Reloader for FakeReloader {
    fn checkpoint(&self) -> u64 {
        self.foreign.lock().unwrap().len() as u64
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let bytes = std::fs::read(&self.path).unwrap();
        if parse(&bytes).map_or(true, |c| !c.has_explicit_default()) {
            self.unparsable.fetch_add(1, Ordering::SeqCst);
        }
        self.seen.lock().unwrap().push(bytes);
        tokio::time::sleep(self.delay).await;
        if let Some(e) = self.fail.lock().unwrap().clone() {
            return Err(e);
        }
        if self
            .reject_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ReloadError::Rejected("PARSE ERROR: line 9".into()));
        }
        Ok(ReloadReport {
            file_read: !self.unseen.load(Ordering::SeqCst),
        })
    }
    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        // The fake log holds only the foreign lines: line i ends at offset i + 1.
        let lines = self.foreign.lock().unwrap();
        let from = usize::try_from(offset).unwrap().min(lines.len());
        (lines[from..].to_vec(), lines.len() as u64)
    }
}

fn kinds(b: &OpenSmBackend) -> Vec<ConditionKind> {
    b.conditions_now().into_iter().map(|c| c.kind).collect()
}

/// A backend on a fake reloader and a partitions file in its own temp dir, storing its sets in
/// `store`.
struct Setup<S = InMemoryNodeStore> {
    _dir: tempfile::TempDir,
    path: PathBuf,
    reloader: Arc<FakeReloader>,
    store: Arc<S>,
    backend: OpenSmBackend,
}

impl<S> Setup<S> {
    /// Stores `desired` at `generation`; panics if refused.
    async fn set_ok(&self, desired: NodeMemberships, generation: u64) {
        self.backend.set_node(desired, generation).await.unwrap();
    }
}

fn setup(initial: &[u8], delay: Duration, tweak: impl FnOnce(&mut OpenSmConfig)) -> Setup {
    setup_with(InMemoryNodeStore::default(), initial, delay, tweak)
}

fn setup_with<S: NodeMembershipStore + 'static>(
    store: S,
    initial: &[u8],
    delay: Duration,
    tweak: impl FnOnce(&mut OpenSmConfig),
) -> Setup<S> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partitions.conf");
    std::fs::write(&path, initial).unwrap();
    let mut config = OpenSmConfig {
        partitions_file: path.clone(),
        log_file: dir.path().join("opensm.log"),
        pid: Some(12345),
        watch_ms: 0,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    tweak(&mut config);
    let reloader = FakeReloader::new(&path, delay);
    let store = Arc::new(store);
    let backend = OpenSmBackend::with_reloader(
        config,
        "smhost".into(),
        Arc::clone(&store) as Arc<dyn NodeMembershipStore>,
        Arc::clone(&reloader) as Arc<dyn Reloader>,
    )
    .unwrap();
    Setup {
        _dir: dir,
        path,
        reloader,
        store,
        backend,
    }
}

fn node(id: &str, guids: &[u64], keys: &[(u32, Membership)]) -> NodeMemberships {
    common::memberships(id, guids.iter().copied(), keys.iter().copied(), |_| {
        String::new()
    })
}

const BEFORE: &str = "# Operator's file.\n#   Spacing, comments and order are theirs.\nstorage=0x0100, ipoib :\n\tALL_SWITCHES=full,   SELF=full ;\n\n";
const AFTER: &str = "\n# trailing operator notes\nmgmt=0x0200 : SELF=full; # no newline at end";

fn with_region(region_body: &str) -> String {
    format!("{BEFORE}{BEGIN_MARKER}\n{region_body}{END_MARKER}\n{AFTER}")
}

#[tokio::test]
async fn operator_bytes_survive_hundreds_of_edits_and_file_never_empties() {
    let s = setup(with_region("").as_bytes(), Duration::ZERO, |_| {});
    let mut rng_state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    for round in 0..300u64 {
        let n = next() % 20;
        let keys: Vec<(u32, Membership)> = (0..next() % 5)
            .map(|_| {
                let m = if next() % 2 == 0 {
                    Membership::Full
                } else {
                    Membership::Limited
                };
                (1 + (next() % 40) as u32, m)
            })
            .collect();
        s.set_ok(node(&format!("n{n}"), &[0x1000 + n], &keys), round)
            .await;
        let bytes = std::fs::read(&s.path).unwrap();
        let parts = split_region(&bytes).unwrap();
        assert_eq!(parts.before, BEFORE.as_bytes(), "round {round}");
        assert_eq!(parts.after, AFTER.as_bytes(), "round {round}");
        let conf = parse(&bytes).unwrap();
        assert!(conf.has_explicit_default());
    }
    // Release everything: the file still loads and still has an explicit Default entry.
    for n in 0..20u64 {
        s.set_ok(node(&format!("n{n}"), &[0x1000 + n], &[]), 1000)
            .await;
    }
    let bytes = std::fs::read(&s.path).unwrap();
    let conf = parse(&bytes).unwrap();
    assert!(conf.has_explicit_default());
    assert_eq!(
        conf.keys().filter(|k| *k != 0x7fff).collect::<Vec<_>>(),
        vec![0x0100, 0x0200]
    );
    assert_eq!(s.reloader.unparsable.load(Ordering::SeqCst), 0);
    let parts = split_region(&bytes).unwrap();
    assert_eq!(parts.before, BEFORE.as_bytes());
    assert_eq!(parts.after, AFTER.as_bytes());
}

#[tokio::test]
async fn region_lists_every_node_with_membership_and_keeps_operator_default() {
    let operator = "Default=0x7fff, ipoib : ALL=full;\n";
    let s = setup(operator.as_bytes(), Duration::ZERO, |c| {
        c.allow_full_default = true
    });
    s.set_ok(node("a", &[0x10, 0x11], &[(0x0a12, Membership::Full)]), 1)
        .await;
    s.set_ok(node("b", &[0x20], &[(0x0a12, Membership::Limited)]), 1)
        .await;
    let text = std::fs::read_to_string(&s.path).unwrap();
    assert!(text.starts_with(operator), "{text}");
    assert!(text.contains("0x0000000000000010=full"), "{text}");
    assert!(text.contains("0x0000000000000020=limited"), "{text}");
    // The operator's Default is explicit: the region adds none.
    assert_eq!(text.matches("Default=").count(), 1, "{text}");
    let conf = parse(text.as_bytes()).unwrap();
    assert_eq!(conf.effective()[&0x0a12].members.len(), 3);
}

/// A node whose instances hold different partitions gives each key only to its own ports.
#[tokio::test]
async fn each_key_goes_only_to_the_ports_its_set_names() {
    let operator = "Default=0x7fff, ipoib : ALL=full;\n";
    let s = setup(operator.as_bytes(), Duration::ZERO, |c| {
        c.allow_full_default = true
    });
    let mut set = node(
        "a",
        &[0x10, 0x11],
        &[(0x0a12, Membership::Full), (0x0b12, Membership::Full)],
    );
    for (key, guid) in [(0x0a12u32, 0x10u64), (0x0b12, 0x11)] {
        let k = fabric_agent::domain::PKey::new(key).unwrap();
        set.keys.get_mut(&k).unwrap().ports = Some([Guid(guid)].into());
    }
    s.set_ok(set, 1).await;
    let text = std::fs::read_to_string(&s.path).unwrap();
    let conf = parse(text.as_bytes()).unwrap();
    let effective = conf.effective();
    assert_eq!(effective[&0x0a12].members.len(), 1, "{text}");
    assert_eq!(effective[&0x0b12].members.len(), 1, "{text}");
    // Each key's entry names its own port only.
    let entry = |key: &str| -> String {
        let start = text.find(key).unwrap_or_else(|| panic!("{key} in {text}"));
        let end = start + text[start..].find(';').expect("entry end");
        text[start..end].to_owned()
    };
    let (a, b) = (entry("=0x0a12"), entry("=0x0b12"));
    assert!(
        a.contains("0x0000000000000010=full") && !a.contains("0x0000000000000011"),
        "{a}"
    );
    assert!(
        b.contains("0x0000000000000011=full") && !b.contains("0x0000000000000010"),
        "{b}"
    );
}

#[tokio::test]
async fn broken_operator_file_is_left_alone_and_refused() {
    let markers = format!("{BEGIN_MARKER}\n{END_MARKER}\n");
    let broken = [
        format!("storage=0x0100 : ALL_SWITCHES=full, not-a-guid;\n{markers}"),
        format!("Default=0x7fff : ALL=full;\r\n{markers}"),
        format!("storage=0x0100 : ALL_SWITCHES=full\n{markers}"),
        format!("{BEGIN_MARKER}\nDefault=0x7fff : ALL;\n"),
    ];
    for text in broken {
        let s = setup(text.as_bytes(), Duration::ZERO, |_| {});
        let err = s
            .backend
            .set_node(node("a", &[0x10], &[(1, Membership::Full)]), 1)
            .await
            .unwrap_err();
        assert!(matches!(err, OpenSmError::OperatorFile(_)), "{err}");
        assert_eq!(std::fs::read(&s.path).unwrap(), text.as_bytes());
        assert_eq!(s.reloader.calls(), 0);
        let sm_err: SmError = err.into();
        assert!(!sm_err.is_transient());
    }
    // A comment-only operator part is fine: the region completes it.
    let s = setup(b"# all commented out\n", Duration::ZERO, |_| {});
    s.set_ok(node("a", &[0x10], &[(1, Membership::Full)]), 1)
        .await;
}

#[tokio::test]
async fn requests_are_validated() {
    let s = setup(b"storage=0x0100 : ALL=full;\n", Duration::ZERO, |c| {
        c.pkey_table_size = 4
    });
    // A bad node id cannot make a set: it is refused where it is parsed.
    assert!(fabric_agent::domain::NodeId::parse("bad id!").is_err());
    let zero = node("a", &[0], &[]);
    assert!(matches!(
        s.backend.set_node(zero, 1).await,
        Err(OpenSmError::Invalid(_))
    ));
    let op_key = node("a", &[0x10], &[(0x0100, Membership::Full)]);
    assert!(matches!(
        s.backend.set_node(op_key, 1).await,
        Err(OpenSmError::OperatorKey { key, .. }) if key.base() == 0x0100
    ));
    // Default + storage (ALL) + 3 tenant keys = 5 > 4.
    let full = node(
        "a",
        &[0x10],
        &[
            (1, Membership::Full),
            (2, Membership::Full),
            (3, Membership::Full),
        ],
    );
    assert!(matches!(
        s.backend.set_node(full, 1).await,
        Err(OpenSmError::TableFull(TableOverflow {
            port: Some(Guid(0x10)),
            needed: 5,
            capacity: 4
        }))
    ));
    s.set_ok(node("a", &[0x10], &[(1, Membership::Full)]), 1)
        .await;
    let thief = node("b", &[0x10], &[]);
    assert!(matches!(
        s.backend.set_node(thief, 1).await,
        Err(OpenSmError::PortHeld { port: Guid(0x10), owner }) if owner.as_str() == "a"
    ));
    let mut named = node("c", &[0x30], &[(5, Membership::Full)]);
    named
        .keys
        .values_mut()
        .for_each(|k| k.name = "has space".into());
    assert!(matches!(
        s.backend.set_node(named, 1).await,
        Err(OpenSmError::Invalid(_))
    ));
    // Nothing refused reached the store.
    assert_eq!(s.store.load_all().unwrap().len(), 1);
}

#[tokio::test]
async fn older_generations_are_refused_with_the_stored_one() {
    let s = setup(b"", Duration::ZERO, |_| {});
    s.set_ok(node("a", &[0x10], &[(7, Membership::Full)]), 5)
        .await;
    let file = std::fs::read(&s.path).unwrap();
    let calls = s.reloader.calls();
    // Older: refused, never OK, carrying the stored generation; nothing changes.
    let err = s
        .backend
        .set_node(node("a", &[0x10], &[]), 4)
        .await
        .unwrap_err();
    assert!(
        matches!(err, OpenSmError::StaleGeneration { sent: 4, stored: 5 }),
        "{err:?}"
    );
    assert!(matches!(
        SmError::from(err),
        SmError::StaleGeneration { sent: 4, stored: 5 }
    ));
    // The same generation with another set: refused too.
    let err = s
        .backend
        .set_node(node("a", &[0x10], &[(8, Membership::Full)]), 5)
        .await
        .unwrap_err();
    assert!(
        matches!(err, OpenSmError::StaleGeneration { sent: 5, stored: 5 }),
        "{err:?}"
    );
    assert_eq!(s.backend.node("a").unwrap().generation, 5);
    assert_eq!(s.store.load_all().unwrap()[0].generation, 5);
    assert_eq!(std::fs::read(&s.path).unwrap(), file);
    assert_eq!(s.reloader.calls(), calls);
    // The same generation with the same set (a retry after a lost reply): served; the file was
    // confirmed, so nothing is written again.
    let out = s
        .backend
        .set_node(node("a", &[0x10], &[(7, Membership::Full)]), 5)
        .await
        .unwrap();
    assert!(out.detail.contains("up to date"), "{}", out.detail);
    // A newer one replaces it.
    s.set_ok(node("a", &[0x10], &[]), 6).await;
    assert!(!std::fs::read_to_string(&s.path)
        .unwrap()
        .contains("=0x0007"));
    // The SM host's own apply uses the generation it is given.
    s.backend
        .apply(&node("x", &[0x20], &[(9, Membership::Full)]), 3)
        .await
        .unwrap();
    assert!(matches!(
        s.backend
            .apply(&node("x", &[0x20], &[]), 2)
            .await
            .unwrap_err(),
        SmError::StaleGeneration { sent: 2, stored: 3 }
    ));
    assert_eq!(s.backend.node("smhost").unwrap().generation, 3);
}

#[tokio::test]
async fn an_unseen_reread_is_not_ok_and_is_rechecked_even_with_identical_bytes() {
    let s = setup(b"", Duration::ZERO, |_| {});
    s.reloader.unseen.store(true, Ordering::SeqCst);
    let want = node("a", &[0x10], &[(7, Membership::Full)]);
    let err = s.backend.set_node(want.clone(), 1).await.unwrap_err();
    assert!(
        matches!(
            err,
            OpenSmError::Unconfirmed {
                written_keys: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(SmError::from(err.clone()).is_transient());
    assert_eq!(
        kinds(&s.backend),
        vec![ConditionKind::PartitionsFileUnconfirmed]
    );
    // Persisted: a restarted backend re-checks too.
    assert!(s.store.load_commit_state().unwrap().unconfirmed.is_some());
    let written = std::fs::read(&s.path).unwrap();
    assert!(String::from_utf8_lossy(&written).contains("=0x0007"));
    // The retry renders the same bytes, yet signals and checks again.
    let calls = s.reloader.calls();
    assert!(matches!(
        s.backend.set_node(want.clone(), 1).await,
        Err(OpenSmError::Unconfirmed { .. })
    ));
    assert_eq!(s.reloader.calls(), calls + 1);
    // A restart from the store, then OpenSM answers: confirmed and cleared.
    s.reloader.unseen.store(false, Ordering::SeqCst);
    let again = OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: s.path.clone(),
            pid: Some(12345),
            watch_ms: 0,
            ownership: OwnershipConfig::disabled(),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::clone(&s.store) as Arc<dyn NodeMembershipStore>,
        Arc::clone(&s.reloader) as Arc<dyn Reloader>,
    )
    .unwrap();
    assert_eq!(
        kinds(&again),
        vec![ConditionKind::PartitionsFileUnconfirmed]
    );
    again.set_node(want.clone(), 1).await.unwrap();
    assert_eq!(s.reloader.calls(), calls + 2);
    assert_eq!(std::fs::read(&s.path).unwrap(), written);
    assert!(kinds(&again).is_empty());
    let state = s.store.load_commit_state().unwrap();
    assert_eq!((state.unconfirmed, state.rejected), (None, None));
    // The log mark is persisted with it (a restart scans the log from there).
    assert!(state.log_mark.is_some());
    // Now confirmed: an identical retry needs no sweep.
    again.set_node(want, 1).await.unwrap();
    assert_eq!(s.reloader.calls(), calls + 2);
    // Unreachable OpenSM after the write: not OK either, and unconfirmed.
    *s.reloader.fail.lock().unwrap() = Some(ReloadError::Unreachable(Unsignalled::Signal {
        pid: 4242,
        source: std::sync::Arc::new(std::io::Error::from_raw_os_error(3)),
    }));
    let err = again
        .set_node(node("a", &[0x10], &[]), 2)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            OpenSmError::Unreachable {
                written_keys: Some(_),
                source: Unsignalled::Signal { pid: 4242, source },
            } if source.raw_os_error() == Some(3)
        ),
        "{err:?}"
    );
    assert_eq!(
        kinds(&again),
        vec![ConditionKind::PartitionsFileUnconfirmed]
    );
}

#[tokio::test]
async fn a_rejected_file_is_replaced_by_the_last_accepted_one() {
    let s = setup(with_region("").as_bytes(), Duration::ZERO, |_| {});
    s.set_ok(node("a", &[0x10], &[(7, Membership::Full)]), 1)
        .await;
    let good = std::fs::read(&s.path).unwrap();
    assert_eq!(std::fs::read(accepted_copy_path(&s.path)).unwrap(), good);
    s.reloader.reject_next.store(1, Ordering::SeqCst);
    let bad = node(
        "a",
        &[0x10],
        &[(7, Membership::Full), (8, Membership::Full)],
    );
    let err = s.backend.set_node(bad.clone(), 2).await.unwrap_err();
    assert!(
        matches!(
            err,
            OpenSmError::Rejected(Rejection::Written {
                restored: Restored::Reread,
                ..
            })
        ),
        "{err}"
    );
    // Written, rejected, the accepted file put back and OpenSM signalled again.
    let seen = s.reloader.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_ne!(seen[1], good);
    assert_eq!(seen[2], good);
    assert_eq!(std::fs::read(&s.path).unwrap(), good);
    assert_eq!(
        kinds(&s.backend),
        vec![ConditionKind::PartitionsFileRejected]
    );
    assert!(s.store.load_commit_state().unwrap().rejected.is_some());
    // The same file is never written again.
    let err = s.backend.set_node(bad.clone(), 2).await.unwrap_err();
    assert!(
        matches!(err, OpenSmError::Rejected(Rejection::Repeated { .. })),
        "{err}"
    );
    assert_eq!(s.reloader.calls(), 3);
    assert_eq!(std::fs::read(&s.path).unwrap(), good);
    // Nor after a restart: the rejected bytes are kept beside the file.
    let restarted = OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: s.path.clone(),
            pid: Some(12345),
            watch_ms: 0,
            ownership: OwnershipConfig::disabled(),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::clone(&s.store) as Arc<dyn NodeMembershipStore>,
        Arc::clone(&s.reloader) as Arc<dyn Reloader>,
    )
    .unwrap();
    let err = restarted.set_node(bad.clone(), 2).await.unwrap_err();
    assert!(
        matches!(err, OpenSmError::Rejected(Rejection::Repeated { .. })),
        "{err}"
    );
    assert_eq!(s.reloader.calls(), 3);
    // A failed restore is retried: the rejected bytes back in place (as if the restore's
    // write had failed) are replaced by the accepted file at the next commit.
    std::fs::write(&s.path, &seen[1]).unwrap();
    let err = restarted.set_node(bad, 2).await.unwrap_err();
    assert!(
        matches!(err, OpenSmError::Rejected(Rejection::Repeated { .. })),
        "{err}"
    );
    assert_eq!(std::fs::read(&s.path).unwrap(), good);
    assert_eq!(s.reloader.seen.lock().unwrap().last().unwrap(), &good);
    drop(restarted);
    // A later write OpenSM accepts clears the condition.
    s.set_ok(node("a", &[0x10], &[(9, Membership::Full)]), 3)
        .await;
    assert!(kinds(&s.backend).is_empty());
}

#[tokio::test]
async fn an_operator_edit_opensm_rejected_is_undone_by_the_log_watch() {
    let s = setup(with_region("").as_bytes(), Duration::ZERO, |c| {
        c.watch_ms = 20
    });
    s.set_ok(node("a", &[0x10], &[(7, Membership::Full)]), 1)
        .await;
    let good = std::fs::read(&s.path).unwrap();
    // The operator breaks their part outside the region and OpenSM re-reads it on its own.
    let broken = String::from_utf8(good.clone()).unwrap().replacen(
        "storage=0x0100",
        "oops=0x0c0c : 0xzz ;\nstorage=0x0100",
        1,
    );
    std::fs::write(&s.path, &broken).unwrap();
    s.reloader
        .foreign
        .lock()
        .unwrap()
        .push("parse_part_conf: PARSE ERROR: line 5: bad port guid".into());
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read(&s.path).unwrap() != good {
        assert!(
            Instant::now() < deadline,
            "the accepted file was not restored"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        std::fs::read_to_string(rejected_copy_path(&s.path)).unwrap(),
        broken
    );
    // The condition is raised before the file is restored.
    let conditions = s.backend.conditions_now();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0].kind, ConditionKind::PartitionsFileRejected);
    assert!(
        conditions[0].detail.contains("PARSE ERROR"),
        "{conditions:?}"
    );
    // Nothing new to write: the condition stands.
    s.backend.resync().await.unwrap();
    assert_eq!(
        kinds(&s.backend),
        vec![ConditionKind::PartitionsFileRejected]
    );
}

#[tokio::test]
async fn an_all_full_default_is_a_condition_and_keys_need_the_acknowledgement() {
    for (operator, all_full) in [
        ("Default=0x7fff : ALL=full;\n", true),
        ("Default=0x7fff : A=f;\n", true),
        (
            "Default=0x7fff, defmember=full : ALL_CAS, SELF=full;\n",
            true,
        ),
        ("Default=0x7fff : ALL=limited, SELF=full;\n", false),
        ("Default=0x7fff : ALL_SWITCHES=full, SELF=full;\n", false),
    ] {
        let s = setup(operator.as_bytes(), Duration::ZERO, |_| {});
        assert_eq!(
            kinds(&s.backend).contains(&ConditionKind::OperatorDefaultAllFull),
            all_full,
            "{operator}"
        );
        let keys = s
            .backend
            .set_node(node("a", &[0x10], &[(7, Membership::Full)]), 1)
            .await;
        if all_full {
            let err = keys.unwrap_err();
            assert!(
                matches!(
                    err,
                    OpenSmError::InsecureDefault(FullDefault::Operator { line: 1, .. })
                ),
                "{err}"
            );
            assert!(err.to_string().contains("allow_full_default"), "{err}");
            assert!(!SmError::from(err).is_transient());
            // A release is always served.
            s.set_ok(node("a", &[0x10], &[]), 1).await;
        } else {
            keys.unwrap();
        }
        // Acknowledged in config: served, the condition stays.
        let acked = setup(operator.as_bytes(), Duration::ZERO, |c| {
            c.allow_full_default = true
        });
        acked
            .set_ok(node("a", &[0x10], &[(7, Membership::Full)]), 1)
            .await;
        assert_eq!(
            kinds(&acked.backend).contains(&ConditionKind::OperatorDefaultAllFull),
            all_full,
            "{operator}"
        );
    }
}

#[tokio::test]
async fn tenant_entries_never_resolve_operator_entries_by_name() {
    // A keyless operator entry after the region: OpenSM looks its key up by name.
    let after = "storage : ALL_SWITCHES=full, SELF=full ;\n";
    let initial =
        format!("Default=0x7fff : ALL=limited, SELF=full ;\n{BEGIN_MARKER}\n{END_MARKER}\n{after}");
    let s = setup(initial.as_bytes(), Duration::ZERO, |_| {});
    let operator_alone =
        parse(format!("Default=0x7fff : ALL=limited, SELF=full ;\n{after}").as_bytes()).unwrap();
    let storage_key = operator_alone.entries[1].pkey;
    let mut named = node("a", &[0x10], &[(0x0a12, Membership::Full)]);
    named
        .keys
        .values_mut()
        .for_each(|k| k.name = "storage".into());
    s.backend.set_node(named, 1).await.unwrap();
    let text = std::fs::read_to_string(&s.path).unwrap();
    assert!(text.contains("fa.0a12=0x0a12"), "{text}");
    let conf = parse(text.as_bytes()).unwrap();
    let eff = conf.effective();
    assert_eq!(eff[&0x0a12].members.len(), 1, "{text}");
    assert_eq!(eff[&storage_key].members.len(), 2, "{text}");
    // An operator entry using the region's naming is caught by the check: nothing written.
    let hostile = format!(
        "Default=0x7fff : ALL=limited, SELF=full ;\n{BEGIN_MARKER}\n{END_MARKER}\nfa.0a12 : ALL_SWITCHES=full ;\n"
    );
    let s = setup(hostile.as_bytes(), Duration::ZERO, |_| {});
    let err = s
        .backend
        .set_node(node("a", &[0x10], &[(0x0a12, Membership::Full)]), 1)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            OpenSmError::OperatorFile(RegionError::Collision(Collision::OperatorMembers { .. }))
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read_to_string(&s.path).unwrap(), hostile);
    assert_eq!(s.reloader.calls(), 0);
}

#[tokio::test]
async fn state_persists_across_restarts() {
    let s = setup(b"", Duration::ZERO, |_| {});
    s.set_ok(node("a", &[0x10], &[(7, Membership::Full)]), 1)
        .await;
    let written = std::fs::read(&s.path).unwrap();
    std::fs::write(&s.path, b"").unwrap();
    let config = OpenSmConfig {
        partitions_file: s.path.clone(),
        pid: Some(12345),
        watch_ms: 0,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    let again = OpenSmBackend::with_reloader(
        config,
        "smhost".into(),
        Arc::clone(&s.store) as Arc<dyn NodeMembershipStore>,
        Arc::clone(&s.reloader) as Arc<dyn Reloader>,
    )
    .unwrap();
    again.resync().await.unwrap();
    assert_eq!(std::fs::read(&s.path).unwrap(), written);
}

#[tokio::test]
async fn reload_failures_map_to_sm_errors() {
    let s = setup(b"", Duration::ZERO, |_| {});
    *s.reloader.fail.lock().unwrap() = Some(ReloadError::Unreachable(Unsignalled::NoPid));
    let r = s
        .backend
        .apply(&node("ignored", &[0x10], &[(1, Membership::Full)]), 1)
        .await;
    assert!(matches!(r, Err(SmError::Unreachable(_))), "{r:?}");
    // The local node's set is stored under the SM host's own id.
    assert!(s.backend.node("smhost").is_some());
    *s.reloader.fail.lock().unwrap() = Some(ReloadError::Rejected("PARSE ERROR".into()));
    let r = s
        .backend
        .apply(&node("ignored", &[0x10], &[(2, Membership::Full)]), 2)
        .await;
    assert!(matches!(r, Err(SmError::Refused(_))), "{r:?}");
}

#[tokio::test]
async fn concurrent_readers_never_see_a_partial_file() {
    let s = setup(b"", Duration::ZERO, |_| {});
    let path = s.path.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::SeqCst) {
                let bytes = std::fs::read(&path).unwrap();
                if !bytes.is_empty() {
                    parse(&bytes).expect("a reader saw a file that does not load");
                    reads += 1;
                }
            }
            reads
        })
    };
    for i in 0..100u64 {
        let keys: Vec<_> = (1..=(i % 30) as u32 + 1)
            .map(|k| (k, Membership::Full))
            .collect();
        s.set_ok(node("a", &[0x10], &keys), i).await;
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    let accepted = accepted_copy_path(&s.path);
    // The advisory lock's file stays (an editor may hold it); no temp file does.
    let lock = fabric_agent::sm::opensm::operator::lock_path(&s.path);
    let leftovers: Vec<_> = std::fs::read_dir(s.path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &s.path && p != &accepted && p != &lock)
        .collect();
    assert!(
        leftovers.is_empty(),
        "temp files left behind: {leftovers:?}"
    );
}

async fn burst(tweak: impl FnOnce(&mut OpenSmConfig), nodes: u64) -> (usize, Duration) {
    let s = setup(b"", Duration::from_millis(20), tweak);
    let start = Instant::now();
    let tasks: Vec<_> = (0..nodes)
        .map(|n| {
            let b = s.backend.clone();
            tokio::spawn(async move {
                b.set_node(
                    node(
                        &format!("n{n}"),
                        &[0x1000 + n],
                        &[(1 + n as u32, Membership::Full)],
                    ),
                    1,
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let took = start.elapsed();
    let conf = parse(&std::fs::read(&s.path).unwrap()).unwrap();
    assert_eq!(
        conf.entries.len() as u64,
        nodes + 1,
        "every node's key is in the file"
    );
    (s.reloader.calls(), took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_merges_a_burst_into_few_sweeps() {
    // Without the linger the first request goes out alone and the rest share later writes.
    let (sweeps, _) = burst(|c| c.commit_linger_ms = 0, 200).await;
    assert!(sweeps <= 10, "{sweeps} sweeps for 200 nodes");
    let (sweeps_off, _) = burst(|c| c.group_commit = false, 50).await;
    assert_eq!(sweeps_off, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_within_the_commit_linger_shares_one_sweep() {
    // Every request of the burst arrives within 250 ms of the one before (200 tasks spawned at
    // once; the margin covers a runtime starved by the file's other tests), so the first group
    // waits for all of them.
    let (sweeps, took) = burst(
        |c| {
            c.commit_linger_ms = 250;
            c.commit_linger_max_ms = 10_000;
        },
        200,
    )
    .await;
    assert_eq!(sweeps, 1, "the burst of 200 took {took:?}");
    // The linger is bounded: a burst that keeps arriving is written at the maximum.
    let s = setup(b"", Duration::from_millis(20), |c| {
        c.commit_linger_ms = 50;
        c.commit_linger_max_ms = 100;
    });
    let start = Instant::now();
    let feeder = {
        let b = s.backend.clone();
        tokio::spawn(async move {
            for n in 0..30u64 {
                let set = node(&format!("n{n}"), &[0x1000 + n], &[(1, Membership::Full)]);
                let b = b.clone();
                tokio::spawn(async move { b.set_node(set, 1).await });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    s.set_ok(node("a", &[0x10], &[(2, Membership::Full)]), 1)
        .await;
    let first = start.elapsed();
    assert!(
        first < Duration::from_millis(450),
        "the first group waited {first:?} for a burst that kept arriving (max 100 ms)"
    );
    assert!(s.reloader.calls() >= 1);
    feeder.await.unwrap();
}

#[tokio::test]
async fn a_single_change_goes_out_at_once() {
    let s = setup(b"", Duration::from_millis(20), |_| {});
    let start = Instant::now();
    s.set_ok(node("a", &[0x10], &[(1, Membership::Full)]), 1)
        .await;
    assert_eq!(s.reloader.calls(), 1);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    // An unchanged set writes nothing and needs no sweep.
    s.set_ok(node("a", &[0x10], &[(1, Membership::Full)]), 2)
        .await;
    assert_eq!(s.reloader.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_group_stores_its_sets_in_one_transaction() {
    const N: u64 = 40;
    let s = setup(b"", Duration::from_millis(500), |_| {});
    // A first request holds the commit loop in its sweep; the N that arrive meanwhile form
    // one group.
    let first = {
        let b = s.backend.clone();
        tokio::spawn(async move {
            b.set_node(node("first", &[0x10], &[(1, Membership::Full)]), 1)
                .await
        })
    };
    while s.reloader.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (txns, node_txns) = (s.store.transactions(), s.store.node_transactions());
    let tasks: Vec<_> = (0..N)
        .map(|n| {
            let b = s.backend.clone();
            tokio::spawn(async move {
                b.set_node(
                    node(&format!("n{n}"), &[0x1000 + n], &[(2, Membership::Full)]),
                    1,
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    first.await.unwrap().unwrap();
    assert_eq!(s.reloader.calls(), 2, "one sweep for the group");
    assert_eq!(
        s.store.node_transactions() - node_txns,
        1,
        "the group's {N} sets are stored in one transaction"
    );
    // That transaction also marks the group's write in progress; the others clear the marks
    // of the first write and of the group's once OpenSM re-read them.
    assert_eq!(s.store.transactions() - txns, 3);
    assert_eq!(s.store.load_all().unwrap().len() as u64, N + 1);
}

/// An [`InMemoryNodeStore`] whose writes fail while `broken` is set.
#[derive(Default)]
struct FlakyStore {
    inner: InMemoryNodeStore,
    broken: std::sync::atomic::AtomicBool,
}

impl NodeMembershipStore for FlakyStore {
    fn load_all(
        &self,
    ) -> Result<Vec<fabric_agent::sm::opensm::StoredNode>, fabric_agent::sm::opensm::NodeStoreError>
    {
        self.inner.load_all()
    }
    fn put_group(
        &self,
        nodes: &[fabric_agent::sm::opensm::StoredNode],
        commit: Option<&fabric_agent::sm::opensm::CommitState>,
    ) -> Result<(), fabric_agent::sm::opensm::NodeStoreError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(fabric_agent::sm::opensm::NodeStoreError::new("disk full"));
        }
        self.inner.put_group(nodes, commit)
    }
    fn load_commit_state(
        &self,
    ) -> Result<fabric_agent::sm::opensm::CommitState, fabric_agent::sm::opensm::NodeStoreError>
    {
        self.inner.load_commit_state()
    }
    fn load_retired(
        &self,
    ) -> Result<fabric_agent::domain::RetiredKeys, fabric_agent::sm::opensm::NodeStoreError> {
        self.inner.load_retired()
    }
    fn put_retired(
        &self,
        retired: &fabric_agent::domain::RetiredKeys,
    ) -> Result<(), fabric_agent::sm::opensm::NodeStoreError> {
        self.inner.put_retired(retired)
    }
    fn load_fenced(
        &self,
    ) -> Result<
        Vec<fabric_agent::sm::opensm::fenced_host::FencedHost>,
        fabric_agent::sm::opensm::NodeStoreError,
    > {
        self.inner.load_fenced()
    }
    fn put_fenced(
        &self,
        fenced: &[fabric_agent::sm::opensm::fenced_host::FencedHost],
    ) -> Result<(), fabric_agent::sm::opensm::NodeStoreError> {
        self.inner.put_fenced(fenced)
    }
}

#[tokio::test]
async fn a_set_that_cannot_be_stored_is_not_written_and_is_stored_on_the_retry() {
    let s = setup_with(FlakyStore::default(), b"", Duration::from_millis(1), |_| {});
    s.store.broken.store(true, Ordering::SeqCst);
    let set = node("a", &[0x10], &[(0x0a12, Membership::Full)]);
    let err = s.backend.set_node(set.clone(), 1).await.unwrap_err();
    assert!(matches!(err, OpenSmError::Store(_)), "{err:?}");
    assert_eq!(
        s.reloader.calls(),
        0,
        "nothing is written before the set is durable"
    );
    assert!(std::fs::read(&s.path).unwrap().is_empty());
    assert!(s.store.inner.load_all().unwrap().is_empty());

    s.store.broken.store(false, Ordering::SeqCst);
    s.set_ok(set.clone(), 1).await;
    assert_eq!(s.reloader.calls(), 1);
    assert_eq!(s.store.inner.load_all().unwrap()[0].memberships, set);
    let text = String::from_utf8(std::fs::read(&s.path).unwrap()).unwrap();
    assert!(text.contains("0x0a12"), "{text}");
}

/// Runs one life of the SM host in its own runtime: dropping it ends the backend's tasks, so the
/// store is closed for the next life.
fn life(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f);
}

#[test]
fn a_restored_store_never_puts_a_released_key_back_until_the_node_sends_again() {
    use fabric_agent::daemon::StoredSmNodes;
    use fabric_agent::store::Store;
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.redb");
    let copy = state.path().join("copy.redb");
    let open = |db: &Path| StoredSmNodes(Arc::new(Store::open(db, 1000).unwrap()));
    let node1 = "0x0000000000000011";
    let region = |s: &Setup<StoredSmNodes>| {
        let bytes = std::fs::read(&s.path).unwrap();
        String::from_utf8(bytes).unwrap()
    };
    life(async {
        let s = setup_with(
            open(&db),
            with_region("").as_bytes(),
            Duration::ZERO,
            |_| {},
        );
        s.set_ok(node("node1", &[0x11], &[(0x0a12, Membership::Full)]), 5)
            .await;
        assert!(region(&s).contains(node1));
    });
    // The copy that will be put back, then the release it predates.
    std::fs::copy(&db, &copy).unwrap();
    life(async {
        let s = setup_with(
            open(&db),
            with_region("").as_bytes(),
            Duration::ZERO,
            |_| {},
        );
        s.set_ok(node("node1", &[0x11], &[]), 6).await;
        assert!(!region(&s).contains(node1));
    });
    std::fs::copy(&copy, &db).unwrap();
    life(async {
        let store = open(&db);
        assert!(
            store.0.rolled_back().is_some(),
            "the mirror names a newer store"
        );
        let s = setup_with(store, with_region("").as_bytes(), Duration::ZERO, |_| {});
        // Another node's commit renders the region: node1's restored key stays out of it.
        s.set_ok(node("node2", &[0x22], &[(0x0a13, Membership::Full)]), 1)
            .await;
        let text = region(&s);
        assert!(text.contains("0x0000000000000022"), "{text}");
        assert!(!text.contains(node1), "restored set rendered: {text}");
        // The restored generation still fences: node1's old set is not taken back either.
        assert!(matches!(
            s.backend
                .set_node(node("node1", &[0x11], &[(0x0a12, Membership::Full)]), 5)
                .await,
            Err(OpenSmError::StaleGeneration { sent: 5, stored: 5 })
        ));
        assert!(!region(&s).contains(node1));
    });
    // Marked durably: a second restart (the mirror matches now) still keeps it out.
    life(async {
        let store = open(&db);
        assert!(store.0.rolled_back().is_none());
        let s = setup_with(store, with_region("").as_bytes(), Duration::ZERO, |_| {});
        s.set_ok(node("node2", &[0x22], &[(0x0a14, Membership::Full)]), 2)
            .await;
        assert!(!region(&s).contains(node1));
        // The node's next set is what counts again.
        s.set_ok(node("node1", &[0x11], &[(0x0a15, Membership::Full)]), 9)
            .await;
        let text = region(&s);
        assert!(text.contains(node1), "{text}");
        assert!(!text.contains("0x0a12"), "{text}");
    });
}
