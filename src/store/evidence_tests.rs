//! The evidence kept with attachments and events: records written before the SM hosts were
//! named (no `acknowledged_by`) or before attachments kept their evidence (no `evidence`) read
//! back, and the new fields survive a reopen.

use super::*;
use crate::domain::{Evidence, Membership, PKeyValue, Partition};

fn released(evidence: Option<Evidence>) -> Attachment {
    Attachment {
        grant: None,
        instance_id: InstanceId::parse("i1").unwrap(),
        partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x10).unwrap(),
        membership: Membership::Full,
        state: AttachmentState::Released,
        reason: String::new(),
        created_unix_ns: 1,
        updated_unix_ns: 2,
        ports: Vec::new(),
        named_ports: false,
        restored: None,
        evidence,
    }
}

fn evidence(hosts: &[&str]) -> Evidence {
    Evidence {
        sm_generation: 3,
        sm_ack_unix_ns: 10,
        read_unix_ns: 11,
        ports: Vec::new(),
        acknowledged_by: hosts.iter().map(|h| (*h).to_owned()).collect(),
    }
}

fn event(evidence: Evidence) -> Event {
    Event {
        seq: 1,
        time_unix_ns: 5,
        kind: EventKind::AttachmentChanged {
            instance_id: "i1".into(),
            partition_id: "ibpart_a".into(),
            pkey_value: PKeyValue(0x8010),
            from: Some(AttachmentState::Releasing),
            to: AttachmentState::Released,
            reason: String::new(),
            evidence: Some(evidence),
            ports: Vec::new(),
        },
    }
}

/// `v` as JSON without the field at `path` (which must be there), as an older agent wrote it.
fn without(v: &impl serde::Serialize, path: &[&str]) -> Vec<u8> {
    let mut json = serde_json::to_value(v).unwrap();
    let (last, parents) = path.split_last().unwrap();
    let mut at = &mut json;
    for p in parents {
        at = at.get_mut(*p).unwrap();
    }
    assert!(
        at.as_object_mut().unwrap().remove(*last).is_some(),
        "{last} is written"
    );
    serde_json::to_vec(&json).unwrap()
}

#[test]
fn records_without_the_evidence_fields_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    {
        // A store an older agent wrote: an attachment without its evidence, an event whose
        // evidence names no SM hosts.
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let old_attachment = without(&released(Some(evidence(&["sm1"]))), &["evidence"]);
        let old_event = without(
            &event(evidence(&["sm1"])),
            &["kind", "evidence", "acknowledged_by"],
        );
        txn.open_table(ATTACHMENTS)
            .unwrap()
            .insert("i1", old_attachment.as_slice())
            .unwrap();
        txn.open_table(EVENTS)
            .unwrap()
            .insert(1, old_event.as_slice())
            .unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(LAST_SEQ, 1u64.to_be_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(store.attachment("i1").unwrap(), Some(released(None)));
    let events = store.events_after(0, 10).unwrap();
    assert_eq!(events, [event(evidence(&[]))]);
}

#[test]
fn the_sm_hosts_that_acknowledged_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let a = released(Some(evidence(&["sm1", "sm2"])));
    {
        let store = Store::open(&path, 1000).unwrap();
        let batch = Batch {
            upserts: vec![a.clone()],
            events: vec![event(evidence(&["sm1", "sm2"])).kind],
            ..Default::default()
        };
        store.commit(batch, 5).unwrap();
    }
    let store = Store::open(&path, 1000).unwrap();
    assert_eq!(store.attachment("i1").unwrap(), Some(a));
    let events = store.events_after(0, 10).unwrap();
    let EventKind::AttachmentChanged { evidence: e, .. } = &events[0].kind else {
        panic!("{events:?}")
    };
    assert_eq!(e.as_ref().unwrap().acknowledged_by, ["sm1", "sm2"]);
}
