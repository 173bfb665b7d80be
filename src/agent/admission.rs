//! Pure admission rules for attach requests: what an attach may do given every attachment the
//! node already has. Checked before anything is persisted, so a refusal changes nothing.

use super::Refusal;
use crate::domain::{
    Attachment, AttachmentState, FabricName, GrantError, GrantPolicy, GrantUse, InstanceId,
    Membership, NodeId, Partition, SignedGrant,
};
use std::collections::BTreeSet;

/// An attach request after field validation.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    /// The instance.
    pub instance_id: InstanceId,
    /// The partition.
    pub partition: Partition,
    /// Full or limited.
    pub membership: Membership,
    /// The control plane's grant for exactly this attachment, when the request carries one.
    pub grant: Option<SignedGrant>,
}

/// Checks an attach's grant against the request and this node (node id exact, fabric,
/// instance, partition, key, membership) and, when keys are configured, its signature. With
/// `policy.require`, an attach without a grant is refused. Nothing is stored on a refusal.
pub fn check_grant(
    request: &AttachRequest,
    node: &NodeId,
    policy: &GrantPolicy,
) -> Result<(), Refusal> {
    let Some(signed) = &request.grant else {
        return if policy.require {
            Err(Refusal::GrantRequired)
        } else {
            Ok(())
        };
    };
    let g = if policy.keys.is_empty() {
        &signed.grant
    } else {
        policy.keys.verify(signed)?
    };
    g.check(&GrantUse {
        fabric: &request.partition.fabric,
        node_id: node,
        pkey: request.partition.pkey,
        membership: request.membership,
    })?;
    for (field, granted, expected) in [
        ("instance_id", &g.instance_id, request.instance_id.as_str()),
        (
            "partition_id",
            &g.partition_id,
            request.partition.id.as_str(),
        ),
    ] {
        if granted != expected {
            return Err(Refusal::Grant(GrantError::WrongSubject {
                grant_id: g.grant_id.clone(),
                field,
                granted: granted.clone(),
                expected: expected.to_owned(),
            }));
        }
    }
    if g.fabric != policy.fabric.as_str() {
        return Err(Refusal::Grant(GrantError::WrongFabric {
            grant_id: g.grant_id.clone(),
            granted: g.fabric.clone(),
            expected: policy.fabric.as_str().to_owned(),
        }));
    }
    Ok(())
}

/// What an admitted attach does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A new attachment is created.
    Create,
    /// The same attachment exists already (idempotent re-send); return it unchanged.
    Existing(Box<Attachment>),
}

/// Applies the rules in the order a caller can act on them.
pub fn admit(
    request: &AttachRequest,
    node_fabric: &FabricName,
    attachments: &[Attachment],
    key_capacity: usize,
) -> Result<Admission, Refusal> {
    let p = &request.partition;
    if p.fabric != *node_fabric {
        return Err(Refusal::WrongFabric {
            partition: p.id.clone(),
            partition_fabric: p.fabric.clone(),
            node: node_fabric.clone(),
        });
    }
    if let Some(existing) = attachments
        .iter()
        .find(|a| a.instance_id == request.instance_id)
    {
        return same_instance(request, existing);
    }
    for a in attachments
        .iter()
        .filter(|a| a.state != AttachmentState::Released)
    {
        if a.partition.id == p.id && a.partition.pkey != p.pkey {
            return Err(Refusal::PartitionKeyDiffers {
                partition: p.id.clone(),
                attached: a.partition.pkey,
                requested: p.pkey,
            });
        }
        // A port holds one entry per key: two memberships of one key on one node cannot both
        // be true, and the second would wait forever.
        if a.partition.id == p.id
            && a.state != AttachmentState::Failed
            && a.membership != request.membership
        {
            return Err(Refusal::MembershipConflict {
                holder: a.instance_id.clone(),
                held: a.membership,
                partition: p.id.clone(),
                instance: request.instance_id.clone(),
                requested: request.membership,
            });
        }
        if a.partition.id != p.id && a.partition.pkey == p.pkey {
            return Err(Refusal::KeyHeldByOtherPartition {
                pkey: p.pkey,
                partition: a.partition.id.clone(),
                state: a.state,
            });
        }
    }
    // Keys the ports must hold at once: those still wanted, those still being released (they
    // occupy a slot until the SM removes them), plus this one.
    let mut keys: BTreeSet<u16> = attachments
        .iter()
        .filter(|a| a.state != AttachmentState::Released && a.state != AttachmentState::Failed)
        .map(|a| a.partition.pkey.base())
        .collect();
    keys.insert(p.pkey.base());
    if keys.len() > key_capacity {
        return Err(Refusal::TableFull {
            capacity: key_capacity,
            needed: keys.len(),
        });
    }
    Ok(Admission::Create)
}

fn same_instance(request: &AttachRequest, existing: &Attachment) -> Result<Admission, Refusal> {
    let p = &request.partition;
    if existing.state.is_released_or_releasing() {
        return Err(Refusal::InstanceReleased {
            instance: existing.instance_id.clone(),
            state: existing.state,
        });
    }
    if existing.partition.id != p.id {
        return Err(Refusal::InstanceInOtherPartition {
            instance: existing.instance_id.clone(),
            partition: existing.partition.id.clone(),
        });
    }
    if existing.partition.pkey != p.pkey {
        return Err(Refusal::InstanceKeyDiffers {
            instance: existing.instance_id.clone(),
            partition: p.id.clone(),
            attached: existing.partition.pkey,
            requested: p.pkey,
        });
    }
    if existing.membership != request.membership {
        return Err(Refusal::InstanceMembershipDiffers {
            instance: existing.instance_id.clone(),
            partition: p.id.clone(),
            attached: existing.membership,
            requested: request.membership,
        });
    }
    Ok(Admission::Existing(Box::new(existing.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    mod grants {
        use super::*;
        use crate::domain::{signed_message, Grant, GrantKey, GrantKeys, PKey};
        use ed25519_dalek::{Signer, SigningKey};

        fn signed(g: Grant, key: &SigningKey) -> SignedGrant {
            let bytes = format!("{g:?}").into_bytes();
            SignedGrant {
                signature: key.sign(&signed_message(&bytes)).to_bytes().to_vec(),
                bytes,
                key_id: "cp".into(),
                grant: g,
            }
        }

        fn grant() -> Grant {
            Grant {
                grant_id: "g1".into(),
                fabric: "fab1".into(),
                node_id: "node1".into(),
                instance_id: "i-1".into(),
                partition_id: "ibpart_a".into(),
                pkey: PKey::new(0x0a11).unwrap(),
                membership: Membership::Full,
                issued_at_unix_ms: 1,
            }
        }

        #[test]
        fn an_attach_grant_must_match_the_request_and_this_node() {
            let key = SigningKey::from_bytes(&[9; 32]);
            let fabric = FabricName::parse("fab1").unwrap();
            let node = NodeId::parse("node1").unwrap();
            let mut policy = GrantPolicy {
                require: true,
                fabric: fabric.clone(),
                keys: GrantKeys::new([
                    GrantKey::from_bytes("cp", key.verifying_key().as_bytes()).unwrap()
                ])
                .unwrap(),
            };
            let mut r = req("i-1", "ibpart_a", 0x0a11);
            assert_eq!(check_grant(&r, &node, &policy), Err(Refusal::GrantRequired));
            r.grant = Some(signed(grant(), &key));
            assert_eq!(check_grant(&r, &node, &policy), Ok(()));
            let other = NodeId::parse("NODE1").unwrap();
            assert!(matches!(
                check_grant(&r, &other, &policy),
                Err(Refusal::Grant(GrantError::WrongNode { .. }))
            ));
            let mut g = grant();
            g.instance_id = "i-2".into();
            r.grant = Some(signed(g, &key));
            assert!(matches!(
                check_grant(&r, &node, &policy),
                Err(Refusal::Grant(GrantError::WrongSubject {
                    field: "instance_id",
                    ..
                }))
            ));
            r.grant = Some(signed(grant(), &SigningKey::from_bytes(&[8; 32])));
            assert!(matches!(
                check_grant(&r, &node, &policy),
                Err(Refusal::Grant(GrantError::BadSignature { .. }))
            ));
            // Without keys the node checks the fields only; without require, no grant is fine.
            policy.keys = GrantKeys::default();
            assert_eq!(check_grant(&r, &node, &policy), Ok(()));
            policy.require = false;
            r.grant = None;
            assert_eq!(check_grant(&r, &node, &policy), Ok(()));
        }
    }

    fn req(instance: &str, id: &str, pkey: u32) -> AttachRequest {
        AttachRequest {
            grant: None,
            instance_id: InstanceId::parse(instance).unwrap(),
            partition: Partition::new(id, "p", "ws", "acct", "fab1", pkey).unwrap(),
            membership: Membership::Full,
        }
    }

    fn existing(r: &AttachRequest, state: AttachmentState) -> Attachment {
        Attachment {
            grant: None,
            instance_id: r.instance_id.clone(),
            partition: r.partition.clone(),
            membership: r.membership,
            state,
            reason: String::new(),
            created_unix_ns: 0,
            updated_unix_ns: 0,
        }
    }

    fn fab() -> FabricName {
        FabricName::parse("fab1").unwrap()
    }

    fn id(s: &str) -> crate::domain::PartitionId {
        req("i0", s, 1).partition.id
    }

    #[test]
    fn rules() {
        let r = req("i1", "ibpart_a", 0x10);
        assert_eq!(admit(&r, &fab(), &[], 4).unwrap(), Admission::Create);
        let other_fabric = FabricName::parse("fab2").unwrap();
        assert_eq!(
            admit(&r, &other_fabric, &[], 4),
            Err(Refusal::WrongFabric {
                partition: id("ibpart_a"),
                partition_fabric: fab(),
                node: other_fabric,
            })
        );
        let same = existing(&r, AttachmentState::Active);
        assert!(matches!(
            admit(&r, &fab(), std::slice::from_ref(&same), 4),
            Ok(Admission::Existing(_))
        ));
        let i1 = r.instance_id.clone();
        let moved = req("i1", "ibpart_b", 0x11);
        assert_eq!(
            admit(&moved, &fab(), std::slice::from_ref(&same), 4),
            Err(Refusal::InstanceInOtherPartition {
                instance: i1.clone(),
                partition: id("ibpart_a"),
            })
        );
        let rekeyed = req("i1", "ibpart_a", 0x11);
        assert_eq!(
            admit(&rekeyed, &fab(), std::slice::from_ref(&same), 4),
            Err(Refusal::InstanceKeyDiffers {
                instance: i1.clone(),
                partition: id("ibpart_a"),
                attached: r.partition.pkey,
                requested: rekeyed.partition.pkey,
            })
        );
        let mut limited = r.clone();
        limited.membership = Membership::Limited;
        assert_eq!(
            admit(&limited, &fab(), std::slice::from_ref(&same), 4),
            Err(Refusal::InstanceMembershipDiffers {
                instance: i1.clone(),
                partition: id("ibpart_a"),
                attached: Membership::Full,
                requested: Membership::Limited,
            })
        );
        let released = existing(&r, AttachmentState::Released);
        assert_eq!(
            admit(&r, &fab(), &[released], 4),
            Err(Refusal::InstanceReleased {
                instance: i1.clone(),
                state: AttachmentState::Released,
            })
        );
        let other_instance_rekeyed = req("i2", "ibpart_a", 0x11);
        assert_eq!(
            admit(
                &other_instance_rekeyed,
                &fab(),
                std::slice::from_ref(&same),
                4
            ),
            Err(Refusal::PartitionKeyDiffers {
                partition: id("ibpart_a"),
                attached: r.partition.pkey,
                requested: other_instance_rekeyed.partition.pkey,
            })
        );
        let key_clash = req("i2", "ibpart_z", 0x10);
        assert_eq!(
            admit(&key_clash, &fab(), std::slice::from_ref(&same), 4),
            Err(Refusal::KeyHeldByOtherPartition {
                pkey: r.partition.pkey,
                partition: id("ibpart_a"),
                state: AttachmentState::Active,
            })
        );
        let second = req("i2", "ibpart_b", 0x11);
        assert_eq!(
            admit(&second, &fab(), std::slice::from_ref(&same), 1),
            Err(Refusal::TableFull {
                capacity: 1,
                needed: 2
            })
        );
        let mut other_membership = req("i2", "ibpart_a", 0x10);
        other_membership.membership = Membership::Limited;
        assert_eq!(
            admit(&other_membership, &fab(), std::slice::from_ref(&same), 4),
            Err(Refusal::MembershipConflict {
                holder: i1,
                held: Membership::Full,
                partition: id("ibpart_a"),
                instance: other_membership.instance_id.clone(),
                requested: Membership::Limited,
            })
        );
        let same_partition = req("i2", "ibpart_a", 0x10);
        assert_eq!(
            admit(&same_partition, &fab(), &[same], 1).unwrap(),
            Admission::Create
        );
    }
}
