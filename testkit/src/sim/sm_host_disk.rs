//! The SM host's store ([`SmHostDisk`]) across its agent's crashes: in memory, or a database
//! file with its side file when the schedule restores it from a backup, and that backup
//! (`sm_host_restart` takes and puts it back).

use super::core::command::{Command, SmHostRestore, Step};
use super::core::disk::seen;
use fabric_agent::daemon::StoredSmNodes;
use fabric_agent::sm::opensm::{InMemoryNodeStore, NodeMembershipStore};
use fabric_agent::store::Store;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The SM host's store file's name.
const DB: &str = "sm.redb";

/// The SM host's store: in memory (kept across its agent's crashes), or a file with its side
/// file when the schedule restores it.
enum Kept {
    Memory(Arc<InMemoryNodeStore>),
    Disk {
        root: PathBuf,
        /// The directory the store is in now (a restore writes the copy into a new one).
        dir: Mutex<(u32, Arc<Store>)>,
    },
}

/// A backup of the SM host: its store's database file (None: the store is in memory) and the
/// partitions file.
pub(super) type Backup = (Option<Vec<u8>>, Vec<u8>);

/// The SM host's store and its last backup.
pub struct SmHostDisk {
    kept: Kept,
    /// The last backup (None: no snapshot taken yet).
    pub(super) snapshot: Mutex<Option<Backup>>,
}

fn store_dir(root: &Path, n: u32) -> PathBuf {
    root.join(format!("sm-store-{n}"))
}

impl SmHostDisk {
    /// The store for a run whose schedule is `steps`, under `root`.
    pub fn new(root: &Path, steps: &[Step]) -> SmHostDisk {
        let restores = steps.iter().any(|s| {
            matches!(
                s.command,
                Command::SmHostCrash { restore, .. } if restore != SmHostRestore::Nothing
            )
        });
        let kept = if restores {
            let store = Store::open(&store_dir(root, 0).join(DB), u64::MAX).expect("SM store");
            Kept::Disk {
                root: root.to_owned(),
                dir: Mutex::new((0, Arc::new(store))),
            }
        } else {
            Kept::Memory(Arc::new(InMemoryNodeStore::default()))
        };
        SmHostDisk {
            kept,
            snapshot: Mutex::new(None),
        }
    }

    /// What a backend stores through.
    pub fn node_store(&self) -> Arc<dyn NodeMembershipStore> {
        match &self.kept {
            Kept::Memory(m) => m.clone(),
            Kept::Disk { dir, .. } => Arc::new(StoredSmNodes(dir.lock().expect("lock").1.clone())),
        }
    }

    /// The store's database file (None: the store is in memory).
    pub(super) fn db_path(&self) -> Option<PathBuf> {
        match &self.kept {
            Kept::Memory(_) => None,
            Kept::Disk { root, dir } => Some(store_dir(root, dir.lock().expect("lock").0).join(DB)),
        }
    }

    /// Why the store the next backend opens was found restored (None: it was not).
    pub(super) fn rolled_back(&self) -> Option<String> {
        match &self.kept {
            Kept::Memory(_) => None,
            Kept::Disk { dir, .. } => dir.lock().expect("lock").1.rolled_back().map(str::to_owned),
        }
    }

    /// Puts the store's database file back from the snapshot into a fresh directory, beside a
    /// copy of the live side file (as a restore in place leaves it), and opens it there.
    pub(super) fn restore_store(&self, db: &[u8]) -> String {
        let Kept::Disk { root, dir } = &self.kept else {
            return "the store is not on disk".into();
        };
        let mut dir = dir.lock().expect("lock");
        let live = store_dir(root, dir.0);
        let next = store_dir(root, dir.0 + 1);
        std::fs::create_dir_all(&next).expect("store dir");
        std::fs::write(next.join(DB), db).expect("writing the copy back");
        let mirror = format!("{DB}.mirror");
        std::fs::copy(live.join(&mirror), next.join(&mirror)).expect("copying the side file");
        let store = Store::open(&next.join(DB), u64::MAX).expect("the restored SM store");
        let seen = seen(&store);
        *dir = (dir.0 + 1, Arc::new(store));
        seen
    }
}
