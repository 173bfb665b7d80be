use super::*;
use crate::domain::{Membership, PKeyValue, Partition};

fn attachment(id: &str, state: AttachmentState) -> Attachment {
    Attachment {
        instance_id: InstanceId::parse(id).unwrap(),
        partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x10).unwrap(),
        membership: Membership::Full,
        state,
        reason: String::new(),
        created_unix_ns: 1,
        updated_unix_ns: 1,
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
    let store = Store::open(&path, 1000).unwrap();
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
