//! The UFM ledger: for each P_Key, every port GUID this node ever asked UFM to put in it (or
//! found there as one of its ports) and has not yet seen removed.
//!
//! It is what makes a release complete when ports are not visible: an HCA that failed to
//! enumerate, a narrowed port selector, a replaced card, a restart. GUIDs are recorded durably
//! *before* the add request is sent (a failed or timed-out add may still have taken effect),
//! and dropped only after a read of UFM showed them gone. Only GUIDs in the ledger for a key
//! are ever removed from that key, so a GUID now owned by another node is never touched in a
//! key this node did not put it in.
//!
//! Late writes: an add UFM may still execute after the client gave up (it failed, timed out,
//! was retried or cancelled) puts its key under *watch* until the latest time it could land
//! (`late_write_window_ms` after it was sent). While a key is watched its GUIDs stay here even
//! when a read shows them gone, so every apply keeps reading the key and removes a
//! re-appearance at once; only a read started after the watch ended may drop them.
//!
//! Store restores: a ledger restored with the node's store from a copy lacks every add sent
//! after the copy was taken. The backend then puts the whole ledger under a *restore watch*
//! until `late_write_window_ms` after the start that found the restore: every key is treated
//! as watched, and only a read of UFM's whole partition list started after that ends it.
//!
//! Format (JSON, one value): `{"version":1,"keys":{"0x0a12":["0002c903000e0b72", ...]}}`, keys
//! and GUIDs spelled as UFM spells them, plus `"watch":{"0x0a12":<unix ms>}` while a key is
//! watched and `"restore_watch":<unix ms>` while the restore watch stands.

use super::wire::{guid_text, parse_pkey, pkey_text};
use crate::domain::{Guid, PKey};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use thiserror::Error;

const VERSION: u32 = 1;

/// The ledger could not be read or written; its cause is kept as the source.
#[derive(Debug, Clone, Error)]
#[error("{0}")]
pub struct LedgerStoreError(#[source] pub Arc<dyn std::error::Error + Send + Sync>);

impl LedgerStoreError {
    /// A ledger store failure caused by `cause` (an error value, or a text for a store without
    /// one).
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        LedgerStoreError(Arc::from(cause.into()))
    }
}

/// Where the ledger is kept: one opaque value, read once and replaced whole.
pub trait UfmLedgerStore: Send + Sync + 'static {
    /// The saved value, `None` when nothing was ever saved.
    fn load(&self) -> Result<Option<Vec<u8>>, LedgerStoreError>;

    /// Replaces the saved value durably; returns only once it would survive a crash.
    fn save(&self, bytes: &[u8]) -> Result<(), LedgerStoreError>;
}

/// A ledger store in memory: survives rebuilding the backend (share it by cloning), not the
/// process. For tests and benchmarks. Saves can be made to fail.
#[derive(Debug, Clone, Default)]
pub struct MemoryLedgerStore {
    inner: Arc<Mutex<MemoryInner>>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    value: Option<Vec<u8>>,
    refuse_saves: bool,
    saves: usize,
}

impl MemoryLedgerStore {
    /// An empty store.
    pub fn new() -> MemoryLedgerStore {
        MemoryLedgerStore::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut MemoryInner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes every save fail (`true`) or succeed again (`false`).
    pub fn refuse_saves(&self, refuse: bool) {
        self.with(|i| i.refuse_saves = refuse);
    }

    /// Successful saves so far.
    pub fn saves(&self) -> usize {
        self.with(|i| i.saves)
    }

    /// The ledger as last saved (empty when never saved).
    pub fn ledger(&self) -> Result<UfmLedger, LedgerDecodeError> {
        match self.with(|i| i.value.clone()) {
            Some(bytes) => UfmLedger::decode(&bytes),
            None => Ok(UfmLedger::default()),
        }
    }
}

impl UfmLedgerStore for MemoryLedgerStore {
    fn load(&self) -> Result<Option<Vec<u8>>, LedgerStoreError> {
        Ok(self.with(|i| i.value.clone()))
    }

    fn save(&self, bytes: &[u8]) -> Result<(), LedgerStoreError> {
        self.with(|i| {
            if i.refuse_saves {
                return Err(LedgerStoreError::new("the store refuses writes"));
            }
            i.value = Some(bytes.to_vec());
            i.saves += 1;
            Ok(())
        })
    }
}

/// Per P_Key, the GUIDs this node may have in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UfmLedger {
    keys: BTreeMap<PKey, BTreeSet<Guid>>,
    /// Key -> unix milliseconds until which an add carrying it may still land.
    watch: BTreeMap<PKey, i64>,
    /// Unix milliseconds until which an add this ledger does not know of may still land in
    /// any key (the store was restored from a copy).
    restore: Option<i64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerFile {
    version: u32,
    keys: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    watch: BTreeMap<String, i64>,
    // Absent in ledgers written before store restores were watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restore_watch: Option<i64>,
}

impl UfmLedger {
    /// Whether no key holds any GUID of this node, none is watched and no restore watch stands.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.watch.is_empty() && self.restore.is_none()
    }

    /// Until when (unix ms) the restore watch stands, if it does: any key may receive a late
    /// add of this node that the ledger does not know of.
    pub fn restore_watched_until(&self) -> Option<i64> {
        self.restore
    }

    /// Puts every key under the restore watch until at least `until_ms`.
    pub(crate) fn watch_restore(&mut self, until_ms: i64) {
        self.restore = Some(self.restore.map_or(until_ms, |t| t.max(until_ms)));
    }

    /// Ends the restore watch (a whole-list read started after it showed every key right).
    pub(crate) fn end_restore_watch(&mut self) {
        self.restore = None;
    }

    /// Until when `key` must be treated as watched: its own watch or the restore watch,
    /// whichever ends later.
    pub(crate) fn watch_end(&self, key: PKey) -> Option<i64> {
        self.watched_until(key).max(self.restore)
    }

    /// Until when (unix ms) `key` is watched for a late add, if it is.
    pub fn watched_until(&self, key: PKey) -> Option<i64> {
        self.watch.get(&key).copied()
    }

    /// Every watched key with the end of its watch.
    pub fn watched(&self) -> impl Iterator<Item = (PKey, i64)> + '_ {
        self.watch.iter().map(|(k, t)| (*k, *t))
    }

    /// Watches `key` until at least `until_ms`.
    pub(crate) fn watch(&mut self, key: PKey, until_ms: i64) {
        let e = self.watch.entry(key).or_insert(until_ms);
        *e = (*e).max(until_ms);
    }

    /// Re-arms every standing watch (each key's and the restore watch) to end at exactly
    /// `until_ms`, later or earlier than recorded: what a process does with the watches it
    /// loads (module docs of `ledger_io`, "Watches across restarts"). Returns how many it
    /// re-armed.
    pub(crate) fn rearm_watches(&mut self, until_ms: i64) -> usize {
        for t in self.watch.values_mut() {
            *t = until_ms;
        }
        if let Some(t) = self.restore.as_mut() {
            *t = until_ms;
        }
        self.watch.len() + usize::from(self.restore.is_some())
    }

    /// Replaces the watch of `key` (None: not watched).
    pub(crate) fn restore_watch(&mut self, key: PKey, until_ms: Option<i64>) {
        self.watch.remove(&key);
        if let Some(t) = until_ms {
            self.watch.insert(key, t);
        }
    }

    /// Every key with GUIDs recorded.
    pub fn keys(&self) -> impl Iterator<Item = PKey> + '_ {
        self.keys.keys().copied()
    }

    /// The GUIDs recorded for `key` (empty when none).
    pub fn guids(&self, key: PKey) -> BTreeSet<Guid> {
        self.keys.get(&key).cloned().unwrap_or_default()
    }

    /// The GUIDs recorded for `key`, borrowed.
    pub(crate) fn guids_ref(&self, key: PKey) -> Option<&BTreeSet<Guid>> {
        self.keys.get(&key)
    }

    /// Records `guids` for `key`. Returns whether anything was new.
    pub(crate) fn record(&mut self, key: PKey, guids: impl IntoIterator<Item = Guid>) -> bool {
        let entry = self.keys.entry(key).or_default();
        let before = entry.len();
        entry.extend(guids);
        let changed = entry.len() != before;
        if entry.is_empty() {
            self.keys.remove(&key);
        }
        changed
    }

    /// After a read of UFM confirmed that, of the recorded GUIDs, only `kept` are in `key`:
    /// the entry becomes `kept` (every other recorded GUID was seen absent). Returns whether the
    /// ledger changed.
    pub(crate) fn confirm(&mut self, key: PKey, kept: &BTreeSet<Guid>) -> bool {
        let before = self.keys.get(&key).cloned().unwrap_or_default();
        if &before == kept {
            return false;
        }
        if kept.is_empty() {
            self.keys.remove(&key);
        } else {
            self.keys.insert(key, kept.clone());
        }
        true
    }

    /// The saved form.
    pub fn encode(&self) -> Vec<u8> {
        let file = LedgerFile {
            version: VERSION,
            keys: self
                .keys
                .iter()
                .map(|(k, guids)| (pkey_text(*k), guids.iter().map(|g| guid_text(*g)).collect()))
                .collect(),
            watch: self
                .watch
                .iter()
                .map(|(k, t)| (pkey_text(*k), *t))
                .collect(),
            restore_watch: self.restore,
        };
        serde_json::to_vec(&file).expect("the ledger serialises")
    }

    /// Reads the saved form.
    pub fn decode(bytes: &[u8]) -> Result<UfmLedger, LedgerDecodeError> {
        let file: LedgerFile = serde_json::from_slice(bytes)?;
        if file.version != VERSION {
            return Err(LedgerDecodeError::Version(file.version));
        }
        let mut ledger = UfmLedger::default();
        for (key_text, guids) in &file.keys {
            let key =
                parse_pkey(key_text).ok_or_else(|| LedgerDecodeError::Key(key_text.clone()))?;
            let guids: BTreeSet<Guid> = guids
                .iter()
                .map(|g| {
                    g.parse::<Guid>().map_err(|_| LedgerDecodeError::Guid {
                        guid: g.clone(),
                        key: key_text.clone(),
                    })
                })
                .collect::<Result<_, _>>()?;
            ledger.record(key, guids);
        }
        for (key_text, until) in &file.watch {
            let key =
                parse_pkey(key_text).ok_or_else(|| LedgerDecodeError::Key(key_text.clone()))?;
            ledger.watch.insert(key, *until);
        }
        ledger.restore = file.restore_watch;
        Ok(ledger)
    }
}

/// Why a saved UFM ledger does not decode.
#[derive(Debug, thiserror::Error)]
pub enum LedgerDecodeError {
    /// Not the ledger's JSON form.
    #[error("not a UFM ledger: {0}")]
    Json(#[from] serde_json::Error),
    /// A version this build does not read.
    #[error("UFM ledger version {0} is not understood (expected {VERSION})")]
    Version(u32),
    /// A key that is not a tenant P_Key.
    #[error("UFM ledger key {0:?} is not a tenant P_Key")]
    Key(String),
    /// A GUID that is not hex.
    #[error("UFM ledger GUID {guid:?} under {key} is not hex")]
    Guid {
        /// The GUID's text.
        guid: String,
        /// The key it is listed under.
        key: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u32) -> PKey {
        PKey::new(k).unwrap()
    }

    fn set(g: &[u64]) -> BTreeSet<Guid> {
        g.iter().map(|g| Guid(*g)).collect()
    }

    #[test]
    fn round_trips_in_the_documented_form() {
        let mut l = UfmLedger::default();
        assert!(l.record(key(0x0a12), set(&[0x0002_c903_000e_0b72, 1])));
        assert!(!l.record(key(0x0a12), set(&[1])));
        assert!(l.record(key(5), set(&[2])));
        let bytes = l.encode();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"version":1,"keys":{"0x0005":["0000000000000002"],"0x0a12":["0000000000000001","0002c903000e0b72"]}}"#
        );
        assert_eq!(UfmLedger::decode(&bytes).unwrap(), l);
    }

    #[test]
    fn watches_round_trip_and_only_grow_until_restored() {
        let mut l = UfmLedger::default();
        l.record(key(0x0a12), set(&[1]));
        l.watch(key(0x0a12), 2_000);
        l.watch(key(0x0a12), 1_000);
        assert_eq!(l.watched_until(key(0x0a12)), Some(2_000));
        let bytes = l.encode();
        assert!(String::from_utf8_lossy(&bytes).contains(r#""watch":{"0x0a12":2000}"#));
        assert_eq!(UfmLedger::decode(&bytes).unwrap(), l);
        l.restore_watch(key(0x0a12), None);
        assert_eq!(l.watched_until(key(0x0a12)), None);
        assert!(!String::from_utf8_lossy(&l.encode()).contains("watch"));
    }

    #[test]
    fn the_restore_watch_round_trips_and_older_ledgers_still_read() {
        let mut l = UfmLedger::default();
        l.record(key(5), set(&[2]));
        l.watch(key(5), 1_000);
        l.watch_restore(3_000);
        l.watch_restore(2_000);
        assert_eq!(l.restore_watched_until(), Some(3_000));
        assert_eq!(l.watch_end(key(5)), Some(3_000));
        assert_eq!(l.watch_end(key(6)), Some(3_000));
        let bytes = l.encode();
        assert!(String::from_utf8_lossy(&bytes).contains(r#""restore_watch":3000"#));
        assert_eq!(UfmLedger::decode(&bytes).unwrap(), l);
        l.end_restore_watch();
        assert_eq!(l.watch_end(key(6)), None);
        assert!(!String::from_utf8_lossy(&l.encode()).contains("restore"));
        let mut restored = UfmLedger::default();
        restored.watch_restore(1);
        assert!(!restored.is_empty());
        // A ledger written before the restore watch existed.
        let old = UfmLedger::decode(br#"{"version":1,"keys":{"0x0005":["0000000000000002"]}}"#);
        assert_eq!(old.unwrap().restore_watched_until(), None);
    }

    #[test]
    fn rearming_sets_every_watch_to_one_end_either_way() {
        let mut l = UfmLedger::default();
        assert_eq!(l.rearm_watches(5_000), 0);
        assert!(l.is_empty(), "re-arming starts no watch");
        l.watch(key(5), 1_000);
        l.watch(key(6), 9_000);
        l.watch_restore(90_000);
        assert_eq!(l.rearm_watches(5_000), 3);
        assert_eq!(l.watched_until(key(5)), Some(5_000));
        assert_eq!(l.watched_until(key(6)), Some(5_000), "shortened too");
        assert_eq!(l.restore_watched_until(), Some(5_000));
    }

    #[test]
    fn confirm_keeps_only_what_was_seen() {
        let mut l = UfmLedger::default();
        l.record(key(7), set(&[1, 2, 3]));
        assert!(!l.confirm(key(7), &set(&[1, 2, 3])));
        assert!(l.confirm(key(7), &set(&[1])));
        assert_eq!(l.guids(key(7)), set(&[1]));
        assert!(l.confirm(key(7), &set(&[])));
        assert!(l.is_empty());
        assert!(!l.confirm(key(7), &set(&[])));
    }

    #[test]
    fn malformed_ledgers_are_errors() {
        assert!(UfmLedger::decode(b"nope").is_err());
        assert!(UfmLedger::decode(br#"{"version":2,"keys":{}}"#).is_err());
        assert!(UfmLedger::decode(br#"{"version":1,"keys":{"0x7fff":[]}}"#).is_err());
        assert!(UfmLedger::decode(br#"{"version":1,"keys":{"0x0001":["zz"]}}"#).is_err());
        assert!(UfmLedger::decode(br#"{"version":1,"keys":{},"more":1}"#).is_err());
    }

    #[test]
    fn the_memory_store_can_refuse_writes() {
        let s = MemoryLedgerStore::new();
        assert_eq!(s.load().unwrap(), None);
        s.save(b"x").unwrap();
        s.refuse_saves(true);
        assert!(s.save(b"y").is_err());
        assert_eq!(s.load().unwrap(), Some(b"x".to_vec()));
        assert_eq!(s.saves(), 1);
    }
}
