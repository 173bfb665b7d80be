use super::*;
use crate::store::Batch;
use std::path::Path;

fn event(store: &Store, n: i64) -> Vec<Event> {
    let batch = Batch {
        events: vec![EventKind::ConditionChanged {
            condition: ConditionKind::PortsUnreadable,
            active: n % 2 == 0,
            detail: format!("test {n}"),
        }],
        ..Default::default()
    };
    store.commit(batch, n).unwrap()
}

/// One life on the store at `path`: begins it, appends `events` events, and stops it cleanly
/// or not. Returns how it began, its epoch and its events' seqs.
fn life(path: &Path, events: i64, clean: bool) -> (LifeStart, LogEpoch, Vec<u64>) {
    let store = Store::open(path, 1000).unwrap();
    let start = store.begin_life(1).unwrap();
    assert!(!store.clean_stop_marked().unwrap(), "removed at start");
    let seqs = (0..events)
        .flat_map(|n| event(&store, n))
        .map(|e| e.seq)
        .collect();
    if clean {
        store.mark_clean_stop().unwrap();
    }
    (start, store.epoch(), seqs)
}

#[test]
fn a_clean_stop_keeps_the_epoch_and_the_seqs_continue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let (start, first, seqs) = life(&path, 3, true);
    assert_eq!(start, LifeStart::Fresh);
    assert_eq!(seqs, vec![1, 2, 3]);
    let (start, second, seqs) = life(&path, 2, true);
    assert_eq!(start, LifeStart::Clean);
    assert_eq!(second, first, "a clean restart keeps the epoch");
    assert_eq!(seqs, vec![4, 5], "cursors resume: the seqs continue");
}

#[test]
fn a_crash_starts_a_new_epoch_that_says_why_and_keeps_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let (_, first, _) = life(&path, 3, false);
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(store.epoch(), first, "opening alone changes nothing");
    let LifeStart::NewEpoch {
        previous,
        epoch,
        event,
    } = store.begin_life(7).unwrap()
    else {
        panic!("a start without the marker must open a new epoch");
    };
    assert_eq!(previous, first);
    assert_ne!(epoch, first);
    assert_eq!(store.epoch(), epoch);
    assert_eq!(event.seq, 4, "the log continues");
    let EventKind::ConditionChanged {
        condition,
        active,
        detail,
    } = &event.kind
    else {
        panic!("{event:?}");
    };
    assert_eq!(*condition, ConditionKind::UncleanStop);
    assert!(*active);
    assert!(detail.contains("unclean stop: new epoch"), "{detail}");
    assert!(store
        .conditions()
        .unwrap()
        .contains_key(&ConditionKind::UncleanStop));
    // The old events stay (replay from seq 1 still works); the next ones continue.
    assert_eq!(store.events_after(0, 100).unwrap().len(), 4);
    assert_eq!(event_seq(&store), 5);
    drop(store);
    // The new epoch is durable: a clean stop of this life keeps it.
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(store.epoch(), epoch);
}

fn event_seq(store: &Store) -> u64 {
    event(store, 9)[0].seq
}

#[test]
fn the_marker_is_removed_durably_before_the_first_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let (_, first, _) = life(&path, 2, true);
    {
        let store = Store::open(&path, 1000).unwrap();
        assert!(store.clean_stop_marked().unwrap());
        assert_eq!(store.begin_life(1).unwrap(), LifeStart::Clean);
        // The process dies here, before any event: the marker is gone from the disk.
    }
    let store = Store::open(&path, 1000).unwrap();
    assert!(!store.clean_stop_marked().unwrap());
    assert!(matches!(
        store.begin_life(1).unwrap(),
        LifeStart::NewEpoch { .. }
    ));
    assert_ne!(store.epoch(), first);
}

#[test]
fn a_copy_of_a_running_store_put_back_reuses_no_epoch_and_seq() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let copy = dir.path().join("copy");
    life(&path, 1, true);
    let store = Store::open(&path, 1000).unwrap();
    store.begin_life(1).unwrap();
    let epoch = store.epoch();
    event(&store, 1);
    // The whole state directory (database and mirror) copied while the agent runs.
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
        }
    }
    let handed_out: Vec<u64> = (0..3)
        .flat_map(|n| event(&store, n))
        .map(|e| e.seq)
        .collect();
    drop(store);
    for f in std::fs::read_dir(&copy).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(store.rolled_back(), None, "the mirror came back with it");
    assert!(matches!(
        store.begin_life(1).unwrap(),
        LifeStart::NewEpoch { .. }
    ));
    assert_ne!(store.epoch(), epoch);
    let again = event(&store, 5)[0].seq;
    assert!(handed_out.contains(&again), "the same seq, but a new epoch");
}

#[test]
fn an_event_after_the_marker_voids_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let (_, first, _) = life(&path, 1, true);
    {
        let store = Store::open(&path, 1000).unwrap();
        assert_eq!(store.begin_life(1).unwrap(), LifeStart::Clean);
        store.mark_clean_stop().unwrap();
        // A late commit after the marker.
        event(&store, 2);
        assert!(!store.clean_stop_marked().unwrap());
    }
    let store = Store::open(&path, 1000).unwrap();
    assert!(matches!(
        store.begin_life(1).unwrap(),
        LifeStart::NewEpoch { .. }
    ));
    assert_ne!(store.epoch(), first);
}

#[test]
fn a_store_found_rolled_back_at_open_starts_one_new_epoch_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    life(&path, 1, true);
    let db = std::fs::read(&path).unwrap();
    life(&path, 2, true);
    // Only the database put back: the mirror sees it.
    std::fs::write(&path, db).unwrap();
    let store = Store::open(&path, 1000).unwrap();
    assert!(store.rolled_back().is_some());
    let epoch = store.epoch();
    assert_eq!(store.begin_life(1).unwrap(), LifeStart::RolledBack);
    assert_eq!(store.epoch(), epoch);
}
