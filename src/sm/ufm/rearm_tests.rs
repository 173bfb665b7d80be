//! The late-write window across restarts, on an injected clock: a watch armed in one life of
//! the backend, the wall clock stepped an hour (forward or back) before a new life loads the
//! ledger. The new life keeps the key watched (no RELEASED) until exactly one window from its
//! start, and no longer ("Watches across restarts", `ledger_io.rs`).

use super::link::SteadyUnixMs;
use super::{Answer, LinkError, MemoryLedgerStore, UfmConfig, UfmError, UfmLink, UfmSm};
use crate::domain::{Guid, NodeId, NodeMemberships, PKey};
use crate::sm::{SmError, SmFailure, SubnetManager};
use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const WINDOW_MS: i64 = 120_000;
const HOUR_MS: i64 = 3_600_000;
/// The wall clock when the first life armed the watch.
const ARMED_AT: i64 = 1_800_000_000_000;
const GUID: u64 = 0x0002_c903_000e_0b72;

/// A UFM whose partitions hold nothing of this node and that gives no stamp, on the backend's
/// steady clock anchored at a wall reading the test chooses.
struct EmptyUfm {
    clock: SteadyUnixMs,
}

#[async_trait]
impl UfmLink for EmptyUfm {
    async fn send(
        &self,
        method: &Method,
        url: &str,
        _body: Option<&Value>,
        _cap: usize,
    ) -> Result<Answer, LinkError> {
        let status = if *method == Method::GET && url.contains("last_updated") {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        Ok(Answer {
            status,
            body: b"{}".to_vec(),
        })
    }

    fn unix_ms(&self) -> i64 {
        self.clock.unix_ms()
    }

    fn jitter_ms(&self, _max: u64) -> u64 {
        0
    }
}

fn key() -> PKey {
    PKey::new(0x0a12).unwrap()
}

/// The ledger a first life left: this node's GUID in the key and the key watched until one
/// window after an add sent at [`ARMED_AT`] (and, with `restore`, a restore watch as long).
fn store_after_first_life(restore: bool) -> MemoryLedgerStore {
    let mut ledger = super::UfmLedger::default();
    ledger.record(key(), [Guid(GUID)]);
    ledger.watch(key(), ARMED_AT + WINDOW_MS);
    if restore {
        ledger.watch_restore(ARMED_AT + WINDOW_MS);
    }
    let store = MemoryLedgerStore::new();
    use super::UfmLedgerStore;
    store.save(&ledger.encode()).unwrap();
    store
}

/// A new life of the backend on `store`, its steady clock starting at the wall reading `wall`.
fn new_life(store: &MemoryLedgerStore, wall: i64, dir: &tempfile::TempDir) -> UfmSm {
    let cred = dir.path().join("ufm.cred");
    std::fs::write(&cred, "admin:123456\n").unwrap();
    let mut config = UfmConfig::with_credentials_file("http://127.0.0.1:9", cred);
    config.late_write_window_ms = WINDOW_MS as u64;
    UfmSm::new(&config, Arc::new(store.clone()))
        .unwrap()
        .with_link(Arc::new(EmptyUfm {
            clock: SteadyUnixMs::anchored(wall),
        }))
}

/// The node no longer gives the key to its one port: the release of it.
fn released() -> NodeMemberships {
    NodeMemberships {
        node_id: NodeId::parse("node-a").unwrap(),
        port_guids: vec![Guid(GUID)],
        keys: BTreeMap::new(),
    }
}

/// Whether an apply of the release is refused because the key is still watched.
async fn still_watched(sm: &UfmSm) -> bool {
    match sm.apply(&released(), 1).await {
        Ok(_) => false,
        Err(SmError::Unreachable(SmFailure::Ufm(
            UfmError::LateWriteWindow { .. } | UfmError::RestoreWatch { .. },
        ))) => true,
        Err(e) => panic!("unexpected apply failure: {e}"),
    }
}

/// Applies the release at `after` (since the life started; each an increasing instant) and
/// says whether each was still refused as watched.
async fn watched_at(sm: &UfmSm, after: &[Duration]) -> Vec<bool> {
    let start = tokio::time::Instant::now();
    let mut out = Vec::new();
    for at in after {
        tokio::time::sleep_until(start + *at).await;
        out.push(still_watched(sm).await);
    }
    out
}

fn ms(n: i64) -> Duration {
    Duration::from_millis(n as u64)
}

#[tokio::test(start_paused = true)]
async fn a_forward_step_across_a_restart_does_not_end_the_watch_early() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_after_first_life(false);
    // The agent restarts 10 s after the add was sent, and the wall clock stepped an hour ahead
    // meanwhile: the stored deadline is an hour in the new life's past.
    let sm = new_life(&store, ARMED_AT + 10_000 + HOUR_MS, &dir);
    let seen = watched_at(&sm, &[ms(0), ms(WINDOW_MS - 1), ms(WINDOW_MS + 1)]).await;
    assert_eq!(
        seen,
        [true, true, false],
        "watched (no RELEASED) until one whole window after the restart, then released"
    );
    assert_eq!(store.ledger().unwrap().watched_until(key()), None);
    assert!(store.ledger().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_rearmed_end_is_saved_before_the_apply_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_after_first_life(false);
    let wall = ARMED_AT + 10_000 + HOUR_MS;
    let sm = new_life(&store, wall, &dir);
    assert!(still_watched(&sm).await);
    assert_eq!(
        store.ledger().unwrap().watched_until(key()),
        Some(wall + WINDOW_MS),
        "the first apply saved the re-armed end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_backward_step_across_a_restart_does_not_stretch_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_after_first_life(false);
    // Stepped an hour back: the stored deadline lies an hour and a window ahead.
    let sm = new_life(&store, ARMED_AT + 10_000 - HOUR_MS, &dir);
    let seen = watched_at(&sm, &[ms(0), ms(WINDOW_MS - 1), ms(WINDOW_MS + 1)]).await;
    assert_eq!(
        seen,
        [true, true, false],
        "released one window after the first load, not an hour later"
    );
}

#[tokio::test(start_paused = true)]
async fn a_forward_step_across_a_restart_does_not_end_a_restore_watch_early() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_after_first_life(true);
    let sm = new_life(&store, ARMED_AT + 10_000 + HOUR_MS, &dir);
    let seen = watched_at(&sm, &[ms(0), ms(WINDOW_MS - 1), ms(WINDOW_MS + 1)]).await;
    assert_eq!(seen, [true, true, false]);
    assert_eq!(store.ledger().unwrap().restore_watched_until(), None);
}
