use super::*;
use crate::domain::{
    Guid, InstanceId, LinkLayer, Membership, PKeyValue, Partition, PortInfo, PortState,
};
use AttachmentState::*;

fn att(state: AttachmentState, membership: Membership) -> Attachment {
    Attachment {
        instance_id: InstanceId::parse("i1").unwrap(),
        partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x12).unwrap(),
        membership,
        state,
        reason: String::new(),
        created_unix_ns: 0,
        updated_unix_ns: 0,
    }
}

fn port(n: u8, state: PortState, keys: &[u16]) -> PortInfo {
    let mut pkeys = vec![PKeyValue(0xFFFF)];
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

fn accepted(with: bool, membership: Membership) -> NodeMemberships {
    let a = att(Pending, membership);
    if with {
        desired("n", vec![], &[a])
    } else {
        desired("n", vec![], &[])
    }
}

fn states(
    a: &Attachment,
    acc: Option<&NodeMemberships>,
    i: Option<&Inventory>,
) -> Vec<AttachmentState> {
    plan(
        std::slice::from_ref(a),
        Observed {
            accepted: acc,
            inventory: i,
        },
    )
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
    let t = plan(
        std::slice::from_ref(&a),
        Observed {
            accepted: Some(&acc),
            inventory: Some(&gone),
        },
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
    let set = desired("n", vec![Guid(1)], &[a, b, gone]);
    assert_eq!(set.keys.len(), 1);
    assert_eq!(
        set.keys.values().next().unwrap().membership,
        Membership::Full
    );
}
