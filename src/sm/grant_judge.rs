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
use crate::domain::{
    GrantError, GrantPolicy, GrantUse, NodeMemberships, PKey, RetiredKeys, SignedGrant,
};
use std::collections::{BTreeMap, BTreeSet};

/// A refused set: the key the refused grant was for (or the key without a grant), and why.
pub type GrantRefusal = (PKey, GrantError);

/// What the fabric side holds against grants besides the node's own record: every consumed
/// grant id (any node's) and the retired keys.
#[derive(Clone, Copy)]
pub struct Ledger<'a> {
    /// Consumed grant ids: refused forever.
    pub consumed: &'a BTreeSet<String>,
    /// Retired keys: grants issued before their retirement are refused.
    pub retired: &'a RetiredKeys,
}

/// Whether a carried grant not yet admitted for the node is judged by its age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// A node's own request: a grant the node's stored set does not already hold is admitted
    /// only within its lifetime ([`crate::domain::GrantKeys::fresh`]) at this time (ms).
    Checked {
        /// The verifier's clock.
        now_unix_ms: u64,
    },
    /// A set a peer SM host forwards: the peer admitted it (its grants were fresh there), so
    /// age is not judged again; everything else is.
    AdmittedByPeer,
}

impl Freshness {
    /// A node's request judged now.
    pub fn now() -> Freshness {
        Freshness::Checked {
            now_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
        }
    }
}

/// A set's carried grants after [`verify_all`]: one per (key, instance), each naming a key of
/// the set, each signature verified. Built outside the admission lock.
#[derive(Debug, Clone, Default)]
pub struct VerifiedGrants(Vec<SignedGrant>);

impl VerifiedGrants {
    /// The grants.
    pub fn grants(&self) -> &[SignedGrant] {
        &self.0
    }
}

/// Prepares a set's carried grants, cheapest checks first so a flood costs one signature:
/// exact copies of one grant are dropped and two different grants for the same (key,
/// instance) refuse the set, both before any signature is checked; then every remaining grant
/// must name a key the set holds, and only then is each signature verified (known key id,
/// Ed25519, the key's validity window). Pure and lock-free: callers run it before taking
/// their admission lock.
pub fn verify_all(
    policy: &GrantPolicy,
    desired: &NodeMemberships,
    grants: &[SignedGrant],
) -> Result<VerifiedGrants, GrantRefusal> {
    let mut one: BTreeMap<(PKey, &str), &SignedGrant> = BTreeMap::new();
    for signed in grants {
        let g = &signed.grant;
        match one.get(&(g.pkey, g.instance_id.as_str())) {
            None => {
                one.insert((g.pkey, g.instance_id.as_str()), signed);
            }
            Some(first)
                if first.bytes == signed.bytes
                    && first.key_id == signed.key_id
                    && first.signature == signed.signature => {}
            Some(first) => {
                return Err((
                    g.pkey,
                    GrantError::Malformed(format!(
                        "grants {:?} and {:?} both grant key {} to instance {:?}: a set carries one grant per key and instance",
                        first.grant.grant_id, g.grant_id, g.pkey, g.instance_id
                    )),
                ))
            }
        }
    }
    let mut verified = Vec::with_capacity(one.len());
    for signed in one.into_values() {
        let g = &signed.grant;
        if !desired.keys.contains_key(&g.pkey) {
            return Err((
                g.pkey,
                GrantError::Malformed(format!(
                    "grant {:?} is for key {}, which the set does not hold",
                    g.grant_id, g.pkey
                )),
            ));
        }
        policy.keys.verify(signed).map_err(|e| (g.pkey, e))?;
        verified.push(signed.clone());
    }
    Ok(VerifiedGrants(verified))
}

/// The grants that justify `desired.keys`, or the first refusal. `grants` come from
/// [`verify_all`] (signatures already checked); `ledger` holds what the fabric side refuses
/// whatever the node; `stored` is the node's last accepted set; `freshness` says whether a
/// grant the stored set does not hold yet is judged by its age.
pub fn judge(
    policy: &GrantPolicy,
    ledger: Ledger<'_>,
    stored: Option<&StoredNode>,
    desired: &NodeMemberships,
    grants: &VerifiedGrants,
    freshness: Freshness,
) -> Result<Vec<AcceptedGrant>, GrantRefusal> {
    let mut accepted: Vec<AcceptedGrant> = Vec::new();
    for signed in grants.grants() {
        let grant = &signed.grant;
        if ledger.consumed.contains(&grant.grant_id)
            || stored.is_some_and(|s| {
                s.consumed.contains(&grant.grant_id)
                    || s.revoked_instances.contains(&grant.instance_id)
            })
        {
            return Err((
                grant.pkey,
                GrantError::Consumed {
                    grant_id: grant.grant_id.clone(),
                },
            ));
        }
        ledger.retired.check(grant).map_err(|e| (grant.pkey, e))?;
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
        let admitted =
            stored.is_some_and(|s| s.grants.iter().any(|a| a.grant_id == grant.grant_id));
        if let (Freshness::Checked { now_unix_ms }, false) = (freshness, admitted) {
            policy
                .keys
                .fresh(grant, now_unix_ms)
                .map_err(|e| (grant.pkey, e))?;
        }
        if accepted.iter().any(|a| a.grant_id == grant.grant_id) {
            continue;
        }
        accepted.push(AcceptedGrant {
            grant_id: grant.grant_id.clone(),
            instance_id: grant.instance_id.clone(),
            pkey: grant.pkey,
            membership: grant.membership,
            issued_at_unix_ms: grant.issued_at_unix_ms,
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

/// Drops from `record` the grants `dead` picks, consumes them, and removes the keys of theirs
/// no remaining grant justifies. Returns the consumed ids and the removed keys.
fn drop_grants(
    record: &mut StoredNode,
    dead: impl Fn(&AcceptedGrant) -> bool,
) -> (Vec<String>, Vec<PKey>) {
    let (gone, kept): (Vec<AcceptedGrant>, Vec<AcceptedGrant>) =
        record.grants.drain(..).partition(|g| dead(g));
    record.grants = kept;
    let justified: BTreeSet<PKey> = record.grants.iter().map(|g| g.pkey).collect();
    let mut removed: Vec<PKey> = gone
        .iter()
        .map(|g| g.pkey)
        .filter(|k| !justified.contains(k) && record.memberships.keys.contains_key(k))
        .collect();
    removed.sort();
    removed.dedup();
    for k in &removed {
        record.memberships.keys.remove(k);
    }
    let ids: Vec<String> = gone.into_iter().map(|g| g.grant_id).collect();
    record.consumed.extend(ids.iter().cloned());
    (ids, removed)
}

/// Records grant ids another SM host holds consumed for `record`'s node (released there, or
/// revoked), exactly as if the release had been seen here: each id is consumed, a stored grant
/// among them leaves the record and its key goes with it when no other grant justifies it.
/// Union only: `None` when the record already holds every id consumed. Returns the newly
/// consumed ids and the removed keys.
pub fn learn_consumed(
    record: &mut StoredNode,
    grant_ids: &BTreeSet<String>,
) -> Option<(Vec<String>, Vec<PKey>)> {
    let new: BTreeSet<&String> = grant_ids
        .iter()
        .filter(|id| !record.consumed.contains(*id))
        .collect();
    if new.is_empty() {
        return None;
    }
    let (_, removed) = drop_grants(record, |g| new.contains(&g.grant_id));
    let ids: Vec<String> = new.into_iter().cloned().collect();
    record.consumed.extend(ids.iter().cloned());
    Some((ids, removed))
}

/// Applies the retired keys to `record`: every stored grant for a retired key issued at or
/// before its retirement is consumed and leaves the record, and its key leaves the node's set
/// (like a revocation) unless a later grant (the new tenant's) justifies it. `None` when
/// nothing changes.
pub fn apply_retired(
    record: &mut StoredNode,
    retired: &RetiredKeys,
) -> Option<(Vec<String>, Vec<PKey>)> {
    if !record
        .grants
        .iter()
        .any(|g| retired.kills(g.pkey, g.issued_at_unix_ms))
    {
        return None;
    }
    Some(drop_grants(record, |g| {
        retired.kills(g.pkey, g.issued_at_unix_ms)
    }))
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

    /// [`verify_all`] then [`judge`], no key retired, age not judged.
    fn judged(
        p: &GrantPolicy,
        consumed: &BTreeSet<String>,
        stored: Option<&StoredNode>,
        want: &NodeMemberships,
        grants: &[SignedGrant],
    ) -> Result<Vec<AcceptedGrant>, GrantRefusal> {
        let verified = verify_all(p, want, grants)?;
        let ledger = Ledger {
            consumed,
            retired: &RetiredKeys::default(),
        };
        judge(p, ledger, stored, want, &verified, Freshness::now())
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
        let (k, e) = judged(&p, &none, None, &want, &[]).unwrap_err();
        assert_eq!(k.base(), 0x0a11);
        assert!(matches!(e, GrantError::Missing { .. }));
        let other = signed("g-2", "node2", "i-1", 0x0a11);
        assert!(judged(&p, &none, None, &want, &[other]).is_err());
        let g = signed("g-1", "node1", "i-1", 0x0a11);
        let accepted = judged(&p, &none, None, &want, std::slice::from_ref(&g)).unwrap();
        let mut record = StoredNode::new(want.clone(), 1);
        assert!(replace_grants(&mut record, accepted).is_empty());
        // The same key again needs no grant (the stored set holds it).
        assert_eq!(
            judged(&p, &none, Some(&record), &want, &[]).unwrap().len(),
            1
        );
        // A release needs none and consumes the grant; replaying it is refused.
        let released = judged(&p, &none, Some(&record), &set(&[]), &[]).unwrap();
        assert_eq!(
            replace_grants(&mut record, released),
            vec!["g-1".to_owned()]
        );
        let (_, e) = judged(&p, &record.consumed, Some(&record), &want, &[g]).unwrap_err();
        assert!(matches!(e, GrantError::Consumed { .. }));
    }

    /// node1 holding 0x0a11 by instance i-1 (grant g-a) and 0x0b22 by i-2 (g-b).
    fn two_instances(p: &GrantPolicy) -> StoredNode {
        let want = set(&[0x0a11, 0x0b22]);
        let grants = [
            signed("g-a", "node1", "i-1", 0x0a11),
            signed("g-b", "node1", "i-2", 0x0b22),
        ];
        let accepted = judged(p, &BTreeSet::new(), None, &want, &grants).unwrap();
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
        let (_, e) = judged(
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
