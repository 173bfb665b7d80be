//! The SM host's agent crashes and restarts inside a schedule, and its store is put back from a
//! backup while it is down ([`Command::SmHostCrash`]).
//!
//! A crash shuts the real `OpenSmBackend` down where it stands (its group-commit loop aborted at
//! its await point, waiting callers answered with an error) and drops every request it was
//! handling (the node sees its connection reset: no answer). While it is down the node's
//! applies are refused. After the downtime a new backend starts on the same partitions file
//! and store — or on the store's database file put back from the last snapshot (its side file
//! left as the crashed agent wrote it, so the store opens as restored and every stored set is
//! unconfirmed: docs/OPENSM.md "A restored store"), with the partitions file left as OpenSM last
//! read it, or put back too (a whole-host restore: the file is back before the agent starts,
//! and OpenSM, ordered after the agent, reads it at its restart).
//!
//! The oracle's checks are those of every run: no false RELEASED, a RELEASED key never back on
//! a port, liveness after healing (the node's next set reconciles).

use super::model_opensm::{backend_on, SmHost};
use super::schedule::{Command, SmHostRestore, Step};
use super::world::{with, Shared};
use fabric_agent::daemon::StoredSmNodes;
use fabric_agent::sm::opensm::{InMemoryNodeStore, NodeMembershipStore};
use fabric_agent::store::Store;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
type Backup = (Option<Vec<u8>>, Vec<u8>);

/// The SM host's store and its last backup.
pub struct SmHostDisk {
    kept: Kept,
    snapshot: Mutex<Option<Backup>>,
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

    fn db_path(&self) -> Option<PathBuf> {
        match &self.kept {
            Kept::Memory(_) => None,
            Kept::Disk { root, dir } => Some(store_dir(root, dir.lock().expect("lock").0).join(DB)),
        }
    }

    /// Why the store the next backend opens was found restored (None: it was not).
    fn rolled_back(&self) -> Option<String> {
        match &self.kept {
            Kept::Memory(_) => None,
            Kept::Disk { dir, .. } => dir.lock().expect("lock").1.rolled_back().map(str::to_owned),
        }
    }

    /// Puts the store's database file back from the snapshot into a fresh directory, beside a
    /// copy of the live side file (as a restore in place leaves it), and opens it there.
    fn restore_store(&self, db: &[u8]) -> String {
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
        let seen = super::rollback::seen(&store);
        *dir = (dir.0 + 1, Arc::new(store));
        seen
    }
}

impl SmHost {
    /// A backup of the SM host: its store's database file (when on disk) and the partitions
    /// file.
    pub fn snapshot(&self, world: &Shared) {
        let db = self
            .disk
            .db_path()
            .map(|p| std::fs::read(p).expect("reading the SM host's database file"));
        let file = std::fs::read(&self.file).expect("reading the partitions file");
        with(world, |w| {
            w.log("backup: the SM host's store and partitions file copied")
        });
        *self.disk.snapshot.lock().expect("snapshot lock") = Some((db, file));
    }

    /// The SM host's agent crashes: its backend shut down, the requests it was handling lost.
    /// After `down_ms` (and `restore`) a new one starts on the same file and store.
    pub async fn crash_and_restart(&self, world: &Shared, down_ms: u64, restore: SmHostRestore) {
        let old = self.link.backend.lock().expect("backend lock").take();
        if let Some(b) = &old {
            b.shutdown();
        }
        let requests = std::mem::take(&mut *self.link.requests.lock().expect("requests lock"));
        requests.iter().for_each(|(_, h)| h.abort());
        for (id, h) in requests {
            let _ = h.await;
            with(world, |w| w.fabric.in_flight.remove(&id));
        }
        with(world, |w| {
            if let Some(view) = w.fabric.sm_host.as_mut() {
                view.backend = None;
                // A whole-host restore: OpenSM goes down with the host, and starts after the
                // agent.
                view.opensm_down = restore == SmHostRestore::StoreAndFile;
            }
            w.log("sm host: the agent CRASHED (its backend shut down, its requests lost)");
        });
        drop(old);
        let snapshot = self.disk.snapshot.lock().expect("snapshot lock").clone();
        let mut file_back = None;
        match (restore, snapshot) {
            (SmHostRestore::Nothing, _) => {}
            (_, None) => with(world, |w| w.log("restore: no snapshot taken yet")),
            (_, Some((None, _))) => with(world, |w| {
                w.log("restore: the SM host's store is not on disk")
            }),
            (what, Some((Some(db), file))) => {
                let seen = self.disk.restore_store(&db);
                with(world, |w| {
                    w.log(format!(
                        "restore: the SM host's database file put back to the snapshot, its side \
                         file left; {seen}"
                    ))
                });
                if what == SmHostRestore::StoreAndFile {
                    file_back = Some(file);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        if let Some(file) = &file_back {
            // A whole-host restore: the file is back before anything starts.
            std::fs::write(&self.file, file).expect("writing the partitions file back");
            with(world, |w| {
                w.log("restore: the partitions file put back to the snapshot")
            });
        }
        let backend = backend_on(world, &self.file, self.disk.node_store());
        // The daemon's start before READY (src/cli/serve.rs).
        if let Err(e) = backend
            .render_after_restore(self.disk.rolled_back().as_deref())
            .await
        {
            with(world, |w| {
                w.log(format!("sm host: rendering after the restore: {e}"))
            });
        }
        *self.link.backend.lock().expect("backend lock") = Some(backend.clone());
        with(world, |w| {
            if let Some(view) = w.fabric.sm_host.as_mut() {
                view.backend = Some(backend);
            }
            w.log("sm host: the agent started again");
        });
        if file_back.is_some() {
            // OpenSM, ordered after the agent, starts and reads the file.
            super::model_opensm::restart(world);
        }
    }
}
