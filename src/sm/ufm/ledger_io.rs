//! The ledger's I/O for [`UfmSm`]: loading it once from its store, saving it when it changed,
//! recording a late write (a released key that came back to this node's GUIDs at UFM), and the
//! restore watch of a store found restored from a copy.
//!
//! # Watches across restarts
//! A watch is measured on the process's steady clock (`link.rs`), but its end is stored as a
//! unix-ms deadline, and a new process cannot tell a wall-clock step since (forward or back)
//! from elapsed time. So a process trusts no stored deadline: when it first loads the ledger
//! (its first apply, or [`UfmSm::after_restore`] at start), every watch still recorded (each
//! key's and the restore watch) is re-armed to end `late_write_window_ms` from then on this
//! process's steady clock. Every add it watches for was sent before this process started, so
//! it lands within one window from now whatever the wall clock did: a forward step cannot end
//! the watch early, a backward one cannot stretch it past one window. The re-armed ends are
//! what every apply uses, and they are written with the ledger's next save (the first apply
//! saves before it sends anything); a crash before that save loses nothing, because the next
//! start re-arms again from its own, later, start.

use super::{refused, Failure, State, UfmError, UfmLedger, UfmLedgerStore, UfmSm};
use crate::domain::PKey;
use crate::sm::{SmError, SmFailure};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The ledger as saved in `store` (empty when nothing was saved).
fn read_ledger(store: &dyn UfmLedgerStore) -> Result<UfmLedger, SmError> {
    match store
        .load()
        .map_err(|e| SmError::Unreachable(SmFailure::Ufm(UfmError::LedgerLoad(e))))?
    {
        None => Ok(UfmLedger::default()),
        Some(bytes) => {
            UfmLedger::decode(&bytes).map_err(|why| refused(UfmError::LedgerDecode(Arc::new(why))))
        }
    }
}

impl UfmSm {
    /// Tells the backend that the node's store, its ledger with it, was found restored from a
    /// copy when it was opened (`restored`: why, from `Store::rolled_back`; `None`: nothing to
    /// do). The restored ledger lacks every add sent after the copy was taken, and such an add
    /// may be in any key now or land there until `late_write_window_ms` after it was sent, so
    /// before this returns the ledger records, durably, a restore watch until
    /// `late_write_window_ms` from now (module docs, "Store restores"). Call it once at start,
    /// after [`UfmSm::with_link`] (the watch is measured on the link's clock) and before the
    /// first apply. Blocks on the ledger store.
    pub fn after_restore(mut self, restored: Option<&str>) -> Result<UfmSm, SmError> {
        let Some(why) = restored else {
            return Ok(self);
        };
        let until = self.now_ms().saturating_add(self.late_window_ms);
        let mut ledger = match self.state.get_mut().ledger.take() {
            Some(ledger) => ledger,
            None => {
                let mut ledger = read_ledger(self.ledger_store.as_ref())?;
                self.rearm(&mut ledger);
                ledger
            }
        };
        ledger.watch_restore(until);
        self.ledger_store
            .save(&ledger.encode())
            .map_err(|e| SmError::Unreachable(SmFailure::Ufm(UfmError::LedgerSave(e))))?;
        let state = self.state.get_mut();
        tracing::error!(%why, until_unix_ms = until, "store restored from a copy: the UFM ledger may lack adds sent after the copy; UFM's whole partition list is read and cleaned of this node's GUIDs, and no set acknowledged, until the late-write window from now is over");
        state.saved = ledger.clone();
        state.ledger = Some(ledger);
        Ok(self)
    }

    /// Reads the ledger from its store once.
    pub(super) async fn load_ledger(&self, state: &mut State) -> Result<(), SmError> {
        if state.ledger.is_some() {
            return Ok(());
        }
        let store = self.ledger_store.clone();
        let mut ledger = crate::sm::blocking::unblock(move || read_ledger(store.as_ref()))
            .await
            .map_err(|e| {
                SmError::Unreachable(SmFailure::Ufm(UfmError::LedgerTask {
                    saving: false,
                    source: Arc::new(e),
                }))
            })??;
        // `saved` is the ledger as stored: the re-armed ends go out with the next save.
        state.saved = ledger.clone();
        self.rearm(&mut ledger);
        state.ledger = Some(ledger);
        Ok(())
    }

    /// Now, in unix milliseconds, on the clock the late-write window is measured on (the
    /// link's, or the process's steady clock).
    fn now_ms(&self) -> i64 {
        match &self.link {
            Some(link) => link.unix_ms(),
            None => super::link::system_unix_ms(),
        }
    }

    /// Re-arms every watch of a ledger this process just loaded to end one late-write window
    /// from now (module docs, "Watches across restarts"), and says how many it re-armed.
    fn rearm(&self, ledger: &mut UfmLedger) {
        if crate::test_mutation::active(crate::test_mutation::Mutation::UfmWatchNotRearmed) {
            if !ledger.is_empty() {
                tracing::warn!(
                    "TEST MUTATION ufm-watch-not-rearmed: the ledger's stored watch deadlines kept"
                );
            }
            return;
        }
        let until = self.now_ms().saturating_add(self.late_window_ms);
        let count = ledger.rearm_watches(until);
        if count > 0 {
            tracing::warn!(
                watches = count,
                until_unix_ms = until,
                "UFM late-write watches found in the ledger at start: re-armed to the whole late-write window from now (a stored deadline cannot tell a wall-clock step from elapsed time)"
            );
        }
    }

    /// Saves the ledger when it differs from what was saved last.
    pub(super) async fn save_ledger(
        &self,
        ledger: &UfmLedger,
        saved: &mut UfmLedger,
    ) -> Result<(), Failure> {
        if ledger == saved {
            return Ok(());
        }
        let bytes = ledger.encode();
        let store = self.ledger_store.clone();
        crate::sm::blocking::unblock(move || store.save(&bytes))
            .await
            .map_err(|e| {
                Failure::NoAnswer(UfmError::LedgerTask {
                    saving: true,
                    source: Arc::new(e),
                })
            })?
            .map_err(|e| Failure::NoAnswer(UfmError::LedgerSave(e)))?;
        *saved = ledger.clone();
        Ok(())
    }

    /// Records a late write: `count` GUIDs of this node re-appeared in the watched `key`, where
    /// the node no longer gives them, after a read had shown them gone. The apply removes them
    /// now.
    pub(super) fn late_write(&self, ledger: &UfmLedger, key: PKey, count: usize) {
        let until = ledger.watch_end(key).unwrap_or_default();
        let detail = format!("{count} GUID(s) of this node re-appeared in {key} at UFM after it was released from them (an add executed after the client gave up); removed, and watched until {until} (unix ms)");
        tracing::error!(%key, count, "UFM late write: a released key came back to this node's ports; removing it");
        self.late_writes_mut().insert(key, detail);
    }

    pub(super) fn late_writes_mut(&self) -> std::sync::MutexGuard<'_, BTreeMap<PKey, String>> {
        self.late_writes.lock().unwrap_or_else(|p| p.into_inner())
    }
}
