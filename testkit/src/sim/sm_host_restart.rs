//! The SM host's agent crashes and restarts inside a schedule, and its store is put back from a
//! backup while it is down ([`Command::SmHostCrash`](super::core::command::Command::SmHostCrash)).
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

use super::core::command::SmHostRestore;
use super::model_opensm::{backend_on, SmHost};
use super::world::{with, Shared};
use std::time::Duration;

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
