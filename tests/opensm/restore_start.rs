//! A whole-host restore: the SM host's store and its partitions file put back from one backup.
//! At start, before OpenSM reads the file (it is ordered after the agent), the backend renders
//! the region from the restored store, whose sets are unconfirmed: the old file's key, released
//! after the backup, never reaches OpenSM (`OpenSmBackend::render_after_restore`, called by the
//! daemon before READY).

use testkit::common;

use async_trait::async_trait;
use fabric_agent::daemon::StoredSmNodes;
use fabric_agent::domain::Membership;
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader, Unsignalled};
use fabric_agent::sm::opensm::{NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig};
use fabric_agent::store::Store;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// OpenSM re-reading every file at once, or not running (`down`).
struct Opensm {
    down: AtomicBool,
}

#[async_trait]
impl Reloader for Opensm {
    fn checkpoint(&self) -> u64 {
        0
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ReloadError::Unreachable(Unsignalled::NoPid));
        }
        Ok(ReloadReport { file_read: true })
    }
}

/// One life of the SM host's agent: a backend on the store at `db` and the file at `file`.
fn backend(db: &Path, file: &Path, opensm: &Arc<Opensm>) -> (OpenSmBackend, Arc<Store>) {
    let store = Arc::new(Store::open(db, 1000).unwrap());
    let config = OpenSmConfig {
        partitions_file: file.to_owned(),
        watch_ms: 0,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    let nodes = Arc::new(StoredSmNodes(store.clone())) as Arc<dyn NodeMembershipStore>;
    let reloader = Arc::clone(opensm) as Arc<dyn Reloader>;
    let b = OpenSmBackend::with_reloader(config, "smhost".into(), nodes, reloader).unwrap();
    (b, store)
}

/// One life of the agent's process: a runtime of its own, dropped with every task it ran.
fn life(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Runtime::new().unwrap().block_on(f);
}

#[test]
fn a_restored_file_is_rendered_from_the_restored_store_before_opensm_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let (db, file) = (
        dir.path().join("state.redb"),
        dir.path().join("partitions.conf"),
    );
    let (db_copy, file_copy) = (dir.path().join("db.copy"), dir.path().join("file.copy"));
    std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let opensm = Arc::new(Opensm {
        down: AtomicBool::new(false),
    });
    let node1 = "0x0000000000000011";
    let set = |keys: &[(u32, Membership)]| {
        common::memberships("node1", [0x11], keys.iter().copied(), |_| String::new())
    };
    let holds_node1 = |f: &Path| {
        String::from_utf8(std::fs::read(f).unwrap())
            .unwrap()
            .contains(node1)
    };
    life(async {
        let (b, _store) = backend(&db, &file, &opensm);
        b.set_node(set(&[(0x0a12, Membership::Full)]), 5)
            .await
            .unwrap();
        // Nothing to do on a store that was not restored.
        b.render_after_restore(None).await.unwrap();
    });
    assert!(holds_node1(&file));
    // The backup, then the release it predates.
    std::fs::copy(&db, &db_copy).unwrap();
    std::fs::copy(&file, &file_copy).unwrap();
    life(async {
        let (b, _store) = backend(&db, &file, &opensm);
        b.set_node(set(&[]), 6).await.unwrap();
    });
    assert!(!holds_node1(&file));
    // The whole host put back from the backup (the store's side file stays); OpenSM is down
    // and starts after the agent.
    std::fs::copy(&db_copy, &db).unwrap();
    std::fs::copy(&file_copy, &file).unwrap();
    assert!(holds_node1(&file));
    opensm.down.store(true, Ordering::SeqCst);
    let mut rendered = None;
    life(async {
        let (b, store) = backend(&db, &file, &opensm);
        let why = store.rolled_back().map(str::to_owned);
        assert!(why.is_some(), "the side file names a newer store");
        rendered = Some(b.render_after_restore(why.as_deref()).await);
    });
    assert!(
        !holds_node1(&file),
        "the restored file still hands OpenSM the released key: {}",
        String::from_utf8_lossy(&std::fs::read(&file).unwrap())
    );
    // Written, not confirmed: OpenSM is not running yet.
    assert!(rendered.unwrap().is_err());
}
