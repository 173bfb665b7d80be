//! The fabric side's grant rules, pure: which grants justify a node's set, and which grants a
//! newly accepted set consumes. Used by the UFM broker ([`super::ufm::broker`]); the OpenSM SM
//! host applies the same rules inside its backend.
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
