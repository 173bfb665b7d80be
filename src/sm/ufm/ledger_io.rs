//! The ledger's I/O for [`UfmSm`]: loading it once from its store, saving it when it changed,
//! and recording a late write (a released key that came back to this node's GUIDs at UFM).

use super::{refused, Failure, State, UfmError, UfmLedger, UfmSm};
use crate::domain::PKey;
use crate::sm::{SmError, SmFailure};
use std::collections::BTreeMap;
use std::sync::Arc;

impl UfmSm {
    /// Reads the ledger from its store once.
    pub(super) async fn load_ledger(&self, state: &mut State) -> Result<(), SmError> {
        if state.ledger.is_some() {
            return Ok(());
        }
        let store = self.ledger_store.clone();
        let bytes = crate::sm::blocking::unblock(move || store.load())
            .await
            .map_err(|e| {
                SmError::Unreachable(SmFailure::Ufm(UfmError::LedgerTask {
                    saving: false,
                    source: Arc::new(e),
                }))
            })?
            .map_err(|e| SmError::Unreachable(SmFailure::Ufm(UfmError::LedgerLoad(e))))?;
        let ledger = match bytes {
            None => UfmLedger::default(),
            Some(bytes) => UfmLedger::decode(&bytes)
                .map_err(|why| refused(UfmError::LedgerDecode(Arc::new(why))))?,
        };
        state.saved = ledger.clone();
        state.ledger = Some(ledger);
        Ok(())
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
        let until = ledger.watched_until(key).unwrap_or_default();
        let detail = format!("{count} GUID(s) of this node re-appeared in {key} at UFM after it was released from them (an add executed after the client gave up); removed, and watched until {until} (unix ms)");
        tracing::error!(%key, count, "UFM late write: a released key came back to this node's ports; removing it");
        self.late_writes_mut().insert(key, detail);
    }

    pub(super) fn late_writes_mut(&self) -> std::sync::MutexGuard<'_, BTreeMap<PKey, String>> {
        self.late_writes.lock().unwrap_or_else(|p| p.into_inner())
    }
}
