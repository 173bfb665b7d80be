use super::*;
use crate::domain::{KeySetting, NodeId};

fn k(base: u16) -> PKey {
    PKey::new(u32::from(base)).unwrap()
}

/// A set on ports 1 and 2 giving each of `keys` to `ports`.
fn set(keys: &[u16], ports: &[u64]) -> NodeMemberships {
    NodeMemberships {
        node_id: NodeId::parse("n").unwrap(),
        port_guids: vec![Guid(1), Guid(2)],
        keys: keys
            .iter()
            .map(|b| {
                (
                    k(*b),
                    KeySetting {
                        membership: Membership::Full,
                        name: String::new(),
                        ports: Some(ports.iter().map(|g| Guid(*g)).collect()),
                    },
                )
            })
            .collect(),
    }
}

fn ledger(reserved: u64, keys: &[u16]) -> ApplyLedger {
    ApplyLedger {
        generation_reserved: reserved,
        keys: keys.iter().map(|b| k(*b)).collect(),
        ..Default::default()
    }
}

/// Sends `s` (durable ledger kept in `stored`) and returns its generation.
fn send(sk: &mut SmKnowledge, stored: &mut ApplyLedger, s: &NodeMemberships) -> u64 {
    let (generation, write) = sk.begin_apply(stored, s);
    if let Some(l) = write {
        *stored = l;
    }
    sk.carrying(s, generation);
    generation
}

#[test]
fn carried_is_per_port_and_ledger_keys_count_for_every_port() {
    let key = k(0x12);
    let mut c = Carried::from_ledger(&ledger(10, &[0x12]), 10);
    assert_eq!(c.last(key, Guid(1)), Some(10));
    c.record(&set(&[0x12], &[2]), 11);
    assert_eq!(c.last(key, Guid(1)), Some(10));
    assert_eq!(c.last(key, Guid(2)), Some(11));
    assert_eq!(c.last_any(key), Some(11));
    c.forget_settled(&set(&[0x12], &[2]), 11);
    assert_eq!(c.last(key, Guid(1)), None, "port 1 settled without the key");
    assert_eq!(c.last(key, Guid(2)), Some(11), "port 2 still carries it");
}

#[test]
fn after_a_restart_ledger_keys_are_in_doubt_on_every_port_until_an_ack_without_them() {
    let mut stored = ledger(1024, &[0x12]);
    let mut sk = SmKnowledge::resume(&stored);
    // A key from an earlier life: carried to every port at 1024, below this life's first
    // generation, so in doubt until an acknowledged apply without it.
    assert_eq!(sk.in_doubt(), vec![k(0x12)]);
    assert!(
        sk.in_doubt_on(k(0x12), Guid(7)),
        "on every port, known or not"
    );
    assert!(!sk.acked_without_on(k(0x12), &[Guid(1)]), "no ack yet");
    let empty = set(&[], &[]);
    let generation = send(&mut sk, &mut stored, &empty);
    assert_eq!(generation, 1025, "above the reserved block");
    assert!(sk.unacked());
    sk.acknowledged(generation, empty, 5);
    assert!(!sk.unacked());
    assert!(sk.acked_without_on(k(0x12), &[Guid(1), Guid(2)]));
    let after = sk.ledger_after_ack(&stored).expect("the key is dropped");
    assert!(after.keys.is_empty());
    sk.forget_released();
    assert_eq!(sk.carried, Carried::default());
}

#[test]
fn an_unanswered_apply_leaves_what_it_carried_in_doubt_per_port() {
    let mut stored = ApplyLedger::default();
    let mut sk = SmKnowledge::resume(&stored);
    let both = set(&[0x12], &[1, 2]);
    let g1 = send(&mut sk, &mut stored, &both);
    assert!(
        stored.keys.contains(&k(0x12)),
        "write-ahead: in the ledger before sending"
    );
    sk.acknowledged(g1, both, 1);
    assert!(sk.in_doubt().is_empty());
    assert!(sk.acked_with(k(0x12), Membership::Full, &[Guid(1), Guid(2)]));
    assert!(!sk.acked_with(k(0x12), Membership::Limited, &[Guid(1)]));
    // Port 2 only, acknowledged: released on port 1.
    let only_2 = set(&[0x12], &[2]);
    let g2 = send(&mut sk, &mut stored, &only_2);
    sk.acknowledged(g2, only_2.clone(), 2);
    assert!(sk.acked_without_on(k(0x12), &[Guid(1)]));
    assert!(!sk.acked_without_on(k(0x12), &[Guid(2)]));
    let after = sk
        .ledger_after_ack(&stored)
        .expect("the acknowledgement is recorded");
    assert_eq!(after.keys, stored.keys, "still given on port 2");
    assert_eq!(
        after.acked,
        Some(crate::domain::AckedSet {
            generation: g2,
            digest: crate::domain::set_digest(&only_2),
        }),
        "the last acknowledged generation and set"
    );
    stored = after;
    assert_eq!(sk.ledger_after_ack(&stored), None, "recorded once");
    // Both again, no answer: port 1 is in doubt again, the ack of g2 no longer proves it.
    let g3 = send(&mut sk, &mut stored, &set(&[0x12], &[1, 2]));
    assert!(g3 > g2 && sk.unacked());
    assert_eq!(sk.in_doubt(), vec![k(0x12)]);
    assert!(sk.in_doubt_on(k(0x12), Guid(1)));
    assert!(!sk.acked_without_on(k(0x12), &[Guid(1)]));
    // An ack of the set that went back to the acknowledged one settles it.
    let g4 = send(&mut sk, &mut stored, &only_2);
    sk.acknowledged(g4, only_2, 3);
    assert!(sk.acked_without_on(k(0x12), &[Guid(1)]));
    assert!(sk.in_doubt().is_empty());
}

#[test]
fn a_stored_generation_is_moved_past_and_generations_are_reserved_in_blocks() {
    let mut stored = ApplyLedger::default();
    let mut sk = SmKnowledge::resume(&stored);
    let s = set(&[0x12], &[1]);
    assert_eq!(send(&mut sk, &mut stored, &s), 1);
    assert_eq!(stored.generation_reserved, ApplyLedger::RESERVE);
    let (_, write) = sk.begin_apply(&stored, &s);
    assert_eq!(write, None, "covered: no durable write");
    sk.move_past(5000);
    let (generation, write) = sk.begin_apply(&stored, &s);
    assert_eq!(generation, 5001);
    assert_eq!(
        write.map(|l| l.generation_reserved),
        Some(5000 + ApplyLedger::RESERVE)
    );
    sk.move_past(10);
    assert_eq!(sk.begin_apply(&stored, &s).0, 5002, "never goes back");
}

#[test]
fn a_life_after_a_lost_one_starts_the_margin_above_what_it_knows() {
    // The copy reserved up to 2048; the lost life may have reserved 2049..=3072 and sent 3073
    // at the first apply of its next block, still on its way to an SM host.
    let stored = ledger(2048, &[]);
    let mut sk = SmKnowledge::resume(&stored);
    sk.leap_past_lost_life(stored.generation_reserved);
    let s = set(&[0x12], &[1]);
    let (generation, write) = sk.begin_apply(&stored, &s);
    assert_eq!(generation, 2048 + ApplyLedger::LOST_LIFE_MARGIN + 1);
    assert!(generation > 3073 + ApplyLedger::RESERVE);
    assert_eq!(
        write.map(|l| l.generation_reserved),
        Some(generation + ApplyLedger::RESERVE - 1),
        "reserved durably before it is sent"
    );
    // A host holding more than the store knew moves it further; never back.
    sk.leap_past_lost_life(100_000);
    assert_eq!(
        sk.begin_apply(&stored, &s).0,
        100_000 + ApplyLedger::LOST_LIFE_MARGIN + 1
    );
    sk.leap_past_lost_life(10);
    assert_eq!(
        sk.begin_apply(&stored, &s).0,
        100_000 + ApplyLedger::LOST_LIFE_MARGIN + 2
    );
    // Room for far more such starts than a node will ever make, and under how far a peer SM
    // host's set may lead another's.
    const {
        assert!(ApplyLedger::LOST_LIFE_MARGIN < crate::sm::opensm::generation_bound::PEER_LEAD);
    }
}

#[test]
fn an_attach_enters_its_key_in_the_ledger_once() {
    let l = SmKnowledge::ledger_for_attach(&ApplyLedger::default(), k(0x12)).expect("new key");
    assert_eq!(l, ledger(0, &[0x12]));
    assert_eq!(SmKnowledge::ledger_for_attach(&l, k(0x12)), None);
}

#[test]
fn a_changed_host_set_voids_the_acknowledgement_until_the_new_set_acknowledges() {
    let (a, b) = (k(0x21), k(0x22));
    let mut sk = SmKnowledge::resume(&ApplyLedger::default());
    let mut stored = ApplyLedger::default();
    let both = set(&[0x21, 0x22], &[1]);
    let g = send(&mut sk, &mut stored, &both);
    sk.acknowledged(g, both.clone(), 1);
    // b's release acknowledged by the old host set.
    let only_a = set(&[0x21], &[1]);
    let g = send(&mut sk, &mut stored, &only_a);
    sk.acknowledged(g, only_a.clone(), 2);
    assert!(sk.acked_without_on(b, &[Guid(1)]));
    assert!(sk.acked_with(a, Membership::Full, &[Guid(1)]));
    // A host joins: what the old set acknowledged no longer counts, and the set must be sent.
    sk.host_set_changed();
    assert!(sk.unacked());
    assert!(sk.ack().is_none());
    assert!(
        !sk.acked_without_on(b, &[Guid(1)]),
        "no RELEASED on the old set's word"
    );
    assert!(
        !sk.acked_with(a, Membership::Full, &[Guid(1)]),
        "no ACTIVE either"
    );
    assert!(sk.in_doubt().contains(&a));
    // The new set acknowledges the current set: both hold again.
    let g = send(&mut sk, &mut stored, &only_a);
    sk.acknowledged(g, only_a, 3);
    assert!(sk.acked_without_on(b, &[Guid(1)]));
    assert!(sk.acked_with(a, Membership::Full, &[Guid(1)]));
    assert!(sk.in_doubt().is_empty());
}
