use super::super::sm_knowledge::{Ack, Carried, SmKnowledge};
use super::*;
use crate::domain::{ApplyLedger, AttachmentPort};
use crate::domain::{
    Guid, InstanceId, LinkLayer, Membership, PKey, PKeyValue, Partition, PortInfo, PortState,
};
use AttachmentState::*;

fn att(state: AttachmentState, membership: Membership) -> Attachment {
    Attachment {
        grant: None,
        instance_id: InstanceId::parse("i1").unwrap(),
        partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x12).unwrap(),
        membership,
        state,
        reason: String::new(),
        created_unix_ns: 0,
        updated_unix_ns: 0,
        ports: Vec::new(),
        named_ports: false,
        restored: None,
        evidence: None,
    }
}

fn port(n: u8, state: PortState, keys: &[u16]) -> PortInfo {
    let mut pkeys = vec![PKeyValue::DEFAULT_LIMITED];
    pkeys.extend(keys.iter().map(|k| PKeyValue(*k)));
    pkeys.resize(8, PKeyValue(0));
    PortInfo {
        device: "hca".into(),
        port_number: n,
        port_guid: Guid(u64::from(n)),
        state,
        link_layer: LinkLayer::Infiniband,
        pkeys,
        fabric_port: true,
        ..Default::default()
    }
}

fn inv(ports: Vec<PortInfo>) -> Inventory {
    Inventory { ports }
}

/// Two fabric ports, 1 and 2, without tenant keys.
fn two_ports() -> Inventory {
    inv(vec![
        port(1, PortState::Active, &[]),
        port(2, PortState::Active, &[]),
    ])
}

fn accepted(with: bool, membership: Membership) -> NodeMemberships {
    let a = att(Pending, membership);
    let i = two_ports();
    if with {
        desired(&n(), vec![Guid(1), Guid(2)], Some(&i), &[a])
    } else {
        desired(&n(), vec![Guid(1), Guid(2)], Some(&i), &[])
    }
}

/// The acknowledged apply in these tests has generation 2; every (port, key) it carries was
/// last carried by it.
fn carried_by(acc: Option<&NodeMemberships>) -> Carried {
    let mut c = Carried::default();
    if let Some(a) = acc {
        c.record(a, 2);
    }
    c
}

/// `key` carried to every port at `generation` (an earlier life's ledger).
fn carried_at(key: PKey, generation: u64) -> Carried {
    let ledger = ApplyLedger {
        generation_reserved: generation,
        keys: [key].into(),
        ..Default::default()
    };
    Carried::from_ledger(&ledger, generation)
}

/// No covered port gone from the fabric.
static NONE_GONE: BTreeSet<Guid> = BTreeSet::new();

/// What the node knows when `acc` (if any) was acknowledged as generation 2 and `carried` was
/// sent.
fn knows(acc: Option<&NodeMemberships>, carried: &Carried) -> SmKnowledge {
    let ack = acc.map(|set| Ack {
        generation: 2,
        set: set.clone(),
        unix_ns: 1_000,
        hosts: vec!["sm1".into(), "sm2".into()],
    });
    SmKnowledge::with(ack, carried.clone())
}

fn observed<'a>(sm: &'a SmKnowledge, i: Option<&'a Inventory>) -> Observed<'a> {
    Observed {
        sm,
        inventory: i,
        read_after_ack: true,
        read_unix_ns: 2_000,
        posture_ok: true,
        gone: &NONE_GONE,
    }
}

fn states(
    a: &Attachment,
    acc: Option<&NodeMemberships>,
    i: Option<&Inventory>,
) -> Vec<AttachmentState> {
    let carried = carried_by(acc);
    plan(std::slice::from_ref(a), observed(&knows(acc, &carried), i))
        .iter()
        .map(|t| t.to)
        .collect()
}

#[test]
fn pending_waits_for_the_subnet_manager() {
    let a = att(Pending, Membership::Full);
    let i = inv(vec![port(1, PortState::Active, &[0x8012])]);
    assert_eq!(states(&a, None, Some(&i)), vec![]);
    let acc = accepted(true, Membership::Full);
    assert_eq!(states(&a, Some(&acc), Some(&i)), vec![Programming, Active]);
}

#[test]
fn active_needs_every_fabric_port_up_with_the_exact_entry() {
    let a = att(Programming, Membership::Full);
    let acc = accepted(true, Membership::Full);
    let one_missing = inv(vec![
        port(1, PortState::Active, &[0x8012]),
        port(2, PortState::Active, &[]),
    ]);
    assert_eq!(states(&a, Some(&acc), Some(&one_missing)), vec![]);
    let limited_only = inv(vec![port(1, PortState::Active, &[0x0012])]);
    assert_eq!(states(&a, Some(&acc), Some(&limited_only)), vec![]);
    let down = inv(vec![
        port(1, PortState::Active, &[0x8012]),
        port(2, PortState::Down, &[0x8012]),
    ]);
    assert_eq!(states(&a, Some(&acc), Some(&down)), vec![]);
    let mut excluded = port(2, PortState::Active, &[]);
    excluded.fabric_port = false;
    let ok = inv(vec![port(1, PortState::Active, &[0x8012]), excluded]);
    assert_eq!(states(&a, Some(&acc), Some(&ok)), vec![Active]);
    assert_eq!(
        states(&a, Some(&acc), Some(&inv(vec![]))),
        vec![],
        "no fabric port: nothing is true"
    );
    assert_eq!(states(&a, Some(&acc), None), vec![]);
}

#[test]
fn limited_membership_needs_the_limited_entry() {
    let a = att(Programming, Membership::Limited);
    let acc = accepted(true, Membership::Limited);
    let i = inv(vec![port(1, PortState::Active, &[0x0012])]);
    assert_eq!(states(&a, Some(&acc), Some(&i)), vec![Active]);
}

#[test]
fn active_key_vanishing_is_drift_and_returning_is_active() {
    let a = att(Active, Membership::Full);
    let acc = accepted(true, Membership::Full);
    let gone = inv(vec![port(1, PortState::Active, &[])]);
    let carried = carried_by(Some(&acc));
    let t = plan(
        std::slice::from_ref(&a),
        observed(&knows(Some(&acc), &carried), Some(&gone)),
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].to, Drifted);
    assert!(t[0].reason.contains("hca/1"), "{}", t[0].reason);
    let d = att(Drifted, Membership::Full);
    let back = inv(vec![port(1, PortState::Active, &[0x8012])]);
    assert_eq!(states(&d, Some(&acc), Some(&back)), vec![Active]);
}

#[test]
fn released_only_when_the_sm_dropped_the_key_and_no_port_holds_any_membership_of_it() {
    let a = att(Releasing, Membership::Full);
    let without = accepted(false, Membership::Full);
    let with = accepted(true, Membership::Full);
    let clean = inv(vec![
        port(1, PortState::Active, &[]),
        port(2, PortState::Active, &[]),
    ]);
    assert_eq!(states(&a, Some(&without), Some(&clean)), vec![Released]);
    assert_eq!(
        states(&a, Some(&with), Some(&clean)),
        vec![],
        "SM still has the key"
    );
    assert_eq!(
        states(&a, None, Some(&clean)),
        vec![],
        "SM not confirmed since start"
    );
    let limited_left = inv(vec![port(1, PortState::Active, &[0x0012])]);
    assert_eq!(states(&a, Some(&without), Some(&limited_left)), vec![]);
    let down_holding = inv(vec![
        port(1, PortState::Active, &[]),
        port(2, PortState::Down, &[0x8012]),
    ]);
    assert_eq!(
        states(&a, Some(&without), Some(&down_holding)),
        vec![Released]
    );
    assert_eq!(
        states(&a, Some(&without), Some(&inv(vec![]))),
        vec![],
        "no ports: never RELEASED"
    );
    assert_eq!(states(&a, Some(&without), None), vec![]);
}

#[test]
fn desired_set_has_wanted_keys_and_full_wins() {
    let mut a = att(Active, Membership::Limited);
    let mut b = att(Pending, Membership::Full);
    b.instance_id = InstanceId::parse("i2").unwrap();
    let mut gone = att(Releasing, Membership::Full);
    gone.partition = Partition::new("ibpart_b", "b", "ws", "acct", "fab1", 0x13).unwrap();
    a.reason.clear();
    let set = desired(&n(), vec![Guid(1)], Some(&two_ports()), &[a, b, gone]);
    assert_eq!(set.keys.len(), 1);
    assert_eq!(
        set.keys.values().next().unwrap().membership,
        Membership::Full
    );
}

#[test]
fn a_key_in_doubt_is_never_released() {
    // Generation 3 carried the key and got no answer; the acknowledged generation 2 had no key.
    let a = att(Releasing, Membership::Full);
    let without = accepted(false, Membership::Full);
    let clean = inv(vec![port(1, PortState::Active, &[])]);
    let key = a.partition.pkey;
    let carried = carried_at(key, 3);
    let sm = knows(Some(&without), &carried);
    let o = observed(&sm, Some(&clean));
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    assert!(waiting_reason(&a, &[], o).unwrap().contains("in doubt"));
    // An earlier attempt (generation 1) is superseded by the acknowledged generation 2.
    let carried = carried_at(key, 1);
    let sm = knows(Some(&without), &carried);
    let o = observed(&sm, Some(&clean));
    let t = plan(std::slice::from_ref(&a), o);
    assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), vec![Released]);
    let evidence = t[0].evidence.as_ref().expect("RELEASED carries evidence");
    assert_eq!(evidence.sm_generation, 2);
    assert_eq!(evidence.ports.len(), 1);
    // The SM hosts that acknowledged generation 2 are named in the evidence.
    assert_eq!(evidence.acknowledged_by, ["sm1", "sm2"]);
    // No longer in doubt (it moves to RELEASED in this pass; the reason is not shown).
    assert!(!waiting_reason(&a, &[], o).unwrap().contains("in doubt"));
}

#[test]
fn evidence_must_come_from_a_read_after_the_acknowledgement() {
    let without = accepted(false, Membership::Full);
    let with = accepted(true, Membership::Full);
    let clean = inv(vec![port(1, PortState::Active, &[])]);
    let holding = inv(vec![port(1, PortState::Active, &[0x8012])]);
    let carried = Carried::default();
    let sm = knows(Some(&without), &carried);
    let mut o = observed(&sm, Some(&clean));
    o.read_after_ack = false;
    assert!(plan(&[att(Releasing, Membership::Full)], o).is_empty());
    let carried = carried_by(Some(&with));
    let sm = knows(Some(&with), &carried);
    let mut o = observed(&sm, Some(&holding));
    o.read_after_ack = false;
    let t = plan(&[att(Programming, Membership::Full)], o);
    assert!(t.is_empty(), "{t:?}");
}

#[test]
fn an_insecure_posture_blocks_active_until_accepted() {
    let a = att(Programming, Membership::Full);
    let with = accepted(true, Membership::Full);
    let mut p = port(1, PortState::Active, &[0x8012]);
    p.pkeys[0] = PKeyValue::DEFAULT_FULL;
    let i = inv(vec![p]);
    assert_eq!(full_default_ports(&i), vec!["hca/1".to_owned()]);
    let mut sm_port = i.clone();
    sm_port.ports[0].lid = 1;
    sm_port.ports[0].sm_lid = 1;
    assert!(
        full_default_ports(&sm_port).is_empty(),
        "the SM's own port is exempt"
    );
    let carried = carried_by(Some(&with));
    let sm = knows(Some(&with), &carried);
    let mut o = observed(&sm, Some(&i));
    o.posture_ok = false;
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    assert!(waiting_reason(&a, &[], o)
        .unwrap()
        .contains("allow_full_default"));
    o.posture_ok = true;
    assert_eq!(plan(std::slice::from_ref(&a), o)[0].to, Active);
}

fn n() -> crate::domain::NodeId {
    crate::domain::NodeId::parse("n").unwrap()
}

#[test]
fn the_set_carries_the_grants_of_the_keys_it_holds() {
    let with_grant = |state, membership, id: &str| {
        let mut a = att(state, membership);
        a.instance_id = InstanceId::parse(id).unwrap();
        a.grant = Some(crate::domain::SignedGrant {
            bytes: id.as_bytes().to_vec(),
            key_id: "cp".into(),
            signature: Vec::new(),
            grant: crate::domain::Grant {
                grant_id: format!("g-{id}"),
                fabric: "fab1".into(),
                node_id: "n1".into(),
                instance_id: id.into(),
                partition_id: "ibpart_a".into(),
                pkey: PKey::new(0x12).unwrap(),
                membership,
                issued_at_unix_ms: 0,
            },
        });
        a
    };
    let node = NodeId::parse("n1").unwrap();
    let atts = [
        with_grant(Active, Membership::Full, "i1"),
        with_grant(Pending, Membership::Limited, "i2"),
        with_grant(Releasing, Membership::Full, "i3"),
    ];
    let desired = desired(&node, vec![Guid(1)], Some(&two_ports()), &atts);
    let ids: Vec<String> = grants(&desired, &atts)
        .into_iter()
        .map(|g| g.grant.grant_id)
        .collect();
    // Full wins for the shared key: the limited grant does not justify it; a releasing
    // attachment carries none.
    assert_eq!(ids, vec!["g-i1".to_owned()]);
}

/// `att` covering only `ports` (a partial-node attachment).
fn on_ports(state: AttachmentState, ports: &[u8]) -> Attachment {
    let mut a = att(state, Membership::Full);
    a.named_ports = true;
    a.ports = ports
        .iter()
        .map(|n| AttachmentPort {
            device: "hca".into(),
            port_number: *n,
            port_guid: Guid(u64::from(*n)),
        })
        .collect();
    a
}

#[test]
fn a_partial_node_attachment_is_judged_on_its_own_ports_only() {
    let a = on_ports(Programming, &[2]);
    let i = two_ports();
    let set = desired(
        &n(),
        vec![Guid(1), Guid(2)],
        Some(&i),
        std::slice::from_ref(&a),
    );
    let key = a.partition.pkey;
    assert_eq!(
        set.guids_for(key),
        vec![Guid(2)],
        "the key goes to port 2 only"
    );
    let only_2 = inv(vec![
        port(1, PortState::Active, &[]),
        port(2, PortState::Active, &[0x8012]),
    ]);
    assert_eq!(states(&a, Some(&set), Some(&only_2)), vec![Active]);
    // INIT and ARMED ports hold tables but pass no traffic: not ACTIVE.
    for s in [PortState::Init, PortState::Armed] {
        let up = inv(vec![port(2, s, &[0x8012])]);
        assert_eq!(states(&a, Some(&set), Some(&up)), vec![], "{s:?}");
    }
    // A whole-node set (every port) also counts as giving port 2 the key.
    let whole = accepted(true, Membership::Full);
    assert_eq!(states(&a, Some(&whole), Some(&only_2)), vec![Active]);
}

#[test]
fn a_missing_or_unknown_covered_port_blocks_released_and_names_the_port() {
    let a = on_ports(Releasing, &[1, 2]);
    let without = accepted(false, Membership::Full);
    let carried = carried_by(Some(&without));
    let gone = inv(vec![port(1, PortState::Active, &[])]);
    let sm = knows(Some(&without), &carried);
    let o = observed(&sm, Some(&gone));
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    let why = waiting_reason(&a, &[], o).unwrap();
    assert!(why.contains("hca/2") && why.contains("missing"), "{why}");
    let unknown = inv(vec![
        port(1, PortState::Active, &[]),
        port(2, PortState::Unknown, &[]),
    ]);
    let sm = knows(Some(&without), &carried);
    let o = observed(&sm, Some(&unknown));
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    assert!(waiting_reason(&a, &[], o)
        .unwrap()
        .contains("unknown state"));
    // Back and read without the key: RELEASED, the evidence naming both ports.
    let back = two_ports();
    let sm = knows(Some(&without), &carried);
    let o = observed(&sm, Some(&back));
    let t = plan(std::slice::from_ref(&a), o);
    assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), vec![Released]);
    assert_eq!(t[0].evidence.as_ref().unwrap().ports.len(), 2);
    // The same for ACTIVE: a covered port gone is drift.
    let active = on_ports(Active, &[1, 2]);
    let with = accepted(true, Membership::Full);
    let held = inv(vec![port(1, PortState::Active, &[0x8012])]);
    let t = plan(
        std::slice::from_ref(&active),
        observed(&knows(Some(&with), &carried_by(Some(&with))), Some(&held)),
    );
    assert_eq!(t[0].to, Drifted);
    assert!(t[0].reason.contains("hca/2"), "{}", t[0].reason);
}

#[test]
fn released_on_one_port_while_the_same_key_stays_on_another() {
    // X (port 1) and Y (port 2) share partition A; X is released. The acknowledged set gives
    // A to port 2 only, after an attempt that gave it to both.
    let x = on_ports(Releasing, &[1]);
    let mut y = on_ports(Active, &[2]);
    y.instance_id = InstanceId::parse("i2").unwrap();
    let i = inv(vec![
        port(1, PortState::Active, &[]),
        port(2, PortState::Active, &[0x8012]),
    ]);
    let both = accepted(true, Membership::Full);
    let only_y = desired(
        &n(),
        vec![Guid(1), Guid(2)],
        Some(&i),
        &[x.clone(), y.clone()],
    );
    let mut carried = Carried::default();
    carried.record(&both, 1);
    carried.record(&only_y, 2);
    let sm = knows(Some(&only_y), &carried);
    let o = observed(&sm, Some(&i));
    let t = plan(&[x.clone(), y.clone()], o);
    assert_eq!(
        t.iter().map(|t| (t.index, t.to)).collect::<Vec<_>>(),
        vec![(0, Released)]
    );
    // Had the later attempt carried A to port 1 too, port 1 would be in doubt.
    carried.record(&both, 3);
    let sm = knows(Some(&only_y), &carried);
    let o = observed(&sm, Some(&i));
    assert!(plan(std::slice::from_ref(&x), o).is_empty());
}

#[test]
fn a_release_held_by_a_partition_mate_on_the_same_port_says_so() {
    let x = on_ports(Releasing, &[1]);
    let mut y = on_ports(Active, &[1]);
    y.instance_id = InstanceId::parse("i2").unwrap();
    let i = inv(vec![port(1, PortState::Active, &[0x8012])]);
    let both = [x.clone(), y];
    let set = desired(&n(), vec![Guid(1)], Some(&i), &both);
    let carried = carried_by(Some(&set));
    let sm = knows(Some(&set), &carried);
    let o = observed(&sm, Some(&i));
    assert!(plan(std::slice::from_ref(&x), o).is_empty());
    let why = waiting_reason(&x, &both, o).unwrap();
    assert!(
        why.starts_with("0x8012 stays on hca/1")
            && why.contains(": instance i2 of partition ibpart_a still holds it"),
        "{why}"
    );
    // Named before anything the subnet manager says: no answer from it releases the key.
    assert_eq!(
        held_by_partition_mate(&x, &both, o).as_deref(),
        Some(why.as_str())
    );
    // The other instance released too: nothing holds it but the subnet manager's answer.
    let mut y = both[1].clone();
    y.state = Releasing;
    assert_eq!(held_by_partition_mate(&x, &[x.clone(), y], o), None);
}

#[test]
fn a_missing_port_the_subnet_manager_no_longer_shows_does_not_block_released() {
    let a = on_ports(Releasing, &[1, 2]);
    let without = accepted(false, Membership::Full);
    let carried = carried_by(Some(&without));
    let sm = knows(Some(&without), &carried);
    let only_1 = inv(vec![port(1, PortState::Active, &[])]);
    let gone = BTreeSet::from([Guid(2)]);
    let o = Observed {
        gone: &gone,
        ..observed(&sm, Some(&only_1))
    };
    let t = plan(std::slice::from_ref(&a), o);
    assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), vec![Released]);
    assert!(
        t[0].reason.contains("hca/2") && t[0].reason.contains("no longer shown"),
        "{}",
        t[0].reason
    );
    // Port 1, still here, must be read without the key: gone ports excuse only themselves.
    let held = inv(vec![port(1, PortState::Active, &[0x8012])]);
    let o = Observed {
        gone: &gone,
        ..observed(&sm, Some(&held))
    };
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    // The subnet manager's acknowledgement without the key is still required.
    let with = accepted(true, Membership::Full);
    let carried_with = carried_by(Some(&with));
    let sm = knows(Some(&with), &carried_with);
    let o = Observed {
        gone: &gone,
        ..observed(&sm, Some(&only_1))
    };
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    // A gone port never counts towards ACTIVE.
    let programming = on_ports(Programming, &[1, 2]);
    let holds_1 = inv(vec![port(1, PortState::Active, &[0x8012])]);
    let o = Observed {
        gone: &gone,
        ..observed(&sm, Some(&holds_1))
    };
    assert!(plan(std::slice::from_ref(&programming), o).is_empty());
}

#[test]
fn a_restored_attachment_is_withheld_unless_every_covered_port_still_holds_its_key() {
    let restored = |state| Attachment {
        restored: Some(Restored::AwaitingRead),
        ..att(state, Membership::Full)
    };
    let full = 0x8012;
    // Every covered port holds the key: the fabric side kept it.
    let kept = inv(vec![
        port(1, PortState::Active, &[full]),
        port(2, PortState::Init, &[full]),
    ]);
    let checks = restore_checks(&[restored(Active)], &kept);
    assert_eq!(checks.len(), 1);
    assert!(checks[0].confirmed, "{checks:?}");
    assert_eq!(checks[0].to, Active);
    // One covered port lacks it (released after the copy, perhaps): withheld, back to PENDING,
    // the port named.
    let lacking = inv(vec![
        port(1, PortState::Active, &[full]),
        port(2, PortState::Active, &[]),
    ]);
    for state in [Pending, Programming, Active, Drifted] {
        let checks = restore_checks(&[restored(state)], &lacking);
        assert!(!checks[0].confirmed, "{state:?}");
        assert_eq!(checks[0].to, Pending);
        assert!(checks[0].reason.contains("hca/2"), "{}", checks[0].reason);
    }
    // A DOWN port's table counts as empty.
    let down = inv(vec![
        port(1, PortState::Active, &[full]),
        port(2, PortState::Down, &[full]),
    ]);
    assert!(!restore_checks(&[restored(Active)], &down)[0].confirmed);
    // The other membership of the key is not the key asked for.
    let limited = inv(vec![
        port(1, PortState::Active, &[0x0012]),
        port(2, PortState::Active, &[0x0012]),
    ]);
    assert!(!restore_checks(&[restored(Active)], &limited)[0].confirmed);
    // Only marked attachments are checked; settled ones are not checked again.
    let unconfirmed = Attachment {
        restored: Some(Restored::Unconfirmed),
        ..att(Pending, Membership::Full)
    };
    assert!(
        restore_checks(&[att(Active, Membership::Full), unconfirmed.clone()], &kept).is_empty()
    );

    // A withheld attachment asks for nothing and moves nowhere, even with its key on the ports.
    let sm = knows(None, &Carried::default());
    assert!(desired(
        &n(),
        vec![Guid(1), Guid(2)],
        Some(&kept),
        std::slice::from_ref(&unconfirmed)
    )
    .keys
    .is_empty());
    assert!(plan(
        std::slice::from_ref(&unconfirmed),
        observed(&sm, Some(&kept))
    )
    .is_empty());
    // It does not hold the key for a partition mate being released either.
    let mut mate = att(Releasing, Membership::Full);
    mate.instance_id = InstanceId::parse("i2").unwrap();
    assert_eq!(
        held_by_partition_mate(&mate, &[unconfirmed], observed(&sm, Some(&kept))),
        None
    );
}

/// Every waiting state, under every combination of what the subnet manager acknowledged and
/// what the ports hold, shows a non-empty reason whenever the plan does not move it.
#[test]
fn every_waiting_state_says_what_it_waits_for() {
    let held = |state| {
        inv(vec![
            port(1, state, &[0x8012]),
            port(2, PortState::Active, &[0x8012]),
        ])
    };
    let inventories: Vec<Option<Inventory>> = vec![
        None,
        Some(two_ports()),
        Some(held(PortState::Active)),
        Some(held(PortState::Down)),
        Some(inv(vec![port(1, PortState::Active, &[0x8012])])),
        Some(inv(vec![
            port(1, PortState::Active, &[]),
            port(2, PortState::Unknown, &[]),
        ])),
        Some(inv(vec![port(9, PortState::Active, &[])])),
    ];
    let mut walked = 0;
    for state in [Pending, Programming, Drifted, Releasing] {
        for membership in [Membership::Full, Membership::Limited] {
            let a = att(state, membership);
            let with = accepted(true, membership);
            let without = accepted(false, membership);
            for acc in [None, Some(&with), Some(&without)] {
                for i in &inventories {
                    for fresh in [true, false] {
                        for posture_ok in [true, false] {
                            let carried = carried_by(acc);
                            let sm = knows(acc, &carried);
                            let mut o = observed(&sm, i.as_ref());
                            o.read_after_ack = fresh;
                            o.posture_ok = posture_ok;
                            let moved = !plan(std::slice::from_ref(&a), o).is_empty();
                            let reason = waiting_reason(&a, &[], o);
                            walked += 1;
                            assert!(
                                reason.as_deref().is_some_and(|r| !r.trim().is_empty()),
                                "{state:?} ({membership:?}, acked {:?}, ports {:?}, fresh \
                                 {fresh}, posture {posture_ok}, moved {moved}) has no reason",
                                acc.map(|s| s.keys.len()),
                                i.as_ref().map(|i| i.ports.len()),
                            );
                        }
                    }
                }
            }
        }
    }
    assert_eq!(walked, 4 * 2 * 3 * 7 * 2 * 2);
    for state in [Active, Released, Failed] {
        let a = att(state, Membership::Full);
        let carried = carried_by(None);
        let sm = knows(None, &carried);
        assert_eq!(
            waiting_reason(&a, &[], observed(&sm, Some(&two_ports()))),
            None
        );
    }
}

/// The two gaps review found: RELEASING acknowledged without the key while a covered port
/// still holds it, and PROGRAMMING acknowledged with it while an up port lacks it. Both name
/// the port, the generation and the re-apply.
#[test]
fn an_acknowledged_set_the_ports_do_not_show_names_the_port_and_the_re_apply() {
    let without = accepted(false, Membership::Full);
    let carried = carried_by(Some(&without));
    let sm = knows(Some(&without), &carried);
    let i = inv(vec![
        port(1, PortState::Active, &[0x8012]),
        port(2, PortState::Active, &[]),
    ]);
    let a = att(Releasing, Membership::Full);
    assert!(plan(std::slice::from_ref(&a), observed(&sm, Some(&i))).is_empty());
    let r = waiting_reason(&a, &[], observed(&sm, Some(&i))).unwrap();
    assert!(
        r.contains("acknowledged a set without 0x8012 (generation 2)"),
        "{r}"
    );
    assert!(r.contains("covered port hca/1 still holds it"), "{r}");
    assert!(!r.contains("hca/2"), "{r}");
    assert!(r.contains("sent again if this lasts 30s"), "{r}");

    let with = accepted(true, Membership::Full);
    let carried = carried_by(Some(&with));
    let sm = knows(Some(&with), &carried);
    let a = att(Programming, Membership::Full);
    assert!(plan(std::slice::from_ref(&a), observed(&sm, Some(&i))).is_empty());
    let r = waiting_reason(&a, &[], observed(&sm, Some(&i))).unwrap();
    assert!(r.contains("acknowledged 0x8012 (generation 2)"), "{r}");
    assert!(r.contains("covered port hca/2 lacks it"), "{r}");
    assert!(r.contains("sent again if this lasts 30s"), "{r}");
}

/// A port that joined a whole-node attachment later (recorded by `Attachment::join_ports`)
/// and then drops out of the read blocks RELEASED, unless the subnet manager shows it gone.
#[test]
fn a_joined_port_missing_from_the_read_blocks_released() {
    let mut a = att(Active, Membership::Full);
    assert!(a.join_ports(&two_ports()));
    a.state = Releasing;
    let without = accepted(false, Membership::Full);
    let carried = carried_by(Some(&without));
    let sm = knows(Some(&without), &carried);
    let only_first = inv(vec![port(1, PortState::Active, &[])]);
    let o = observed(&sm, Some(&only_first));
    assert!(plan(std::slice::from_ref(&a), o).is_empty());
    let r = waiting_reason(&a, &[], o).unwrap();
    assert!(r.contains("missing from the port read"), "{r}");
    // Before the fix nothing recorded port 2: the read alone decided, and it released.
    let mut unrecorded = att(Releasing, Membership::Full);
    unrecorded.ports.clear();
    assert_eq!(
        states(&unrecorded, Some(&without), Some(&only_first)),
        [Released]
    );
    // The subnet manager shows port 2 gone from the fabric: RELEASED, saying so.
    let gone = BTreeSet::from([Guid(2)]);
    let mut o = observed(&sm, Some(&only_first));
    o.gone = &gone;
    let t = plan(std::slice::from_ref(&a), o);
    assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), [Released]);
    assert!(
        t[0].reason
            .contains("no longer shown by the subnet manager"),
        "{}",
        t[0].reason
    );
}

/// The bounded re-apply is for waits on the fabric side only: a port down, missing or
/// unreadable, or a partition mate holding the key, is not helped by sending the set again.
#[test]
fn a_re_apply_is_only_for_waits_on_the_fabric_side() {
    let without = accepted(false, Membership::Full);
    let carried = carried_by(Some(&without));
    let sm = knows(Some(&without), &carried);
    let holding = inv(vec![
        port(1, PortState::Active, &[0x8012]),
        port(2, PortState::Active, &[]),
    ]);
    let releasing = att(Releasing, Membership::Full);
    assert!(re_apply_may_help(
        &releasing,
        &[],
        observed(&sm, Some(&holding))
    ));
    let mut mate = att(Active, Membership::Full);
    mate.instance_id = InstanceId::parse("i2").unwrap();
    assert!(!re_apply_may_help(
        &releasing,
        std::slice::from_ref(&mate),
        observed(&sm, Some(&holding))
    ));
    assert!(!re_apply_may_help(&releasing, &[], observed(&sm, None)));
    let programming = att(Programming, Membership::Full);
    assert!(re_apply_may_help(
        &programming,
        &[],
        observed(&sm, Some(&holding))
    ));
    let down = inv(vec![
        port(1, PortState::Down, &[]),
        port(2, PortState::Active, &[]),
    ]);
    assert!(!re_apply_may_help(
        &programming,
        &[],
        observed(&sm, Some(&down))
    ));
    let mut whole = att(Programming, Membership::Full);
    assert!(whole.join_ports(&holding));
    let one = inv(vec![port(1, PortState::Active, &[])]);
    assert!(!re_apply_may_help(&whole, &[], observed(&sm, Some(&one))));
    assert!(!re_apply_may_help(
        &att(Active, Membership::Full),
        &[],
        observed(&sm, Some(&holding))
    ));
}
