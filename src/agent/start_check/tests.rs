use super::*;
use crate::domain::{Guid, KeySetting, Membership, NodeId, PKey};

/// node1's set on ports 1 and 2 with each of `keys` (full, every port).
fn set(keys: &[u16]) -> NodeMemberships {
    NodeMemberships {
        node_id: NodeId::parse("node1").unwrap(),
        port_guids: vec![Guid(1), Guid(2)],
        keys: keys
            .iter()
            .map(|b| {
                (
                    PKey::new(u32::from(*b)).unwrap(),
                    KeySetting {
                        membership: Membership::Full,
                        name: format!("p{b:x}"),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}

fn acked(generation: u64, keys: &[u16]) -> Option<AckedSet> {
    Some(AckedSet {
        generation,
        digest: set_digest(&set(keys)),
    })
}

fn host(name: &str, generation: u64, keys: &[u16]) -> HostStoredSet {
    HostStoredSet {
        host: name.into(),
        answer: StoredSetAnswer::Stored(generation, set(keys)),
    }
}

fn silent(name: &str) -> HostStoredSet {
    HostStoredSet {
        host: name.into(),
        answer: StoredSetAnswer::NoAnswer("Unavailable: connection refused".into()),
    }
}

#[test]
fn a_release_lost_with_the_snapshot_is_a_rollback() {
    // Snapshot: A acknowledged at 5. After it: released at 6 (the host holds {}), then the
    // snapshot is put back: the node wants A again.
    let v = judge_none(acked(5, &[0xa]), &set(&[0xa]), &[host("h1", 6, &[])]);
    assert!(
        v.rolled_back
            .as_deref()
            .is_some_and(|d| d.contains("h1") && d.contains("generation 6")),
        "{v:?}"
    );
    assert_eq!(v.highest, 6);
    assert!(v.unanswered.is_empty());
}

#[test]
fn a_crash_between_send_and_recording_is_not_a_rollback() {
    // The node sent its release at 6 and crashed before recording the answer: the host holds
    // what the node still wants.
    let v = judge_none(acked(5, &[0xa]), &set(&[]), &[host("h1", 6, &[])]);
    assert_eq!(v.rolled_back, None, "{v:?}");
    assert_eq!(v.highest, 6);
    // Sent and never stored: the host still holds the acknowledged set.
    let v = judge_none(acked(5, &[0xa]), &set(&[]), &[host("h1", 5, &[0xa])]);
    assert_eq!(v.rolled_back, None);
    // A newer generation of the acknowledged set (a resend) is not one either.
    let v = judge_none(acked(5, &[0xa]), &set(&[0xb]), &[host("h1", 7, &[0xa])]);
    assert_eq!(v.rolled_back, None);
}

#[test]
fn an_older_or_equal_generation_is_no_evidence() {
    let v = judge_none(
        acked(9, &[0xa]),
        &set(&[0xa]),
        &[host("h1", 9, &[0xb]), host("h2", 3, &[])],
    );
    assert_eq!(v.rolled_back, None, "{v:?}");
    assert_eq!(v.highest, 9);
}

#[test]
fn no_recorded_acknowledgement_is_no_evidence() {
    let v = judge_none(None, &set(&[0xa]), &[host("h1", 6, &[])]);
    assert_eq!(v.rolled_back, None);
    assert_eq!(v.highest, 6);
}

#[test]
fn one_host_of_several_is_enough_and_silent_hosts_are_named() {
    let v = judge_none(
        acked(5, &[0xa]),
        &set(&[0xa]),
        &[host("h1", 5, &[0xa]), host("h2", 6, &[]), silent("h3")],
    );
    assert!(
        v.rolled_back.as_deref().is_some_and(|d| d.contains("h2")),
        "{v:?}"
    );
    assert_eq!(v.unanswered.len(), 1);
    assert_eq!(v.unanswered[0].0, "h3");
    assert!(incomplete_detail(&v.unanswered).contains("h3 (Unavailable"));
}

#[test]
fn names_do_not_count_only_what_the_ports_get() {
    let mut renamed = set(&[0xa]);
    for s in renamed.keys.values_mut() {
        s.name = "other".into();
    }
    assert_eq!(set_digest(&renamed), set_digest(&set(&[0xa])));
    let mut limited = set(&[0xa]);
    for s in limited.keys.values_mut() {
        s.membership = Membership::Limited;
    }
    assert_ne!(set_digest(&limited), set_digest(&set(&[0xa])));
    let mut one_port = set(&[0xa]);
    for s in one_port.keys.values_mut() {
        s.ports = Some([Guid(1)].into());
    }
    assert_ne!(set_digest(&one_port), set_digest(&set(&[0xa])));
    let mut reordered = set(&[0xa]);
    reordered.port_guids.reverse();
    assert_eq!(set_digest(&reordered), set_digest(&set(&[0xa])));
}

#[test]
fn while_incomplete_only_keys_every_answering_host_holds_are_sent() {
    let desired = set(&[0xa, 0xb]);
    assert_eq!(
        removals_only(&desired, &[]),
        None,
        "nothing known: nothing sent"
    );
    let out = removals_only(&desired, &[Some(set(&[0xa, 0xc])), Some(set(&[0xa, 0xb]))]).unwrap();
    let keys: Vec<u16> = out.keys.keys().map(|k| k.base()).collect();
    assert_eq!(keys, vec![0xa]);
    let out = removals_only(&desired, &[None]).unwrap();
    assert!(out.keys.is_empty());
    // Another membership is not the same key.
    let mut limited = set(&[0xa, 0xb]);
    for s in limited.keys.values_mut() {
        s.membership = Membership::Limited;
    }
    assert!(removals_only(&desired, &[Some(limited)])
        .unwrap()
        .keys
        .is_empty());
}

#[test]
fn a_host_that_refuses_to_tell_is_settled_and_constrains_nothing() {
    let refused = HostStoredSet {
        host: "h2".into(),
        answer: StoredSetAnswer::Refused("PermissionDenied: not your node".into()),
    };
    let v = judge_none(
        acked(5, &[0xa]),
        &set(&[0xa]),
        &[host("h1", 5, &[0xa]), refused],
    );
    assert!(v.unanswered.is_empty() && v.rolled_back.is_none(), "{v:?}");
    assert_eq!(v.refused.len(), 1);
    assert_eq!(v.held.len(), 1);
    let out = removals_only(&set(&[0xa]), &v.held).unwrap();
    assert_eq!(
        out.keys.len(),
        1,
        "the refusing host takes no key: nothing to hold back"
    );
}

fn judge_none(
    acked: Option<crate::domain::AckedSet>,
    desired: &NodeMemberships,
    answers: &[HostStoredSet],
) -> Verdict {
    judge(acked, desired, answers, &ThisLife::default())
}

#[test]
fn a_set_this_life_sent_is_no_evidence_but_another_at_its_generation_is() {
    // This life sent a removals-only set {} at 1027 that not every host acknowledged; a host
    // holding it holds the node's own write.
    let own = ThisLife {
        sent: [(1027, crate::domain::set_digest(&set(&[])))]
            .into_iter()
            .collect(),
        ..ThisLife::default()
    };
    let v = judge(
        acked(5, &[0xa]),
        &set(&[0xa, 0xb]),
        &[host("h1", 1027, &[])],
        &own,
    );
    assert_eq!(v.rolled_back, None, "{v:?}");
    assert_eq!(v.highest, 1027);
    // The same generation with another set: a lost life wrote it.
    let v = judge(
        acked(5, &[0xa]),
        &set(&[0xa, 0xb]),
        &[host("h1", 1027, &[0xc])],
        &own,
    );
    assert!(v.rolled_back.is_some(), "{v:?}");
}

#[test]
fn a_generation_above_the_stores_reservation_that_this_life_did_not_send_is_a_rollback() {
    // The copy reserved up to 2048 and last acknowledged {} at 1; a lost life released at 3074,
    // also holding {}: the digest rule cannot see it, the reservation does.
    let answers = [host("h1", 3074, &[])];
    let v = judge_none(acked(1, &[]), &set(&[0xa]), &answers);
    assert_eq!(v.rolled_back, None);
    let reserved = ThisLife {
        reserved_at_start: 2048,
        ..ThisLife::default()
    };
    let v = judge(acked(1, &[]), &set(&[0xa]), &answers, &reserved);
    assert!(
        v.rolled_back
            .as_deref()
            .is_some_and(|d| d.contains("3074") && d.contains("2048")),
        "{v:?}"
    );
    // Within the reservation: no evidence; sent by this life: none either; no reservation: none.
    let within = [host("h1", 2000, &[])];
    let v = judge(acked(1, &[]), &set(&[0xa]), &within, &reserved);
    assert_eq!(v.rolled_back, None);
    let own = ThisLife {
        sent: [(3074, crate::domain::set_digest(&set(&[])))]
            .into_iter()
            .collect(),
        reserved_at_start: 2048,
        ..ThisLife::default()
    };
    let v = judge(acked(1, &[]), &set(&[0xa]), &answers, &own);
    assert_eq!(v.rolled_back, None);
    let v = judge_none(acked(1, &[]), &set(&[0xa]), &answers);
    assert_eq!(v.rolled_back, None);
}

#[test]
fn after_an_unclean_stop_a_store_no_host_vouches_for_is_a_rollback() {
    // The copy acknowledged A at 5; after it, A was released and the only SM host then lost its
    // state: it holds nothing (or an older generation), and the copy is put back.
    let lost = ThisLife {
        follows_lost_life: true,
        ..ThisLife::default()
    };
    let nothing = HostStoredSet {
        host: "h1".into(),
        answer: StoredSetAnswer::NotStored,
    };
    for answers in [vec![nothing.clone()], vec![host("h1", 3, &[0xa])]] {
        let v = judge(acked(5, &[0xa]), &set(&[0xa]), &answers, &lost);
        assert!(
            v.rolled_back
                .as_deref()
                .is_some_and(|d| d.contains("h1") && d.contains("(5)")),
            "{v:?}"
        );
        // After a clean stop, the host's own loss says nothing of the node's store.
        let v = judge_none(acked(5, &[0xa]), &set(&[0xa]), &answers);
        assert_eq!(v.rolled_back, None, "{v:?}");
    }
    // One host that still holds the acknowledged generation (or a newer one) vouches; a silent
    // host might: no verdict until it answers; no acknowledgement recorded: no evidence.
    let v = judge(
        acked(5, &[0xa]),
        &set(&[0xa]),
        &[nothing.clone(), host("h2", 5, &[0xa])],
        &lost,
    );
    assert_eq!(v.rolled_back, None, "{v:?}");
    let v = judge(
        acked(5, &[0xa]),
        &set(&[0xa]),
        &[nothing.clone(), silent("h2")],
        &lost,
    );
    assert_eq!(v.rolled_back, None, "{v:?}");
    let v = judge(None, &set(&[0xa]), &[nothing], &lost);
    assert_eq!(v.rolled_back, None, "{v:?}");
}

#[test]
fn a_set_the_store_never_sent_at_or_above_its_record_is_a_rollback() {
    // The copy recorded {a} sent from 1025 (its attach), acknowledged {} at 1. A lost life
    // released at 1026: the host holds {} again, the acknowledged set, so only the record
    // shows the store did not send it.
    let copy = ThisLife {
        sending_at_start: Some(SentSet {
            digest: set_digest(&set(&[0xa])),
            from: 1025,
            gives: None,
        }),
        ..ThisLife::default()
    };
    let answers = [host("h1", 1026, &[])];
    let v = judge_none(acked(1, &[]), &set(&[0xa]), &answers);
    assert_eq!(
        v.rolled_back, None,
        "the acknowledged-set rule cannot see it"
    );
    let v = judge(acked(1, &[]), &set(&[0xa]), &answers, &copy);
    assert!(
        v.rolled_back
            .as_deref()
            .is_some_and(|d| d.contains("h1") && d.contains("1025")),
        "{v:?}"
    );
    // Below the record's generation (sent before it), the recorded set itself at or above
    // it (a resend), or the lost set sent by this life: no evidence.
    for (answers, life) in [
        ([host("h1", 1024, &[])], copy.clone()),
        ([host("h1", 1030, &[0xa])], copy.clone()),
        (
            [host("h1", 1026, &[])],
            ThisLife {
                sent: [(1026, set_digest(&set(&[])))].into_iter().collect(),
                ..copy.clone()
            },
        ),
    ] {
        let v = judge(acked(1, &[]), &set(&[0xa]), &answers, &life);
        assert_eq!(v.rolled_back, None, "{answers:?} {v:?}");
    }
}

#[test]
fn after_a_lost_life_only_attachments_the_recorded_set_does_not_carry_are_unsent() {
    use crate::domain::AttachmentState::{Active, Pending, Releasing};
    // The store recorded sending {a} (on both ports); then b was attached and c released,
    // and the agent stopped before sending: b was never sent.
    let recorded = SentSet::new(&set(&[0xa]), 1025);
    let life = ThisLife {
        follows_lost_life: true,
        sending_at_start: Some(recorded.clone()),
        ..ThisLife::default()
    };
    let attachments = [
        Attachment::on_named_ports("i-a", 0xa, Active, &[1, 2]),
        Attachment::on_named_ports("i-b", 0xb, Pending, &[1]),
        Attachment::on_named_ports("i-c", 0xc, Releasing, &[2]),
        // Its key was sent, but not to port 3 (a port the recorded set did not give it).
        Attachment::on_named_ports("i-d", 0xa, Pending, &[3]),
    ];
    let desired = set(&[0xa, 0xb]);
    let ids = |v: Vec<InstanceId>| v.iter().map(|i| i.as_str().to_owned()).collect::<Vec<_>>();
    assert_eq!(
        ids(unsent(&life, &desired, &attachments, None)),
        ["i-b", "i-d"]
    );
    // The same set as recorded, a clean stop, or no record at all.
    assert!(unsent(&life, &set(&[0xa]), &attachments, None).is_empty());
    let clean = ThisLife {
        follows_lost_life: false,
        ..life.clone()
    };
    assert!(unsent(&clean, &desired, &attachments, None).is_empty());
    let unrecorded = ThisLife {
        sending_at_start: None,
        ..life
    };
    assert_eq!(
        ids(unsent(&unrecorded, &desired, &attachments, None)),
        ["i-a", "i-b", "i-d"],
        "no record: every attachment that wants its key"
    );
}
