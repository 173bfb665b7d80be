use super::*;
use crate::domain::{Membership, PKeyValue, Partition};

fn attachment(id: &str, state: AttachmentState) -> Attachment {
    Attachment {
        grant: None,
        instance_id: InstanceId::parse(id).unwrap(),
        partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x10).unwrap(),
        membership: Membership::Full,
        state,
        reason: String::new(),
        created_unix_ns: 1,
        updated_unix_ns: 1,
        ports: Vec::new(),
        named_ports: false,
        restored: None,
        evidence: None,
    }
}

fn changed(id: &str, to: AttachmentState) -> EventKind {
    EventKind::AttachmentChanged {
        instance_id: id.into(),
        partition_id: "ibpart_a".into(),
        pkey_value: PKeyValue(0x8010),
        from: None,
        to,
        reason: String::new(),
        evidence: None,
        ports: Vec::new(),
    }
}

#[test]
fn commit_is_atomic_and_sequence_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    {
        let store = Store::open(&path, 1000).unwrap();
        let batch = Batch {
            upserts: vec![attachment("i1", AttachmentState::Pending)],
            events: vec![changed("i1", AttachmentState::Pending)],
            ..Default::default()
        };
        let ev = store.commit(batch, 5).unwrap();
        assert_eq!(ev[0].seq, 1);
    }
    // A file created under a permissive umask is still the agent's alone.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    let store = Store::open(&path, 1000).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "state.redb is {mode:o}");
    assert_eq!(store.attachments().unwrap().len(), 1);
    let batch = Batch {
        events: vec![
            changed("i1", AttachmentState::Active),
            changed("i1", AttachmentState::Releasing),
        ],
        ..Default::default()
    };
    let ev = store.commit(batch, 6).unwrap();
    assert_eq!(ev.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(store.events_after(1, 10).unwrap().len(), 2);
    assert_eq!(store.event_bounds().unwrap(), (1, 3));
}

#[test]
fn retention_prunes_oldest_events_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.redb"), 5).unwrap();
    for _ in 0..4 {
        let batch = Batch {
            events: vec![changed("i", AttachmentState::Active); 3],
            ..Default::default()
        };
        store.commit(batch, 1).unwrap();
    }
    assert_eq!(store.event_bounds().unwrap(), (8, 12));
    let seqs: Vec<u64> = store
        .events_after(0, 100)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![8, 9, 10, 11, 12]);
}

#[test]
fn the_apply_ledger_commits_with_the_batch_and_survives_reopen() {
    use crate::domain::{ApplyLedger, PKey};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let ledger = ApplyLedger {
        generation_reserved: 2048,
        keys: [PKey::new(0x12).unwrap()].into(),
        ..Default::default()
    };
    {
        let store = Store::open(&path, 100).unwrap();
        assert_eq!(store.ledger().unwrap(), ApplyLedger::default());
        store
            .commit(
                Batch {
                    upserts: vec![attachment("i1", AttachmentState::Pending)],
                    ledger: Some(ledger.clone()),
                    ..Default::default()
                },
                1,
            )
            .unwrap();
    }
    let store = Store::open(&path, 100).unwrap();
    assert_eq!(store.ledger().unwrap(), ledger);
    assert_eq!(store.attachments().unwrap().len(), 1);
}

#[test]
fn the_log_epoch_survives_reopen_and_a_wiped_store_gets_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let first = Store::open(&path, 1000).unwrap().epoch();
    assert_eq!(Store::open(&path, 1000).unwrap().epoch(), first);
    assert_eq!(first.to_string().len(), 32);
    std::fs::remove_file(&path).unwrap();
    let second = Store::open(&path, 1000).unwrap().epoch();
    assert_ne!(second, first);
}

#[test]
fn a_store_without_an_epoch_gets_one_at_first_open_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    {
        // A database written before epochs existed: tables, a sequence, no epoch.
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(LAST_SEQ, 7u64.to_be_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(&path, 1000).unwrap();
    let epoch = store.epoch();
    assert_eq!(store.last_seq().unwrap(), 7);
    drop(store);
    assert_eq!(Store::open(&path, 1000).unwrap().epoch(), epoch);
}

#[test]
fn last_seq_follows_commits() {
    let store = Store::in_memory(1000).unwrap();
    assert_eq!(store.last_seq().unwrap(), 0);
    let batch = Batch {
        events: vec![changed("i", AttachmentState::Active); 3],
        ..Default::default()
    };
    store.commit(batch, 1).unwrap();
    assert_eq!(store.last_seq().unwrap(), 3);
}

#[test]
fn attachment_pages_follow_instance_ids_and_apply_the_filter() {
    let store = Store::in_memory(1000).unwrap();
    let ids = ["a1", "a2", "b1", "b2", "c1"];
    store
        .commit(
            Batch {
                upserts: ids
                    .iter()
                    .map(|i| attachment(i, AttachmentState::Pending))
                    .collect(),
                ..Default::default()
            },
            1,
        )
        .unwrap();
    let names = |p: &AttachmentPage| {
        p.attachments
            .iter()
            .map(|a| a.instance_id.as_str().to_owned())
            .collect::<Vec<_>>()
    };
    let p1 = store.attachments_page(None, 2, |_| true).unwrap();
    assert_eq!(
        (names(&p1), p1.more),
        (vec!["a1".into(), "a2".into()], true)
    );
    let p2 = store.attachments_page(Some("a2"), 2, |_| true).unwrap();
    assert_eq!(names(&p2), vec!["b1", "b2"]);
    let p3 = store.attachments_page(Some("b2"), 2, |_| true).unwrap();
    assert_eq!((names(&p3), p3.more), (vec!["c1".into()], false));
    // Exactly `limit` left: no further page is promised.
    let exact = store.attachments_page(Some("b1"), 2, |_| true).unwrap();
    assert_eq!(
        (names(&exact), exact.more),
        (vec!["b2".into(), "c1".into()], false)
    );
    // A cursor that is not itself an attachment still pages from the next id.
    let gap = store.attachments_page(Some("a9"), 10, |_| true).unwrap();
    assert_eq!(names(&gap), vec!["b1", "b2", "c1"]);
    let only_b = store
        .attachments_page(None, 10, |a| a.instance_id.as_str().starts_with('b'))
        .unwrap();
    assert_eq!(names(&only_b), vec!["b1", "b2"]);
}

fn ids(list: &[Attachment]) -> Vec<&str> {
    list.iter().map(|a| a.instance_id.as_str()).collect()
}

#[test]
fn live_and_released_indexes_follow_every_change_and_are_built_for_old_stores() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let released_at = |id: &str, ns: i64| {
        let mut a = attachment(id, AttachmentState::Released);
        a.updated_unix_ns = ns;
        a
    };
    {
        let store = Store::open(&path, 1000).unwrap();
        let upserts = vec![
            attachment("a", AttachmentState::Active),
            attachment("b", AttachmentState::Pending),
            released_at("c", 300),
            released_at("d", 100),
        ];
        store
            .commit(
                Batch {
                    upserts,
                    ..Default::default()
                },
                1,
            )
            .unwrap();
        assert_eq!(ids(&store.live_attachments().unwrap()), ["a", "b"]);
        assert_eq!(store.oldest_released().unwrap(), Some(100));
        // a is released at 200; b's reason changes (an upsert in the same state); d is pruned.
        let mut b = attachment("b", AttachmentState::Pending);
        b.reason = "waiting".into();
        store
            .commit(
                Batch {
                    upserts: vec![released_at("a", 200), b],
                    deletes: vec![InstanceId::parse("d").unwrap()],
                    ..Default::default()
                },
                2,
            )
            .unwrap();
        assert_eq!(ids(&store.live_attachments().unwrap()), ["b"]);
        assert_eq!(store.oldest_released().unwrap(), Some(200));
        let expired: Vec<String> = store
            .expired_released(250)
            .unwrap()
            .iter()
            .map(|i| i.as_str().to_owned())
            .collect();
        assert_eq!(expired, ["a"]);
        assert_eq!(store.attachments().unwrap().len(), 3);
        // Simulate a store written before the indexes existed: drop them and the marker.
        let txn = store.db.begin_write().unwrap();
        txn.delete_table(LIVE).unwrap();
        txn.delete_table(RELEASED_AT).unwrap();
        txn.open_table(META).unwrap().remove(INDEXED).unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(ids(&store.live_attachments().unwrap()), ["b"]);
    assert_eq!(store.oldest_released().unwrap(), Some(200));
    assert_eq!(store.expired_released(301).unwrap().len(), 2);
}

#[test]
fn a_restored_database_gets_a_new_epoch_a_higher_seq_and_the_generation_floor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let copy = dir.path().join("copy.redb");
    let (old_epoch, old_last) = {
        let store = Store::open(&path, 1000).unwrap();
        store
            .commit(
                Batch {
                    events: vec![changed("i1", AttachmentState::Pending)],
                    ledger: ApplyLedger::default().covering(1, []),
                    ..Default::default()
                },
                1,
            )
            .unwrap();
        drop(store);
        std::fs::copy(&path, &copy).unwrap();
        let store = Store::open(&path, 1000).unwrap();
        let ledger = store.ledger().unwrap().covering(5000, []);
        for _ in 0..3 {
            store
                .commit(
                    Batch {
                        events: vec![changed("i1", AttachmentState::Active)],
                        ledger: ledger.clone(),
                        ..Default::default()
                    },
                    2,
                )
                .unwrap();
        }
        assert_eq!(store.rolled_back(), None);
        (store.epoch(), store.last_seq().unwrap())
    };
    assert_eq!(old_last, 4);
    std::fs::copy(&copy, &path).unwrap();
    let store = Store::open(&path, 1000).unwrap();
    assert!(store.rolled_back().unwrap().contains("restored"));
    assert_ne!(store.epoch(), old_epoch);
    let (first, last) = store.event_bounds().unwrap();
    assert_eq!(
        (first, last),
        (old_last + 2, old_last + 2),
        "one seq left out"
    );
    assert!(store.ledger().unwrap().generation_reserved >= 5000);
    let conditions = store.conditions().unwrap();
    assert!(conditions.contains_key(&ConditionKind::StoreRolledBack));
    drop(store);
    // The next open is of the store last written: nothing to report.
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(store.rolled_back(), None);
    // A cleared condition is forgotten with the event that clears it.
    store
        .commit(
            Batch {
                events: vec![EventKind::ConditionChanged {
                    condition: ConditionKind::StoreRolledBack,
                    active: false,
                    detail: String::new(),
                }],
                ..Default::default()
            },
            3,
        )
        .unwrap();
    assert!(store.conditions().unwrap().is_empty());
    drop(store);
    // A database that is not the one the mirror names (deleted and created anew).
    std::fs::remove_file(&path).unwrap();
    let store = Store::open(&path, 1000).unwrap();
    assert!(store.rolled_back().unwrap().contains("replaced"));
    assert!(store.last_seq().unwrap() > old_last + 2);
}

#[test]
fn a_restart_on_the_fabric_sides_evidence_gets_a_new_epoch_and_reuses_no_seq() {
    let store = Store::in_memory(1000).unwrap();
    let raise = |restart_log| Batch {
        events: vec![EventKind::ConditionChanged {
            condition: ConditionKind::StoreRolledBack,
            active: true,
            detail: "newer generation on the fabric side".into(),
        }],
        restart_log,
        ..Default::default()
    };
    store.commit(raise(false), 1).unwrap();
    let (epoch, last) = (store.epoch(), store.last_seq().unwrap());
    let appended = store.commit(raise(true), 2).unwrap();
    assert_ne!(store.epoch(), epoch, "a new epoch");
    assert_eq!(appended[0].seq, last + crate::store::RESTART_GAP + 1);
    // The old events are gone: the log starts above every seq the lost writes could have used.
    assert_eq!(
        store.event_bounds().unwrap(),
        (appended[0].seq, appended[0].seq)
    );
    assert!(store
        .conditions()
        .unwrap()
        .contains_key(&ConditionKind::StoreRolledBack));
    // A batch that only restarts the log is not empty.
    assert!(!Batch {
        restart_log: true,
        ..Default::default()
    }
    .is_empty());
}

#[test]
fn a_rollback_marks_the_live_attachments_that_want_their_key_in_the_same_transaction() {
    use crate::domain::Restored;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let copy = dir.path().join("copy.redb");
    let all = [
        attachment("pending", AttachmentState::Pending),
        attachment("active", AttachmentState::Active),
        attachment("drifted", AttachmentState::Drifted),
        attachment("releasing", AttachmentState::Releasing),
        attachment("released", AttachmentState::Released),
        attachment("failed", AttachmentState::Failed),
    ];
    let marked = |store: &Store| -> Vec<String> {
        store
            .attachments()
            .unwrap()
            .into_iter()
            .filter(|a| a.restored == Some(Restored::AwaitingRead))
            .map(|a| a.instance_id.as_str().to_owned())
            .collect()
    };
    {
        let store = Store::open(&path, 1000).unwrap();
        let batch = Batch {
            upserts: all.to_vec(),
            ..Default::default()
        };
        store.commit(batch, 1).unwrap();
        drop(store);
        std::fs::copy(&path, &copy).unwrap();
        let store = Store::open(&path, 1000).unwrap();
        let later = Batch {
            events: vec![changed("active", AttachmentState::Active)],
            ..Default::default()
        };
        store.commit(later, 2).unwrap();
        assert!(
            marked(&store).is_empty(),
            "a store that was not rolled back"
        );
    }
    std::fs::copy(&copy, &path).unwrap();
    let store = Store::open(&path, 1000).unwrap();
    assert!(store.rolled_back().is_some());
    assert_eq!(marked(&store), ["active", "drifted", "pending"]);
    // The indexes are unchanged: the states are.
    assert_eq!(store.live_attachments().unwrap().len(), 5);

    // The fabric side's evidence marks them in the batch that restarts the log.
    let store = Store::in_memory(1000).unwrap();
    store
        .commit(
            Batch {
                upserts: all.to_vec(),
                ..Default::default()
            },
            1,
        )
        .unwrap();
    assert!(marked(&store).is_empty());
    store
        .commit(
            Batch {
                restart_log: true,
                ..Default::default()
            },
            2,
        )
        .unwrap();
    assert_eq!(marked(&store), ["active", "drifted", "pending"]);
}
