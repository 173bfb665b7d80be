//! The fabric side's grant rules, pure: which grants justify a node's set, and which grants a
//! newly accepted set consumes. Used by both fabric sides: the UFM broker
//! ([`super::ufm::broker`]) and the OpenSM SM host's admission.
//!
//! Rules: every carried grant must verify (known key id, signature, the key's validity window),
//! name this node exactly, this fabric, a key of the set with exactly its membership, an
//! instance not revoked on this node, and not be consumed; a refused carried grant refuses the
//! whole set. Every key of the set needs a carried grant, except a key the node's stored set
//! already holds with the same membership: a set that only removes keys (a release) needs no
//! grant, and such a key keeps the grants stored for it. A grant of the previous accepted set
//! that the new one no longer carries is consumed: its instance was released.

use super::opensm::{AcceptedGrant, StoredNode};
use crate::domain::{GrantError, GrantPolicy, GrantUse, NodeMemberships, PKey, SignedGrant};
use std::collections::BTreeSet;

/// A refused set: the key the refused grant was for (or the key without a grant), and why.
pub type GrantRefusal = (PKey, GrantError);

/// The grants that justify `desired.keys`, or the first refusal. `consumed` holds every grant
/// id consumed on the fabric side (any node's); `stored` the node's last accepted set.
pub fn judge(
    policy: &GrantPolicy,
    consumed: &BTreeSet<String>,
    stored: Option<&StoredNode>,
    desired: &NodeMemberships,
    grants: &[SignedGrant],
) -> Result<Vec<AcceptedGrant>, GrantRefusal> {
    let mut accepted: Vec<AcceptedGrant> = Vec::new();
    for signed in grants {
        let grant = policy
            .keys
            .verify(signed)
            .map_err(|e| (signed.grant.pkey, e))?;
        if consumed.contains(&grant.grant_id)
            || stored.is_some_and(|s| s.revoked_instances.contains(&grant.instance_id))
        {
            return Err((
                grant.pkey,
                GrantError::Consumed {
                    grant_id: grant.grant_id.clone(),
                },
            ));
        }
        let setting = desired.keys.get(&grant.pkey).ok_or_else(|| {
            (
                grant.pkey,
                GrantError::Malformed(format!(
                    "grant {:?} is for key {}, which the set does not hold",
                    grant.grant_id, grant.pkey
                )),
            )
        })?;
        grant
            .check(&GrantUse {
                fabric: &policy.fabric,
                node_id: &desired.node_id,
                pkey: grant.pkey,
                membership: setting.membership,
            })
            .map_err(|e| (grant.pkey, e))?;
        if accepted.iter().any(|a| a.grant_id == grant.grant_id) {
            continue;
        }
        accepted.push(AcceptedGrant {
            grant_id: grant.grant_id.clone(),
            instance_id: grant.instance_id.clone(),
            pkey: grant.pkey,
            membership: grant.membership,
        });
    }
    for (key, setting) in &desired.keys {
        if accepted.iter().any(|a| a.pkey == *key) {
            continue;
        }
        let held = stored.filter(|s| {
            s.memberships
                .keys
                .get(key)
                .is_some_and(|k| k.membership == setting.membership)
        });
        match held {
            Some(s) => accepted.extend(s.grants.iter().filter(|g| g.pkey == *key).cloned()),
            None => return Err((*key, GrantError::Missing { pkey: *key })),
        }
    }
    Ok(accepted)
}

/// Records `accepted` as `record`'s grants; every grant of the record that `accepted` no longer
/// carries is consumed (added to the record's consumed set). Returns the newly consumed ids.
pub fn replace_grants(record: &mut StoredNode, accepted: Vec<AcceptedGrant>) -> Vec<String> {
    let kept: BTreeSet<&str> = accepted.iter().map(|g| g.grant_id.as_str()).collect();
    let gone: Vec<String> = record
        .grants
        .iter()
        .filter(|g| !kept.contains(g.grant_id.as_str()))
        .map(|g| g.grant_id.clone())
        .collect();
    record.consumed.extend(gone.iter().cloned());
    record.grants = accepted;
    gone
}

/// Consumes every grant of `instance` in `record`, marks the instance revoked, and removes the
/// keys no remaining grant justifies. Returns the consumed grant ids and the removed keys.
pub fn revoke(record: &mut StoredNode, instance: &str) -> (Vec<String>, Vec<PKey>) {
    let (revoked, kept): (Vec<AcceptedGrant>, Vec<AcceptedGrant>) = record
        .grants
        .drain(..)
        .partition(|g| g.instance_id == instance);
    record.grants = kept;
    record.revoked_instances.insert(instance.to_owned());
    let ids: Vec<String> = revoked.into_iter().map(|g| g.grant_id).collect();
    record.consumed.extend(ids.iter().cloned());
    record
        .revoked_grants
        .entry(instance.to_owned())
        .or_default()
        .extend(ids.iter().cloned());
    let justified: BTreeSet<PKey> = record.grants.iter().map(|g| g.pkey).collect();
    let removed: Vec<PKey> = record
        .memberships
        .keys
        .keys()
        .filter(|k| !justified.contains(k))
        .copied()
        .collect();
    for k in &removed {
        record.memberships.keys.remove(k);
    }
    (ids, removed)
}

/// Whether `record` already holds the revocation of `instance` with every one of `grant_ids`.
pub fn holds_revocation(record: &StoredNode, instance: &str, grant_ids: &BTreeSet<String>) -> bool {
    let known = record.revoked_grants.get(instance);
    record.revoked_instances.contains(instance)
        && grant_ids
            .iter()
            .all(|id| known.is_some_and(|k| k.contains(id)))
}

/// Applies a revocation another SM host recorded for `record`'s node (`instance`, and the grant
/// ids it consumed there) exactly as [`revoke`] would here, the peer's grant ids consumed too.
/// Union only: `None` when the record already holds all of it (nothing changes), else the
/// newly consumed ids and the removed keys. A peer can add revocations, never take one away.
pub fn learn_revocation(
    record: &mut StoredNode,
    instance: &str,
    grant_ids: &BTreeSet<String>,
) -> Option<(Vec<String>, Vec<PKey>)> {
    if holds_revocation(record, instance, grant_ids) {
        return None;
    }
    let (mut ids, removed) = revoke(record, instance);
    for id in grant_ids {
        if record.consumed.insert(id.clone()) {
            ids.push(id.clone());
        }
    }
    record
        .revoked_grants
        .entry(instance.to_owned())
        .or_default()
        .extend(grant_ids.iter().cloned());
    Some((ids, removed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{
        signed_message, FabricName, Grant, GrantKey, GrantKeys, Guid, KeySetting, Membership,
        NodeId,
    };
    use ed25519_dalek::{Signer, SigningKey};

    fn policy() -> GrantPolicy {
        let k = GrantKey::from_bytes(
            "cp",
            SigningKey::from_bytes(&[7; 32]).verifying_key().as_bytes(),
        )
        .unwrap();
        GrantPolicy {
            require: true,
            fabric: FabricName::parse("fab1").unwrap(),
            keys: GrantKeys::new([k]).unwrap(),
        }
    }

    fn signed(id: &str, node: &str, instance: &str, pkey: u32) -> SignedGrant {
        let bytes = id.as_bytes().to_vec();
        SignedGrant {
            signature: SigningKey::from_bytes(&[7; 32])
                .sign(&signed_message(&bytes))
                .to_bytes()
                .to_vec(),
            bytes,
            key_id: "cp".into(),
            grant: Grant {
                grant_id: id.into(),
                fabric: "fab1".into(),
                node_id: node.into(),
                instance_id: instance.into(),
                partition_id: "ibpart_x".into(),
                pkey: PKey::new(pkey).unwrap(),
                membership: Membership::Full,
                issued_at_unix_ms: 1,
            },
        }
    }

    fn set(keys: &[u32]) -> NodeMemberships {
        NodeMemberships {
            node_id: NodeId::parse("node1").unwrap(),
            port_guids: vec![Guid(1)],
            keys: keys
                .iter()
                .map(|k| {
                    (
                        PKey::new(*k).unwrap(),
                        KeySetting {
                            membership: Membership::Full,
                            name: String::new(),
                            ports: None,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_key_needs_a_grant_for_this_node_and_a_release_consumes_it() {
        let p = policy();
        let none = BTreeSet::new();
        let want = set(&[0x0a11]);
        let (k, e) = judge(&p, &none, None, &want, &[]).unwrap_err();
        assert_eq!(k.base(), 0x0a11);
        assert!(matches!(e, GrantError::Missing { .. }));
        let other = signed("g-2", "node2", "i-1", 0x0a11);
        assert!(judge(&p, &none, None, &want, &[other]).is_err());
        let g = signed("g-1", "node1", "i-1", 0x0a11);
        let accepted = judge(&p, &none, None, &want, std::slice::from_ref(&g)).unwrap();
        let mut record = StoredNode::new(want.clone(), 1);
        assert!(replace_grants(&mut record, accepted).is_empty());
        // The same key again needs no grant (the stored set holds it).
        assert_eq!(
            judge(&p, &none, Some(&record), &want, &[]).unwrap().len(),
            1
        );
        // A release needs none and consumes the grant; replaying it is refused.
        let released = judge(&p, &none, Some(&record), &set(&[]), &[]).unwrap();
        assert_eq!(
            replace_grants(&mut record, released),
            vec!["g-1".to_owned()]
        );
        let (_, e) = judge(&p, &record.consumed, Some(&record), &want, &[g]).unwrap_err();
        assert!(matches!(e, GrantError::Consumed { .. }));
    }

    /// node1 holding 0x0a11 by instance i-1 (grant g-a) and 0x0b22 by i-2 (g-b).
    fn two_instances(p: &GrantPolicy) -> StoredNode {
        let want = set(&[0x0a11, 0x0b22]);
        let grants = [
            signed("g-a", "node1", "i-1", 0x0a11),
            signed("g-b", "node1", "i-2", 0x0b22),
        ];
        let accepted = judge(p, &BTreeSet::new(), None, &want, &grants).unwrap();
        let mut record = StoredNode::new(want, 1);
        replace_grants(&mut record, accepted);
        record
    }

    #[test]
    fn a_revocation_consumes_the_instance_and_drops_its_keys() {
        let p = policy();
        let mut record = two_instances(&p);
        let (ids, removed) = revoke(&mut record, "i-1");
        assert_eq!(ids, vec!["g-a".to_owned()]);
        assert_eq!(removed, vec![PKey::new(0x0a11).unwrap()]);
        assert!(record.revoked_instances.contains("i-1"));
        assert_eq!(record.memberships.keys.len(), 1);
        // A fresh grant naming the revoked instance is refused.
        let again = signed("g-a2", "node1", "i-1", 0x0a11);
        let (_, e) = judge(
            &p,
            &record.consumed,
            Some(&record),
            &set(&[0x0a11, 0x0b22]),
            &[again],
        )
        .unwrap_err();
        assert!(matches!(e, GrantError::Consumed { .. }));
    }

    #[test]
    fn a_learned_revocation_is_applied_once_and_only_adds() {
        let mut record = two_instances(&policy());
        let ids: BTreeSet<String> = ["g-a".to_owned(), "g-x".to_owned()].into();
        let (consumed, removed) = learn_revocation(&mut record, "i-1", &ids).unwrap();
        assert_eq!(consumed, vec!["g-a".to_owned(), "g-x".to_owned()]);
        assert_eq!(removed, vec![PKey::new(0x0a11).unwrap()]);
        assert_eq!(record.revoked_grants["i-1"], ids);
        assert!(learn_revocation(&mut record, "i-1", &ids).is_none());
        assert!(learn_revocation(&mut record, "i-1", &BTreeSet::new()).is_none());
        assert!(!record.consumed.contains("g-b"));
        assert_eq!(record.memberships.keys.len(), 1);
    }
}
