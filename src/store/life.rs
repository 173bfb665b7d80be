//! The agent's lives on one store: a clean-stop marker written at a clean shutdown and taken
//! away at the next start, and a new log epoch at every start that does not find it.
//!
//! Why: a store put back from a copy of a *running* agent (a VM snapshot reverted, a state
//! directory copied while the agent served) holds a log that ends below seqs a control plane
//! already consumed. When neither the mirror (restored with it) nor the fabric side (its set
//! unchanged since the copy) shows the rollback, the agent would hand out those seqs again
//! with other content under the same epoch. A running agent's store never holds the marker
//! (it is removed at start, before any event), so such a copy always starts a new epoch; so
//! does every start after a crash, a SIGKILL or a power loss, which cannot be told apart
//! from it. A clean restart keeps the epoch, and cursors resume.
//!
//! The new epoch keeps the log as it is (the events are durable and true) and continues
//! its seqs: every (epoch, seq) of the new epoch is new, and a watcher that sends its old
//! epoch gets OUT_OF_RANGE and resynchronises, as after any new epoch. Its first event raises
//! `UNCLEAN_STOP`, which says why.

use super::{
    append, decode, encode, epoch_from, read_u64, LogEpoch, Store, StoreError, EVENTS, LAST_SEQ,
    LOG_EPOCH, META,
};
use crate::domain::{ConditionKind, Event, EventKind};
use redb::ReadableTable;
use serde::{Deserialize, Serialize};

/// Store meta key: the clean-stop marker ([`CleanStop`], JSON), present only between a clean
/// shutdown and the next start.
pub(super) const CLEAN_STOP: &str = "clean_stop";

/// What a clean shutdown recorded: the log as it left it. A marker that does not match the
/// log (an event appended after it, which [`Store::commit`] prevents by removing it) counts as
/// absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CleanStop {
    /// The log epoch, 32 hex digits.
    epoch: String,
    /// The newest seq when the agent stopped.
    last_seq: u64,
}

/// How a start found the store ([`Store::begin_life`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifeStart {
    /// The last life stopped cleanly after its last event: the log keeps its epoch.
    Clean,
    /// The store was created by this open: there was no earlier life.
    Fresh,
    /// The store's open already started a new epoch (it found the store restored from a
    /// copy: [`Store::rolled_back`]).
    RolledBack,
    /// No clean-stop marker: a new epoch, its first event raising `UNCLEAN_STOP`.
    NewEpoch {
        /// The epoch the log had.
        previous: LogEpoch,
        /// The new one.
        epoch: LogEpoch,
        /// The event that raised `UNCLEAN_STOP` (to publish; boxed: the variant would be the
        /// enum's size otherwise).
        event: Box<Event>,
    },
}

impl Store {
    /// Starts a life of the agent on this store: removes the clean-stop marker durably, in one
    /// transaction before any event of this life is written, and when it was not there (or no
    /// longer matched the log) starts a new log epoch in the same transaction, raising
    /// `UNCLEAN_STOP` as its first event (at seq `last_seq + 1`). Call once per start, before
    /// anything is committed; tools that open the store while the agent is stopped do not.
    pub fn begin_life(&self, now_unix_ns: i64) -> Result<LifeStart, StoreError> {
        let mut started = None;
        let out = self.write(|txn, next| {
            let mut meta = txn.open_table(META)?;
            let marker: Option<CleanStop> = meta
                .remove(CLEAN_STOP)?
                .map(|v| decode(v.value()))
                .transpose()?;
            let last_seq = read_u64(&meta, LAST_SEQ)?;
            let current = match meta.get(LOG_EPOCH)? {
                Some(v) => epoch_from(v.value())?,
                None => self.epoch(),
            };
            let clean = marker.as_ref().is_some_and(|m| {
                m.epoch == current.to_string() && m.last_seq == last_seq
            });
            if clean {
                return Ok(LifeStart::Clean);
            }
            if self.fresh {
                return Ok(LifeStart::Fresh);
            }
            if self.rollback.is_some() {
                return Ok(LifeStart::RolledBack);
            }
            // Test-only (debug builds, `FABRIC_AGENT_TEST_MUTATION`): the rule switched off, to
            // prove the chaos checker catches it. Never true in a release build.
            if crate::test_mutation::active(crate::test_mutation::Mutation::LogKeepsEpoch) {
                tracing::warn!("TEST MUTATION log-keeps-epoch: no clean-stop marker, epoch {current} kept");
                return Ok(LifeStart::Clean);
            }
            let epoch = LogEpoch::generate();
            meta.insert(LOG_EPOCH, epoch.0.to_be_bytes().as_slice())?;
            let why = match marker {
                Some(m) => format!(
                    "its clean-stop marker (epoch {}, seq {}) does not match the log (epoch {current}, seq {last_seq})",
                    m.epoch, m.last_seq
                ),
                None => "no clean-stop marker".to_owned(),
            };
            let detail = format!(
                "unclean stop: new epoch. The agent's last stop was not clean ({why}): a crash, \
                 SIGKILL, power loss, or its state directory put back from a copy of a running \
                 agent. The event log continues under the new epoch {epoch} from seq {} (the \
                 old epoch {current} ended at seq {last_seq}), so no (epoch, seq) is handed out \
                 twice; a watcher resuming with the old epoch gets OUT_OF_RANGE and \
                 resynchronises. Stands until the node's set is acknowledged again",
                last_seq + 1
            );
            let mut events = txn.open_table(EVENTS)?;
            let raised = EventKind::ConditionChanged {
                condition: ConditionKind::UncleanStop,
                active: true,
                detail,
            };
            let event = append(&mut meta, &mut events, vec![raised], now_unix_ns, self.retain)?
                .pop()
                .ok_or(StoreError::Corrupt(super::Corruption::SequenceExhausted))?;
            next.last_seq = event.seq;
            started = Some(epoch);
            Ok(LifeStart::NewEpoch {
                previous: current,
                epoch,
                event: Box::new(event),
            })
        })?;
        if let Some(epoch) = started {
            *self.epoch.lock().unwrap_or_else(|p| p.into_inner()) = epoch;
            tracing::warn!(%epoch, "unclean stop: new epoch (no clean-stop marker: a crash, SIGKILL, power loss, or a state directory put back from a copy of a running agent)");
        }
        Ok(out)
    }

    /// Records a clean stop, durably: call at shutdown once nothing will append another event
    /// (the API drained, the reconciler stopped). The next [`Store::begin_life`] then keeps the
    /// epoch. Any commit after it removes the marker again.
    pub fn mark_clean_stop(&self) -> Result<(), StoreError> {
        self.write(|txn, _| {
            let mut meta = txn.open_table(META)?;
            let marker = CleanStop {
                epoch: self.epoch().to_string(),
                last_seq: read_u64(&meta, LAST_SEQ)?,
            };
            meta.insert(CLEAN_STOP, encode(&marker)?.as_slice())?;
            Ok(())
        })
    }

    /// Whether the clean-stop marker is stored (for tests and `doctor`-like checks).
    pub fn clean_stop_marked(&self) -> Result<bool, StoreError> {
        Ok(self.meta(CLEAN_STOP)?.is_some())
    }
}

#[cfg(test)]
mod tests;
