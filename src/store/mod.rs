//! The durable store: desired attachments and the ordered event log in one redb database.
//!
//! Every change is one ACID write transaction committed with immediate durability (fsync), and a
//! state change and the events reporting it commit together, so after a crash at any moment the
//! log and the attachments agree and sequence numbers continue without gaps or duplicates.
//!
//! Identity: the store holds a log epoch, a random 128-bit id created with the store (or at the
//! first open of a store that predates it) and never changed. Sequence numbers are only
//! comparable within one epoch: a wiped state directory starts a new epoch at seq 1.
//!
//! Rollback: after every write a side file next to the database (`mirror.rs`) repeats the
//! store's id and write counter. A database that is older than its mirror (restored from a copy)
//! or not the one it names (replaced) gets, in the transaction that opens it, a new log epoch, an
//! empty log that continues above every seq the mirror saw (with one seq left out, so every old
//! cursor is out of range), an apply ledger whose reserved generation is at least the
//! mirror's, a raised `STORE_ROLLED_BACK` condition ([`Store::rolled_back`]), and every live
//! attachment that wants its key marked [`Restored::AwaitingRead`]: the copy may predate a
//! release, so the reconciler withholds the key until the ports or the control plane confirm
//! it.
//!
//! A restore of the whole state directory (the mirror restored with the database) cannot be
//! seen here; the fabric side's evidence (it holds a newer generation of the node's set than
//! any this store sent) is, and the reconciler then commits a batch with
//! [`Batch::restart_log`]: a new epoch and an empty log that continues [`RESTART_GAP`] seqs
//! above the restored one, in the same transaction as the condition it raises and the marks on
//! the live attachments. A life whose log was already restarted (at this open, or by an
//! earlier rollback it raised) marks the attachments in the condition's commit instead, keeping
//! the events it committed since.
//!
//! Conditions: the standing conditions are kept with the events that raise and clear them, in
//! the same transaction ([`Store::conditions`]), so a restarted agent knows what it last
//! reported.
//!
//! Retention: the log keeps the newest `events.retain` events (default 100,000); older ones are
//! pruned in the transaction that appends new ones. RELEASED attachments are pruned once older
//! than `events.released_retain_secs` (default 7 days).

mod error;
mod life;
mod mirror;
mod tables;

pub use error::{Corruption, StoreError};
pub use life::LifeStart;

use crate::domain::{
    ApplyLedger, Attachment, AttachmentState, ConditionKind, Event, EventKind, InstanceId, Restored,
};
use mirror::{Mirror, MirrorState};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use tables::{ATTACHMENTS, EVENTS, LIVE, META, RELEASED_AT};

const LAST_SEQ: &str = "last_seq";
const APPLY_LEDGER: &str = "apply_ledger";
const LOG_EPOCH: &str = "log_epoch";
/// The store's id (16 bytes), mirrored in the side file.
const STORE_ID: &str = "store_id";
/// Write transactions committed (8 bytes), mirrored in the side file.
const COMMITS: &str = "commits";
/// The standing conditions last reported (JSON: kind -> detail).
const CONDITIONS: &str = "conditions";
/// Present once the LIVE and RELEASED_AT indexes cover every attachment.
const INDEXED: &str = "attachment_index_v1";

/// How far a log restarted on the fabric side's evidence ([`Batch::restart_log`]) jumps its
/// seq: the restored store cannot know how many seqs the lost writes handed out, so the gap is
/// far beyond any a control plane may have followed (2^32 events).
pub const RESTART_GAP: u64 = 1 << 32;

/// The event log's identity: a random id created with the store, shown as 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogEpoch(u128);

impl LogEpoch {
    /// A fresh random epoch (never zero).
    fn generate() -> LogEpoch {
        LogEpoch(rand::random::<u128>().max(1))
    }
}

impl std::fmt::Display for LogEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A page of attachments (see [`Store::attachments_page`]).
#[derive(Debug, Default)]
pub struct AttachmentPage {
    /// Matching attachments, ordered by instance id.
    pub attachments: Vec<Attachment>,
    /// Whether attachments with a greater instance id than the last one returned may match.
    pub more: bool,
}

/// The agent's durable store.
pub struct Store {
    db: Database,
    retain: u64,
    /// Changed only by a [`Batch::restart_log`] commit (under the write lock).
    epoch: Mutex<LogEpoch>,
    /// The side file (None for a store in memory).
    mirror: Option<Mirror>,
    /// What the last write left (and the mirror holds); held for the whole of each write so
    /// the mirror never goes back.
    written: Mutex<MirrorState>,
    /// Why this open found a rolled-back store.
    rollback: Option<String>,
    /// The store was created by this open (no earlier life: `life.rs`).
    fresh: bool,
}

/// A batch of changes committed atomically.
#[derive(Debug, Default)]
pub struct Batch {
    /// Attachments to insert or replace.
    pub upserts: Vec<Attachment>,
    /// Attachments to delete (pruning).
    pub deletes: Vec<InstanceId>,
    /// Events to append, in order.
    pub events: Vec<EventKind>,
    /// A new apply ledger to store with the rest.
    pub ledger: Option<ApplyLedger>,
    /// Start a new log epoch before appending `events`: the store went back in time without
    /// its mirror noticing (a whole state directory restored; the fabric side holds a newer
    /// generation of this node's set). The old events go, and the log continues
    /// [`RESTART_GAP`] seqs above the newest, so no seq the lost writes handed out is reused
    /// and every old cursor is out of range. The live attachments that want their key are
    /// marked [`Restored::AwaitingRead`] in the same transaction (before `upserts`).
    pub restart_log: bool,
}

impl Batch {
    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty()
            && self.deletes.is_empty()
            && self.events.is_empty()
            && self.ledger.is_none()
            && !self.restart_log
    }
}

impl Store {
    /// Opens (or creates) the database file; `retain` bounds the event log.
    pub fn open(path: &Path, retain: u64) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                path: dir.to_owned(),
                source,
            })?;
        }
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                StoreError::Locked(path.parent().unwrap_or(path).to_owned())
            }
            other => StoreError::from(other),
        })?;
        // The agent's alone, whatever the umask (the unit's UMask=0007 would leave it
        // group-writable).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(
            |source| StoreError::Io {
                path: path.to_owned(),
                source,
            },
        )?;
        Store::init(db, retain, Some(Mirror::of(path)))
    }

    /// A store kept in memory only: nothing survives the process. For tests and the
    /// reconciler's simulation, where a "crash" drops everything but the store itself.
    pub fn in_memory(retain: u64) -> Result<Store, StoreError> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        Store::init(db, retain, None)
    }

    fn init(db: Database, retain: u64, mirror: Option<Mirror>) -> Result<Store, StoreError> {
        let mirrored = mirror.as_ref().map(Mirror::read).transpose()?.flatten();
        let txn = db.begin_write()?;
        // Create every table so readers never meet a missing one.
        txn.open_table(ATTACHMENTS)?;
        txn.open_table(EVENTS)?;
        txn.open_table(META)?;
        txn.open_table(tables::SM_NODES)?;
        txn.open_table(LIVE)?;
        txn.open_table(RELEASED_AT)?;
        build_index(&txn)?;
        let (epoch, written, rollback, fresh) = {
            let mut meta = txn.open_table(META)?;
            let stored = meta.get(LOG_EPOCH)?.map(|v| epoch_from(v.value()));
            // A store with a log but no epoch predates epochs: it had lives.
            let fresh = stored.is_none() && read_u64(&meta, LAST_SEQ)? == 0;
            let mut epoch = match stored {
                Some(e) => e?,
                None => {
                    let e = LogEpoch::generate();
                    meta.insert(LOG_EPOCH, e.0.to_be_bytes().as_slice())?;
                    e
                }
            };
            let stored_id = meta.get(STORE_ID)?.map(|v| u128_from(v.value()));
            let store_id = match stored_id {
                Some(id) => id?,
                None => {
                    let id = rand::random::<u128>().max(1);
                    meta.insert(STORE_ID, id.to_be_bytes().as_slice())?;
                    id
                }
            };
            let mut ledger: ApplyLedger = match meta.get(APPLY_LEDGER)? {
                Some(v) => decode(v.value())?,
                None => ApplyLedger::default(),
            };
            let mut state = MirrorState {
                store_id,
                commits: read_u64(&meta, COMMITS)?,
                last_seq: read_u64(&meta, LAST_SEQ)?,
                generation_reserved: ledger.generation_reserved,
            };
            let rollback = mirrored.and_then(|m| mirror::rolled_back(&state, &m).map(|w| (m, w)));
            if let Some((m, why)) = &rollback {
                tracing::error!(%why, "store rolled back: starting a new log epoch");
                epoch = LogEpoch::generate();
                meta.insert(LOG_EPOCH, epoch.0.to_be_bytes().as_slice())?;
                if m.generation_reserved > ledger.generation_reserved {
                    ledger.generation_reserved = m.generation_reserved;
                    meta.insert(APPLY_LEDGER, encode(&ledger)?.as_slice())?;
                }
                // The old events go (they belong to the old epoch); the log continues above
                // every seq handed out, with one left out so no old cursor is in range.
                let mut events = txn.open_table(EVENTS)?;
                events.retain(|_, _| false)?;
                let skipped = state.last_seq.max(m.last_seq).saturating_add(1);
                meta.insert(LAST_SEQ, skipped.to_be_bytes().as_slice())?;
                let raised = EventKind::ConditionChanged {
                    condition: ConditionKind::StoreRolledBack,
                    active: true,
                    detail: why.clone(),
                };
                state.last_seq = append(&mut meta, &mut events, vec![raised], now_ns(), retain)?
                    .last()
                    .map_or(skipped, |e| e.seq);
                state.generation_reserved = ledger.generation_reserved;
                state.commits = state.commits.max(m.commits);
                mark_restored(&txn)?;
            }
            state.commits += 1;
            meta.insert(COMMITS, state.commits.to_be_bytes().as_slice())?;
            (epoch, state, rollback.map(|(_, why)| why), fresh)
        };
        txn.commit()?;
        if let Some(m) = &mirror {
            m.write(&written).map_err(|source| StoreError::Io {
                path: m.path().to_owned(),
                source,
            })?;
        }
        Ok(Store {
            db,
            retain,
            epoch: Mutex::new(epoch),
            mirror,
            written: Mutex::new(written),
            rollback,
            fresh,
        })
    }

    /// Why this store was found rolled back when it was opened (restored from a copy, or not
    /// the database last written here), or None.
    pub fn rolled_back(&self) -> Option<&str> {
        self.rollback.as_deref()
    }

    /// The standing conditions as the log last reported them (raised and not cleared).
    pub fn conditions(&self) -> Result<BTreeMap<ConditionKind, String>, StoreError> {
        self.meta(CONDITIONS)?
            .map(|b| decode(&b))
            .transpose()
            .map(Option::unwrap_or_default)
    }

    /// Runs one write transaction, counting it in the store and its mirror: the mirror is
    /// rewritten after the commit, under the same lock, so it never goes back.
    fn write<R>(
        &self,
        f: impl FnOnce(&redb::WriteTransaction, &mut MirrorState) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = *written;
        next.commits += 1;
        let txn = self.db.begin_write()?;
        let out = f(&txn, &mut next)?;
        txn.open_table(META)?
            .insert(COMMITS, next.commits.to_be_bytes().as_slice())?;
        txn.commit()?;
        *written = next;
        if let Some(m) = &self.mirror {
            // The database is ahead of its mirror until the next write: never a false rollback,
            // only a later one that may go unnoticed.
            if let Err(e) = m.write(&next) {
                tracing::warn!(path = %m.path().display(), error = %e, "writing the store mirror failed");
            }
        }
        Ok(out)
    }

    /// The event log's epoch.
    pub fn epoch(&self) -> LogEpoch {
        *self.epoch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `limit` attachments with an instance id greater than `after` (from the first when
    /// `None`) that `keep` accepts, ordered by instance id, read in one snapshot. Paging with
    /// the last id returned never repeats an attachment and never skips one that existed
    /// before the first page was read.
    pub fn attachments_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&Attachment) -> bool,
    ) -> Result<AttachmentPage, StoreError> {
        use std::ops::Bound;
        let txn = self.db.begin_read()?;
        let table = txn.open_table(ATTACHMENTS)?;
        let lower = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        let mut page = AttachmentPage::default();
        for row in table.range::<&str>((lower, Bound::Unbounded))? {
            let (_, v) = row?;
            let a: Attachment = decode(v.value())?;
            if !keep(&a) {
                continue;
            }
            if page.attachments.len() == limit {
                page.more = true;
                break;
            }
            page.attachments.push(a);
        }
        Ok(page)
    }

    /// Every attachment, ordered by instance id.
    pub fn attachments(&self) -> Result<Vec<Attachment>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(ATTACHMENTS)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (_, v) = row?;
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// One attachment.
    pub fn attachment(&self, instance: &str) -> Result<Option<Attachment>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(ATTACHMENTS)?;
        table.get(instance)?.map(|v| decode(v.value())).transpose()
    }

    /// Commits a batch: attachment changes and the events reporting them, atomically and
    /// durably. Returns the events with their sequence numbers, to publish after the commit.
    pub fn commit(&self, batch: Batch, now_unix_ns: i64) -> Result<Vec<Event>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut restarted = None;
        let appended = self.write(|txn, next| {
            let appended;
            if batch.restart_log {
                mark_restored(txn)?;
            }
            {
                let mut attachments = txn.open_table(ATTACHMENTS)?;
                let mut index = Index {
                    live: txn.open_table(LIVE)?,
                    released_at: txn.open_table(RELEASED_AT)?,
                };
                for a in &batch.upserts {
                    let old = attachments
                        .insert(a.instance_id.as_str(), encode(a)?.as_slice())?
                        .map(|v| decode::<Attachment>(v.value()))
                        .transpose()?;
                    if let Some(old) = old {
                        index.remove(&old)?;
                    }
                    index.add(a)?;
                }
                for id in &batch.deletes {
                    let old = attachments
                        .remove(id.as_str())?
                        .map(|v| decode::<Attachment>(v.value()))
                        .transpose()?;
                    if let Some(old) = old {
                        index.remove(&old)?;
                    }
                }
                let mut meta = txn.open_table(META)?;
                // Written after a clean stop: the marker no longer describes the log.
                meta.remove(life::CLEAN_STOP)?;
                if let Some(ledger) = &batch.ledger {
                    meta.insert(APPLY_LEDGER, encode(ledger)?.as_slice())?;
                    next.generation_reserved = ledger.generation_reserved;
                }
                let mut events = txn.open_table(EVENTS)?;
                // Test-only (debug builds, `FABRIC_AGENT_TEST_MUTATION`): the rule switched
                // off, to prove the chaos checker catches it. Never true in a release build.
                let keep_epoch = batch.restart_log
                    && crate::test_mutation::active(crate::test_mutation::Mutation::LogKeepsEpoch);
                if keep_epoch {
                    tracing::warn!("TEST MUTATION log-keeps-epoch: the store went back in time; its log epoch and seqs kept");
                }
                if batch.restart_log && !keep_epoch {
                    let epoch = LogEpoch::generate();
                    meta.insert(LOG_EPOCH, epoch.0.to_be_bytes().as_slice())?;
                    events.retain(|_, _| false)?;
                    let skipped = read_u64(&meta, LAST_SEQ)?.saturating_add(RESTART_GAP);
                    meta.insert(LAST_SEQ, skipped.to_be_bytes().as_slice())?;
                    tracing::error!(%epoch, first_seq = skipped + 1, "store went back in time (the fabric side holds newer sets): starting a new log epoch");
                    restarted = Some(epoch);
                }
                appended = append(
                    &mut meta,
                    &mut events,
                    batch.events,
                    now_unix_ns,
                    self.retain,
                )?;
                next.last_seq = read_u64(&meta, LAST_SEQ)?;
            }
            Ok(appended)
        })?;
        if let Some(epoch) = restarted {
            *self.epoch.lock().unwrap_or_else(|p| p.into_inner()) = epoch;
        }
        Ok(appended)
    }

    /// Up to `limit` events with `seq > after`, oldest first.
    pub fn events_after(&self, after: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EVENTS)?;
        let mut out = Vec::new();
        for row in table.range(after.saturating_add(1)..)?.take(limit) {
            let (_, v) = row?;
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// (oldest retained seq, newest seq); (0, 0) when the log is empty.
    pub fn event_bounds(&self) -> Result<(u64, u64), StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EVENTS)?;
        let first = table.first()?.map(|(k, _)| k.value()).unwrap_or(0);
        let last = table.last()?.map(|(k, _)| k.value()).unwrap_or(0);
        Ok((first, last))
    }

    /// The newest event's seq as recorded in the log's counter (0 when none was ever
    /// appended): the top of the range a watcher may resume from.
    pub fn last_seq(&self) -> Result<u64, StoreError> {
        self.meta(LAST_SEQ)?
            .map(|b| u64_from(&b))
            .transpose()
            .map(Option::unwrap_or_default)
    }

    /// The apply ledger (empty when none was ever stored).
    pub fn ledger(&self) -> Result<ApplyLedger, StoreError> {
        self.meta(APPLY_LEDGER)?
            .map(|b| decode(&b))
            .transpose()
            .map(Option::unwrap_or_default)
    }

    /// Reads an opaque value (used for the simulated fabric's tables).
    pub fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Writes an opaque value durably.
    pub fn set_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.write(|txn, _| {
            txn.open_table(META)?.insert(key, value)?;
            Ok(())
        })
    }

    /// Every value of the SM-host node-membership table (node id -> JSON).
    pub fn sm_nodes(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(tables::SM_NODES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            out.push((k.value().to_owned(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Replaces several entries of the SM-host node-membership table and, when given, one
    /// opaque value, in one durable transaction.
    pub fn put_sm_nodes(
        &self,
        nodes: &[(String, Vec<u8>)],
        meta: Option<(&str, &[u8])>,
    ) -> Result<(), StoreError> {
        self.write(|txn, _| {
            {
                let mut table = txn.open_table(tables::SM_NODES)?;
                for (id, value) in nodes {
                    table.insert(id.as_str(), value.as_slice())?;
                }
            }
            if let Some((key, value)) = meta {
                txn.open_table(META)?.insert(key, value)?;
            }
            Ok(())
        })
    }

    /// Instance ids of RELEASED attachments last updated before `cutoff_unix_ns`.
    pub fn expired_released(&self, cutoff_unix_ns: i64) -> Result<Vec<InstanceId>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(RELEASED_AT)?;
        let mut out = Vec::new();
        for row in table.range(..(cutoff_unix_ns, ""))? {
            let (k, _) = row?;
            let (_, id) = k.value();
            out.push(InstanceId::parse(id).map_err(|source| {
                StoreError::Corrupt(Corruption::InstanceId {
                    id: id.to_owned(),
                    source,
                })
            })?);
        }
        Ok(out)
    }

    /// When the oldest RELEASED attachment was released (None when there is none): the
    /// reconciler prunes it `released_retain_secs` later.
    pub fn oldest_released(&self) -> Result<Option<i64>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(RELEASED_AT)?;
        let oldest = table.first()?.map(|(k, _)| k.value().0);
        Ok(oldest)
    }

    /// Every attachment that is not RELEASED, ordered by instance id: what the reconciler and
    /// admission work on. Its cost depends on the live attachments only, not on history.
    pub fn live_attachments(&self) -> Result<Vec<Attachment>, StoreError> {
        let txn = self.db.begin_read()?;
        let live = txn.open_table(LIVE)?;
        let table = txn.open_table(ATTACHMENTS)?;
        let mut out = Vec::new();
        for row in live.iter()? {
            let (k, _) = row?;
            let id = k.value();
            match table.get(id)? {
                Some(v) => out.push(decode(v.value())?),
                None => {
                    return Err(StoreError::Corrupt(Corruption::LiveIndexDangling(
                        id.to_owned(),
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// The attachment indexes, open in one write transaction.
struct Index<'txn> {
    live: redb::Table<'txn, &'static str, ()>,
    released_at: redb::Table<'txn, (i64, &'static str), ()>,
}

impl Index<'_> {
    fn add(&mut self, a: &Attachment) -> Result<(), StoreError> {
        let id = a.instance_id.as_str();
        if a.state == AttachmentState::Released {
            self.released_at.insert((a.updated_unix_ns, id), ())?;
        } else {
            self.live.insert(id, ())?;
        }
        Ok(())
    }

    fn remove(&mut self, a: &Attachment) -> Result<(), StoreError> {
        let id = a.instance_id.as_str();
        if a.state == AttachmentState::Released {
            self.released_at.remove((a.updated_unix_ns, id))?;
        } else {
            self.live.remove(id)?;
        }
        Ok(())
    }
}

/// Marks every live attachment that wants its key as restored (its key withheld until the first
/// port read or the control plane confirms it: see [`Restored`]), in the transaction that found
/// the rollback. The indexes do not change: the state does not.
fn mark_restored(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    let live: Vec<String> = {
        let live = txn.open_table(LIVE)?;
        let mut ids = Vec::new();
        for row in live.iter()? {
            ids.push(row?.0.value().to_owned());
        }
        ids
    };
    let mut attachments = txn.open_table(ATTACHMENTS)?;
    for id in live {
        let Some(mut a) = attachments
            .get(id.as_str())?
            .map(|v| decode::<Attachment>(v.value()))
            .transpose()?
        else {
            continue;
        };
        if a.state.wants_key() && a.restored.is_none() {
            a.restored = Some(Restored::AwaitingRead);
            attachments.insert(id.as_str(), encode(&a)?.as_slice())?;
        }
    }
    Ok(())
}

/// Builds the attachment indexes of a store written before they existed (once).
fn build_index(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    let mut meta = txn.open_table(META)?;
    if meta.get(INDEXED)?.is_some() {
        return Ok(());
    }
    let attachments = txn.open_table(ATTACHMENTS)?;
    let mut index = Index {
        live: txn.open_table(LIVE)?,
        released_at: txn.open_table(RELEASED_AT)?,
    };
    for row in attachments.iter()? {
        let (_, v) = row?;
        index.add(&decode::<Attachment>(v.value())?)?;
    }
    meta.insert(INDEXED, [1u8].as_slice())?;
    Ok(())
}

/// Appends events after the log's counter, keeps the standing conditions they raise and clear,
/// and prunes the oldest events beyond `retain`. Returns the events with their seqs.
fn append(
    meta: &mut redb::Table<&str, &[u8]>,
    events: &mut redb::Table<u64, &[u8]>,
    kinds: Vec<EventKind>,
    now_unix_ns: i64,
    retain: u64,
) -> Result<Vec<Event>, StoreError> {
    let mut seq = read_u64(meta, LAST_SEQ)?;
    let mut conditions: Option<BTreeMap<ConditionKind, String>> = None;
    let mut appended = Vec::with_capacity(kinds.len());
    for kind in kinds {
        seq = seq
            .checked_add(1)
            .ok_or(StoreError::Corrupt(Corruption::SequenceExhausted))?;
        if let EventKind::ConditionChanged {
            condition,
            active,
            detail,
        } = &kind
        {
            let map = match &mut conditions {
                Some(m) => m,
                None => conditions.insert(match meta.get(CONDITIONS)? {
                    Some(v) => decode(v.value())?,
                    None => BTreeMap::new(),
                }),
            };
            if *active {
                map.insert(*condition, detail.clone());
            } else {
                map.remove(condition);
            }
        }
        let event = Event {
            seq,
            time_unix_ns: now_unix_ns,
            kind,
        };
        events.insert(seq, encode(&event)?.as_slice())?;
        appended.push(event);
    }
    if let Some(map) = conditions {
        meta.insert(CONDITIONS, encode(&map)?.as_slice())?;
    }
    meta.insert(LAST_SEQ, seq.to_be_bytes().as_slice())?;
    // Prune the oldest events beyond retention.
    if events.len()? > retain {
        let cut = seq.saturating_sub(retain);
        events.retain_in(..=cut, |_, _| false)?;
    }
    Ok(appended)
}

fn read_u64(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<u64, StoreError> {
    match meta.get(key)? {
        Some(v) => u64_from(v.value()),
        None => Ok(0),
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn u128_from(b: &[u8]) -> Result<u128, StoreError> {
    b.try_into()
        .map(u128::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(Corruption::Width("store_id", 16)))
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    Ok(serde_json::to_vec(v)?)
}

fn decode<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, StoreError> {
    Ok(serde_json::from_slice(b)?)
}

fn u64_from(b: &[u8]) -> Result<u64, StoreError> {
    b.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(Corruption::Width("last_seq", 8)))
}

fn epoch_from(b: &[u8]) -> Result<LogEpoch, StoreError> {
    b.try_into()
        .map(|b| LogEpoch(u128::from_be_bytes(b)))
        .map_err(|_| StoreError::Corrupt(Corruption::Width("log_epoch", 16)))
}

#[cfg(test)]
mod evidence_tests;
#[cfg(test)]
mod tests;
