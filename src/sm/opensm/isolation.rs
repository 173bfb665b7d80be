//! Failure isolation on the SM host: one node's problem stays that node's.
//!
//! - A port GUID of a node's set that cannot be proven the node's (or that another node holds)
//!   refuses that port's keys only: the rest of the set is admitted without it
//!   ([`strip_ports`]).
//! - A set that only takes away from the stored one ([`removes_only`]: a release) needs no
//!   proof, grant or posture check and always goes through; when a set is refused for another
//!   reason, the removals it carries still go through ([`removal_part`]).
//! - A stored set that no longer passes the whole-file checks (the operator's part changed
//!   since it was admitted: a key the operator now defines, a port table the operator's
//!   entries now fill) is *quarantined* ([`quarantine_reason`]): left out of the rendered
//!   region (fail closed: its ports lose its keys) and shown as a condition naming the node,
//!   while every other node's set is written.
//! - While OpenSM's rejection of a file holds back what that file added (another node's
//!   addition; see [`super::repair::RejectedFile`]), every commit renders the region *without*
//!   it ([`without_held`]): each held (key, port) as OpenSM last accepted it (or not at all), the
//!   rest as stored. A release therefore goes through at once, rendered against the other
//!   nodes' last accepted sets; the nodes whose sets the written file does not serve whole
//!   ([`held_back`]) are answered with the hold, never OK.
//!
//! The node is answered OK only when the SM host serves exactly the (port, key) pairs its
//! request gives ([`serves_all`]); otherwise it gets the refusal, and every key of the request
//! stays in doubt on the node. A node is never acknowledged a key on a port that was refused.

use super::model::PartitionsConf;
use super::region::{check_operator_keys, RegionError, RegionPlan, TableOverflow};
use super::repair::RegionMember;
use crate::domain::{Guid, KeySetting, Membership, NodeId, NodeMemberships, PKey};
use std::collections::{BTreeMap, BTreeSet};

/// `set` without the ports in `refused`: they leave `port_guids` and every key's own port set,
/// so no key is given to them. A key whose own ports were all refused stays with no port (it
/// gives nothing; its grants stay with the set).
pub fn strip_ports(set: &NodeMemberships, refused: &BTreeSet<Guid>) -> NodeMemberships {
    if refused.is_empty() {
        return set.clone();
    }
    let mut out = set.clone();
    out.port_guids.retain(|g| !refused.contains(g));
    for s in out.keys.values_mut() {
        if let Some(ports) = s.ports.as_mut() {
            ports.retain(|g| !refused.contains(g));
        }
    }
    out
}

/// Every (port, key, membership) `set` gives.
fn given(set: &NodeMemberships) -> BTreeSet<(Guid, PKey, crate::domain::Membership)> {
    set.keys
        .iter()
        .flat_map(|(k, s)| {
            set.guids_for(*k)
                .into_iter()
                .map(move |g| (g, *k, s.membership))
        })
        .collect()
}

/// Whether `set` only takes away from `stored`: none of its ports is new, and every port it
/// gives a key to already holds that key with the same membership in `stored`.
pub fn removes_only(stored: &NodeMemberships, set: &NodeMemberships) -> bool {
    set.port_guids.iter().all(|g| stored.port_guids.contains(g))
        && given(set).is_subset(&given(stored))
}

/// What of `set` may be applied whatever else is wrong with it: `stored` without every
/// (port, key) that `set` no longer gives, and without the ports `set` no longer lists. Adds
/// nothing; a key `set` gives with another membership is not a removal (it keeps the stored
/// membership, as a refused change always did).
pub fn removal_part(stored: &NodeMemberships, set: &NodeMemberships) -> NodeMemberships {
    let wanted: BTreeSet<(Guid, PKey)> = given(set).into_iter().map(|(g, k, _)| (g, k)).collect();
    let port_guids: Vec<Guid> = stored
        .port_guids
        .iter()
        .copied()
        .filter(|g| set.port_guids.contains(g))
        .collect();
    let mut keys = BTreeMap::new();
    for (k, s) in &stored.keys {
        let ports: BTreeSet<Guid> = stored
            .guids_for(*k)
            .into_iter()
            .filter(|g| port_guids.contains(g) && wanted.contains(&(*g, *k)))
            .collect();
        if ports.is_empty() {
            continue;
        }
        let every = ports.len() == port_guids.len();
        keys.insert(
            *k,
            KeySetting {
                membership: s.membership,
                name: set.keys.get(k).map_or(s.name.clone(), |n| n.name.clone()),
                ports: (!every || s.ports.is_some()).then_some(ports),
            },
        );
    }
    NodeMemberships {
        node_id: stored.node_id.clone(),
        port_guids,
        keys,
    }
}

/// Whether `part` (a [`removal_part`] of `stored`) takes anything away from it: a port or a
/// (port, key).
pub fn takes_away(stored: &NodeMemberships, part: &NodeMemberships) -> bool {
    part.port_guids.len() < stored.port_guids.len() || given(part) != given(stored)
}

/// Whether `a` and `b` list the same ports and give the same (port, key, membership)s.
pub fn same_effect(a: &NodeMemberships, b: &NodeMemberships) -> bool {
    let ports = |m: &NodeMemberships| m.port_guids.iter().copied().collect::<BTreeSet<_>>();
    ports(a) == ports(b) && given(a) == given(b)
}

/// Whether `held` gives every (port, key, membership) that `requested` gives: the SM host may
/// answer OK to `requested` only then.
pub fn serves_all(requested: &NodeMemberships, held: &NodeMemberships) -> bool {
    given(requested).is_subset(&given(held))
}

/// Why a stored set no longer passes the whole-file checks against the operator's part: a
/// key the operator now defines, or a port whose table the operator's entries and this set
/// together overflow. `None`: it passes on its own.
pub fn quarantine_reason(
    operator: &PartitionsConf,
    set: &NodeMemberships,
    table_size: usize,
    allow_both_pkeys: bool,
) -> Option<RegionError> {
    let given: Vec<PKey> = set
        .keys
        .keys()
        .copied()
        .filter(|k| !set.guids_for(*k).is_empty())
        .collect();
    if let Err(e) = check_operator_keys(operator, given.iter()) {
        return Some(e);
    }
    for g in &set.port_guids {
        let own = given.iter().filter(|k| set.gives(**k, *g)).count();
        let needed = operator.table_entries_for(*g, allow_both_pkeys) + own;
        if own > 0 && needed > table_size {
            return Some(RegionError::TableFull(TableOverflow {
                port: Some(*g),
                needed,
                capacity: table_size,
            }));
        }
    }
    None
}

/// The region to write while `held` (the (key, port)s a rejected file added) is held back:
/// `full` (every served node's set) with each held member that adds to `accepted` (the members
/// of the region OpenSM last accepted) put back as accepted, or left out when OpenSM accepted
/// none. Everything else of `full` stays: removals (a release, a narrowed membership) and
/// additions that are not held. Adds nothing to `full`.
pub fn without_held(
    full: &RegionPlan,
    accepted: &BTreeMap<RegionMember, Membership>,
    held: &BTreeSet<RegionMember>,
) -> RegionPlan {
    let mut out = full.clone();
    for (key, t) in out.tenants.iter_mut() {
        t.members.retain(|g, m| {
            let id = (key.base(), *g);
            if !held.contains(&id) {
                return true;
            }
            match accepted.get(&id) {
                // The narrower of the two (Limited orders after Full).
                Some(a) => {
                    *m = (*m).max(*a);
                    true
                }
                None => false,
            }
        });
    }
    out.tenants.retain(|_, t| !t.members.is_empty());
    out
}

/// The nodes of `sets` that `written` does not serve as `full` does: a port of theirs whose
/// key or membership differs between the two.
pub fn held_back<'a>(
    full: &RegionPlan,
    written: &RegionPlan,
    sets: impl IntoIterator<Item = &'a NodeMemberships>,
) -> BTreeSet<NodeId> {
    let members = |p: &RegionPlan| -> BTreeSet<(PKey, Guid, Membership)> {
        p.tenants
            .iter()
            .flat_map(|(k, t)| t.members.iter().map(move |(g, m)| (*k, *g, *m)))
            .collect()
    };
    let (full, written) = (members(full), members(written));
    let differ: BTreeSet<Guid> = full
        .symmetric_difference(&written)
        .map(|(_, g, _)| *g)
        .collect();
    sets.into_iter()
        .filter(|s| s.port_guids.iter().any(|g| differ.contains(g)))
        .map(|s| s.node_id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Membership, NodeId};

    fn key(k: u32, m: Membership, ports: Option<&[u64]>) -> (PKey, KeySetting) {
        (
            PKey::new(k).unwrap(),
            KeySetting {
                membership: m,
                name: format!("t{k:x}"),
                ports: ports.map(|p| p.iter().map(|g| Guid(*g)).collect()),
            },
        )
    }

    fn set(ports: &[u64], keys: Vec<(PKey, KeySetting)>) -> NodeMemberships {
        NodeMemberships {
            node_id: NodeId::parse("node1").unwrap(),
            port_guids: ports.iter().map(|g| Guid(*g)).collect(),
            keys: keys.into_iter().collect(),
        }
    }

    #[test]
    fn a_refused_port_takes_only_its_own_keys() {
        let s = set(
            &[1, 2],
            vec![
                key(0x10, Membership::Full, None),
                key(0x11, Membership::Full, Some(&[2])),
                key(0x12, Membership::Full, Some(&[1])),
            ],
        );
        let stripped = strip_ports(&s, &BTreeSet::from([Guid(2)]));
        stripped.validate().unwrap();
        assert_eq!(stripped.guids_for(PKey::new(0x10).unwrap()), vec![Guid(1)]);
        assert!(stripped.guids_for(PKey::new(0x11).unwrap()).is_empty());
        assert_eq!(stripped.guids_for(PKey::new(0x12).unwrap()), vec![Guid(1)]);
        assert!(!serves_all(&s, &stripped));
        // A refused port that carries no key takes nothing: the request is served whole.
        let keyless = set(&[1, 2], vec![key(0x12, Membership::Full, Some(&[1]))]);
        assert!(serves_all(
            &keyless,
            &strip_ports(&keyless, &BTreeSet::from([Guid(2)]))
        ));
    }

    #[test]
    fn a_release_only_removes() {
        let stored = set(
            &[1, 2],
            vec![
                key(0x10, Membership::Full, None),
                key(0x11, Membership::Limited, None),
            ],
        );
        let release = set(&[1, 2], vec![key(0x10, Membership::Full, None)]);
        assert!(removes_only(&stored, &release));
        // A new port, a new key, a membership change or a key on a new port add something.
        let new_port = set(&[1, 2, 3], vec![]);
        assert!(!removes_only(&stored, &new_port));
        assert!(!removes_only(
            &stored,
            &set(&[1, 2], vec![key(0x12, Membership::Full, None)])
        ));
        assert!(!removes_only(
            &stored,
            &set(&[1, 2], vec![key(0x11, Membership::Full, None)])
        ));
        let partial = set(&[1, 2], vec![key(0x10, Membership::Full, Some(&[1]))]);
        assert!(removes_only(&stored, &partial));
        assert!(!removes_only(
            &set(&[1, 2], vec![key(0x10, Membership::Full, Some(&[1]))]),
            &stored
        ));
    }

    #[test]
    fn the_removal_part_takes_away_and_adds_nothing() {
        let stored = set(
            &[1, 2],
            vec![
                key(0x10, Membership::Full, None),
                key(0x11, Membership::Full, None),
                key(0x12, Membership::Full, Some(&[2])),
            ],
        );
        // The refused request drops 0x11, keeps 0x10 on port 1 only, changes 0x12 to limited
        // (not a removal: it stays full), adds 0x13 and a port 3.
        let request = set(
            &[1, 2, 3],
            vec![
                key(0x10, Membership::Full, Some(&[1])),
                key(0x12, Membership::Limited, Some(&[2])),
                key(0x13, Membership::Full, None),
            ],
        );
        let part = removal_part(&stored, &request);
        part.validate().unwrap();
        assert!(removes_only(&stored, &part));
        assert_eq!(part.port_guids, vec![Guid(1), Guid(2)]);
        assert_eq!(part.guids_for(PKey::new(0x10).unwrap()), vec![Guid(1)]);
        assert!(!part.keys.contains_key(&PKey::new(0x11).unwrap()));
        assert_eq!(part.guids_for(PKey::new(0x12).unwrap()), vec![Guid(2)]);
        assert_eq!(
            part.keys[&PKey::new(0x12).unwrap()].membership,
            Membership::Full
        );
        assert!(!part.keys.contains_key(&PKey::new(0x13).unwrap()));
        assert!(takes_away(&stored, &part));
        // Nothing to remove: the stored set itself.
        assert!(!takes_away(&stored, &removal_part(&stored, &stored)));
        assert_eq!(
            given(&removal_part(&stored, &stored)),
            given(&stored),
            "{:?}",
            removal_part(&stored, &stored)
        );
        // A port the node no longer lists leaves with its keys.
        let gone = removal_part(&stored, &set(&[1], vec![key(0x10, Membership::Full, None)]));
        assert_eq!(gone.port_guids, vec![Guid(1)]);
        assert_eq!(gone.guids_for(PKey::new(0x10).unwrap()), vec![Guid(1)]);
    }

    #[test]
    fn a_set_is_quarantined_for_an_operator_key_or_a_full_table() {
        let operator = crate::sm::opensm::parse::parse(
            b"Default=0x7fff : ALL=limited, SELF=full ;\nop=0x0a62 : ALL_SWITCHES=full ;\n",
        )
        .unwrap();
        let clash = set(&[1], vec![key(0x0a62, Membership::Full, None)]);
        assert!(matches!(
            quarantine_reason(&operator, &clash, 64, false),
            Some(RegionError::OperatorKey { .. })
        ));
        let fine = set(&[1], vec![key(0x0a63, Membership::Full, None)]);
        assert!(quarantine_reason(&operator, &fine, 64, false).is_none());
        assert!(matches!(
            quarantine_reason(&operator, &fine, 1, false),
            Some(RegionError::TableFull(_))
        ));
        // A key that gives no port (its only port was refused) clashes with nothing.
        let portless = set(&[1], vec![key(0x0a62, Membership::Full, Some(&[]))]);
        assert!(quarantine_reason(&operator, &portless, 64, false).is_none());
    }

    #[test]
    fn a_held_addition_is_rendered_as_accepted_while_a_release_and_other_additions_go_through() {
        use super::super::region::TenantEntry;
        let k = |k: u32| PKey::new(k).unwrap();
        let plan = |members: &[(u32, u64, Membership)]| {
            let mut tenants: BTreeMap<PKey, TenantEntry> = BTreeMap::new();
            for (key, g, m) in members {
                tenants
                    .entry(k(*key))
                    .or_insert_with(|| TenantEntry {
                        name: format!("fa.{key:04x}"),
                        members: BTreeMap::new(),
                    })
                    .members
                    .insert(Guid(*g), *m);
            }
            RegionPlan {
                default_entry: Some(Membership::Limited),
                tenants,
            }
        };
        use Membership::{Full, Limited};
        // Accepted: A (port 1) holds 0x11, B (port 2) holds 0x12 limited.
        let accepted: BTreeMap<RegionMember, Membership> =
            BTreeMap::from([((0x11, Guid(1)), Full), ((0x12, Guid(2)), Limited)]);
        // Stored now: A released 0x11; B added 0x13 and widened 0x12 (OpenSM rejected both);
        // C (port 3) added 0x14, not held.
        let full = plan(&[(0x12, 2, Full), (0x13, 2, Full), (0x14, 3, Full)]);
        let held = BTreeSet::from([(0x12, Guid(2)), (0x13, Guid(2))]);
        let written = without_held(&full, &accepted, &held);
        assert_eq!(written, plan(&[(0x12, 2, Limited), (0x14, 3, Full)]));
        // A's release is in it (0x11 is gone), B is served only in part.
        let a = set(&[1], vec![]);
        let mut b = set(&[2], vec![key(0x12, Full, None), key(0x13, Full, None)]);
        b.node_id = NodeId::parse("node2").unwrap();
        let mut c = set(&[3], vec![key(0x14, Full, None)]);
        c.node_id = NodeId::parse("node3").unwrap();
        assert_eq!(
            held_back(&full, &written, [&a, &b, &c]),
            BTreeSet::from([b.node_id.clone()])
        );
        // Nothing held: the file is the stored sets, nobody is held back.
        assert_eq!(without_held(&full, &accepted, &BTreeSet::new()), full);
        assert!(held_back(&full, &full, [&a, &b, &c]).is_empty());
        // A held member B narrows (full to limited) is a release: it goes through.
        let narrowed = plan(&[(0x11, 1, Limited)]);
        let held = BTreeSet::from([(0x11, Guid(1))]);
        assert_eq!(without_held(&narrowed, &accepted, &held), narrowed);
    }
}
