//! What to change in one partition so that this node's GUIDs end up as desired. Pure.

use super::wire::PartitionState;
use crate::domain::{Guid, Membership};
use std::collections::BTreeSet;

/// The GUIDs to add (with the desired membership) and to remove for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPlan {
    /// GUIDs missing, or present with the wrong membership or index0.
    pub add: Vec<Guid>,
    /// This node's GUIDs present although they should not be.
    pub remove: Vec<Guid>,
}

impl KeyPlan {
    /// Nothing to do.
    pub(crate) fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

/// Compares UFM's view of one partition with what this node wants.
///
/// - `current`: the partition as UFM reports it (`None`: no such key).
/// - `want`: the desired membership, or `None` when the node no longer wants the key.
/// - `ports`: the node's current port GUIDs.
/// - `stale`: the ledger's GUIDs for this key: GUIDs this node put in it earlier, visible now
///   or not (removed when the key is no longer wanted, or when no longer among `ports`).
/// - `index0`: the configured index0; checked only where UFM reports it.
pub(crate) fn plan_key(
    current: Option<&PartitionState>,
    want: Option<Membership>,
    ports: &BTreeSet<Guid>,
    stale: &BTreeSet<Guid>,
    index0: bool,
) -> KeyPlan {
    let present = |g: &Guid| current.is_some_and(|p| p.members.contains_key(g));
    match want {
        Some(membership) => KeyPlan {
            add: ports
                .iter()
                .filter(|g| {
                    let entry = current.and_then(|p| p.members.get(g));
                    !entry.is_some_and(|m| {
                        m.membership == membership && m.index0.is_none_or(|i| i == index0)
                    })
                })
                .copied()
                .collect(),
            remove: stale
                .iter()
                .filter(|g| !ports.contains(g) && present(g))
                .copied()
                .collect(),
        },
        None => KeyPlan {
            add: Vec::new(),
            remove: ports.union(stale).filter(|g| present(g)).copied().collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::Member;
    use super::*;

    fn state(members: &[(u64, Membership)]) -> PartitionState {
        PartitionState {
            members: members
                .iter()
                .map(|(g, m)| {
                    (
                        Guid(*g),
                        Member {
                            membership: *m,
                            index0: Some(false),
                        },
                    )
                })
                .collect(),
        }
    }

    fn set(g: &[u64]) -> BTreeSet<Guid> {
        g.iter().map(|g| Guid(*g)).collect()
    }

    #[test]
    fn adds_missing_and_wrong_membership_only() {
        let cur = state(&[
            (1, Membership::Full),
            (2, Membership::Limited),
            (9, Membership::Full),
        ]);
        let p = plan_key(
            Some(&cur),
            Some(Membership::Full),
            &set(&[1, 2, 3]),
            &set(&[]),
            false,
        );
        assert_eq!(p.add, vec![Guid(2), Guid(3)]);
        assert!(p.remove.is_empty(), "other nodes' GUIDs are never touched");
    }

    #[test]
    fn a_missing_key_gets_every_port() {
        let p = plan_key(
            None,
            Some(Membership::Limited),
            &set(&[1, 2]),
            &set(&[]),
            false,
        );
        assert_eq!(p.add, vec![Guid(1), Guid(2)]);
    }

    #[test]
    fn index0_mismatch_is_reprogrammed() {
        let cur = state(&[(1, Membership::Full)]);
        assert!(plan_key(
            Some(&cur),
            Some(Membership::Full),
            &set(&[1]),
            &set(&[]),
            false
        )
        .is_empty());
        let p = plan_key(
            Some(&cur),
            Some(Membership::Full),
            &set(&[1]),
            &set(&[]),
            true,
        );
        assert_eq!(p.add, vec![Guid(1)]);
    }

    #[test]
    fn undesired_key_loses_only_this_nodes_guids() {
        let cur = state(&[
            (1, Membership::Full),
            (5, Membership::Full),
            (9, Membership::Full),
        ]);
        let p = plan_key(Some(&cur), None, &set(&[1, 2]), &set(&[5]), false);
        assert_eq!(p.remove, vec![Guid(1), Guid(5)]);
        assert!(p.add.is_empty());
        assert!(plan_key(None, None, &set(&[1]), &set(&[]), false).is_empty());
    }

    #[test]
    fn stale_guids_of_a_desired_key_are_removed() {
        let cur = state(&[(1, Membership::Full), (5, Membership::Full)]);
        let p = plan_key(
            Some(&cur),
            Some(Membership::Full),
            &set(&[1]),
            &set(&[1, 5]),
            false,
        );
        assert!(p.add.is_empty());
        assert_eq!(p.remove, vec![Guid(5)]);
    }
}
