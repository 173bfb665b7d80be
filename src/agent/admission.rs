//! Pure admission rules for attach requests: what an attach may do given every attachment the
//! node already has. Checked before anything is persisted, so a refusal changes nothing.

use super::Refusal;
use crate::domain::{
    Attachment, AttachmentPort, AttachmentState, FabricName, GrantError, GrantPolicy, GrantUse,
    Guid, InstanceId, Inventory, Membership, NodeId, Partition, PortName, SignedGrant,
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
    /// The instance's ports; empty means every fabric port of the node (a whole-node instance).
    pub ports: Vec<PortName>,
}

/// The ports an admitted attachment covers, fixed at admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Covered {
    /// The ports.
    pub ports: Vec<AttachmentPort>,
    /// Whether the request named them (else: every fabric port, and later ones join).
    pub named: bool,
}

/// Resolves the request's port names against the node's ports: each must be a fabric port of
/// this node, named once; none named means every fabric port.
pub fn resolve_ports(names: &[PortName], inventory: &Inventory) -> Result<Covered, Refusal> {
    let fabric = inventory.fabric_ports().count();
    if names.is_empty() {
        return Ok(Covered {
            ports: inventory.fabric_ports().map(AttachmentPort::of).collect(),
            named: false,
        });
    }
    if names.len() > fabric {
        return Err(Refusal::TooManyPorts {
            named: names.len(),
            fabric,
        });
    }
    let mut ports: Vec<AttachmentPort> = Vec::new();
    for name in names {
        let port = inventory
            .ports
            .iter()
            .find(|p| name.names(p))
            .ok_or_else(|| Refusal::UnknownPort {
                port: name.to_string(),
            })?;
        if !port.fabric_port {
            return Err(Refusal::NotFabricPort {
                port: name.to_string(),
            });
        }
        if ports.iter().any(|p| p.port_guid == port.port_guid) {
            return Err(Refusal::PortNamedTwice {
                port: AttachmentPort::of(port).to_string(),
            });
        }
        ports.push(AttachmentPort::of(port));
    }
    ports.sort();
    Ok(Covered { ports, named: true })
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
    /// A new attachment is created, covering these ports.
    Create(Covered),
    /// The same attachment exists already (idempotent re-send); return it unchanged.
    Existing(Box<Attachment>),
}

/// Applies the rules in the order a caller can act on them. `inventory` is the latest port read
/// with fabric ports marked.
pub fn admit(
    request: &AttachRequest,
    node_fabric: &FabricName,
    attachments: &[Attachment],
    inventory: &Inventory,
) -> Result<Admission, Refusal> {
    let p = &request.partition;
    if p.fabric != *node_fabric {
        return Err(Refusal::WrongFabric {
            partition: p.id.clone(),
            partition_fabric: p.fabric.clone(),
            node: node_fabric.clone(),
        });
    }
    let covered = resolve_ports(&request.ports, inventory)?;
    if let Some(existing) = attachments
        .iter()
        .find(|a| a.instance_id == request.instance_id)
    {
        return same_instance(request, existing, &covered);
    }
    let wanted: Vec<Guid> = {
        let mut g: Vec<Guid> = covered.ports.iter().map(|p| p.port_guid).collect();
        if !covered.named {
            // A whole-node attach also takes every port that joins later.
            g.extend(inventory.fabric_ports().map(|p| p.port_guid));
        }
        g
    };
    let live = || {
        attachments
            .iter()
            .filter(|a| a.state != AttachmentState::Released)
    };
    for a in live() {
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
    // One partition per port: a port covered by a live attachment of another partition
    // (RELEASING included: its key may still be there) cannot take this one.
    for a in live().filter(|a| a.partition.id != p.id) {
        let held = a.covered_guids(Some(inventory));
        if let Some(g) = wanted.iter().find(|g| held.contains(g)) {
            return Err(Refusal::PortHeldByOtherPartition {
                port: a.port_label(*g, Some(inventory)),
                holder: a.instance_id.clone(),
                partition: a.partition.id.clone(),
                state: a.state,
            });
        }
    }
    // Keys each port must hold at once: those still wanted there, those still being released
    // (they occupy a slot until the SM removes them), plus this one.
    for g in &wanted {
        let Some(port) = inventory.port(*g) else {
            continue;
        };
        let mut keys: BTreeSet<u16> = live()
            .filter(|a| a.state != AttachmentState::Failed)
            .filter(|a| a.covered_guids(Some(inventory)).contains(g))
            .map(|a| a.partition.pkey.base())
            .collect();
        keys.insert(p.pkey.base());
        let capacity = port.pkeys.len().saturating_sub(1);
        if keys.len() > capacity {
            return Err(Refusal::TableFull {
                capacity,
                needed: keys.len(),
            });
        }
    }
    if wanted.is_empty() {
        return Err(Refusal::TableFull {
            capacity: 0,
            needed: 1,
        });
    }
    Ok(Admission::Create(covered))
}

fn same_instance(
    request: &AttachRequest,
    existing: &Attachment,
    covered: &Covered,
) -> Result<Admission, Refusal> {
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
    // A re-sent whole-node attach matches a whole-node attachment whatever ports joined since;
    // named ports must be the same set.
    let same_ports = existing.named_ports == covered.named
        && (!covered.named
            || existing
                .ports
                .iter()
                .map(|p| p.port_guid)
                .eq(covered.ports.iter().map(|p| p.port_guid)));
    if !same_ports {
        let list = |named: bool, ports: &[AttachmentPort]| {
            if named {
                ports
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            } else {
                "every fabric port".to_owned()
            }
        };
        return Err(Refusal::InstancePortsDiffer {
            instance: existing.instance_id.clone(),
            attached: list(existing.named_ports, &existing.ports),
            requested: list(covered.named, &covered.ports),
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
            ports: Vec::new(),
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
            ports: Vec::new(),
            named_ports: false,
            restored: None,
            evidence: None,
        }
    }

    /// Two fabric ports (GUIDs 1 and 2, `hca/1` and `hca/2`) whose tables hold `capacity`
    /// tenant keys, and one RoCE port that is not a fabric port.
    fn inv(capacity: usize) -> Inventory {
        use crate::domain::{LinkLayer, PKeyValue, PortInfo, PortSelector};
        let port = |n: u8, ll| PortInfo {
            device: "hca".into(),
            port_number: n,
            port_guid: Guid(u64::from(n)),
            link_layer: ll,
            pkeys: vec![PKeyValue(0); capacity + 1],
            ..Default::default()
        };
        let mut i = Inventory {
            ports: vec![
                port(1, LinkLayer::Infiniband),
                port(2, LinkLayer::Infiniband),
                port(3, LinkLayer::Ethernet),
            ],
        };
        PortSelector::default().apply(&mut i);
        i
    }

    fn create(r: Result<Admission, Refusal>) -> Covered {
        match r {
            Ok(Admission::Create(c)) => c,
            other => panic!("expected Create, got {other:?}"),
        }
    }

    fn named(r: &mut AttachRequest, ports: &[u8]) {
        r.ports = ports
            .iter()
            .map(|n| PortName::Device {
                device: "hca".into(),
                port_number: *n,
            })
            .collect();
    }

    #[test]
    fn ports_are_resolved_and_validated_before_anything_is_stored() {
        let i = inv(4);
        let mut r = req("i1", "ibpart_a", 0x10);
        let whole = create(admit(&r, &fab(), &[], &i));
        assert!(!whole.named);
        assert_eq!(whole.ports.len(), 2, "every fabric port, not the RoCE one");
        named(&mut r, &[2]);
        let one = create(admit(&r, &fab(), &[], &i));
        assert!(one.named);
        assert_eq!(one.ports[0].port_guid, Guid(2));
        r.ports = vec![PortName::Guid(Guid(1))];
        assert_eq!(create(admit(&r, &fab(), &[], &i)).ports[0].port_number, 1);
        let refused = |ports: Vec<PortName>| {
            let mut r = req("i1", "ibpart_a", 0x10);
            r.ports = ports;
            admit(&r, &fab(), &[], &i).unwrap_err()
        };
        let dev = |d: &str, n: u8| PortName::Device {
            device: d.into(),
            port_number: n,
        };
        assert_eq!(
            refused(vec![dev("mlx5_9", 1)]),
            Refusal::UnknownPort {
                port: "mlx5_9/1".into()
            }
        );
        assert_eq!(
            refused(vec![PortName::Guid(Guid(99))]),
            Refusal::UnknownPort {
                port: Guid(99).to_string()
            }
        );
        assert_eq!(
            refused(vec![dev("hca", 3)]),
            Refusal::NotFabricPort {
                port: "hca/3".into()
            }
        );
        assert!(matches!(
            refused(vec![dev("hca", 1), PortName::Guid(Guid(1))]),
            Refusal::PortNamedTwice { port } if port.starts_with("hca/1")
        ));
        assert_eq!(
            refused(vec![dev("hca", 1), dev("hca", 2), dev("hca", 1)]),
            Refusal::TooManyPorts {
                named: 3,
                fabric: 2
            }
        );
    }

    #[test]
    fn a_port_carries_one_partition_until_the_previous_one_is_released() {
        let i = inv(4);
        let mut a = req("vm-a", "ibpart_a", 0x10);
        named(&mut a, &[1]);
        let mut held = existing(&a, AttachmentState::Releasing);
        held.ports = create(admit(&a, &fab(), &[], &i)).ports;
        held.named_ports = true;
        let mut b = req("vm-b", "ibpart_b", 0x11);
        named(&mut b, &[1, 2]);
        match admit(&b, &fab(), std::slice::from_ref(&held), &i) {
            Err(Refusal::PortHeldByOtherPartition {
                port,
                holder,
                partition,
                state,
            }) => {
                assert!(port.starts_with("hca/1"), "{port}");
                assert_eq!(holder.as_str(), "vm-a");
                assert_eq!(partition.as_str(), "ibpart_a");
                assert_eq!(state, AttachmentState::Releasing);
            }
            other => panic!("{other:?}"),
        }
        // A whole-node attach overlaps every port.
        let whole = req("vm-c", "ibpart_c", 0x12);
        assert!(matches!(
            admit(&whole, &fab(), std::slice::from_ref(&held), &i),
            Err(Refusal::PortHeldByOtherPartition { .. })
        ));
        // Disjoint ports, and the same partition on the same port, are fine.
        named(&mut b, &[2]);
        assert!(create(admit(&b, &fab(), std::slice::from_ref(&held), &i)).named);
        let mut same = req("vm-d", "ibpart_a", 0x10);
        named(&mut same, &[1]);
        create(admit(&same, &fab(), std::slice::from_ref(&held), &i));
        // Once RELEASED the port is free.
        held.state = AttachmentState::Released;
        named(&mut b, &[1, 2]);
        create(admit(&b, &fab(), &[held.clone()], &i));
        // A re-sent attach must name the same ports.
        let mut mine = existing(&b, AttachmentState::Active);
        mine.ports = create(admit(&b, &fab(), &[], &i)).ports;
        mine.named_ports = true;
        assert!(matches!(
            admit(&b, &fab(), std::slice::from_ref(&mine), &i),
            Ok(Admission::Existing(_))
        ));
        named(&mut b, &[2]);
        assert!(matches!(
            admit(&b, &fab(), std::slice::from_ref(&mine), &i),
            Err(Refusal::InstancePortsDiffer { .. })
        ));
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
        assert!(!create(admit(&r, &fab(), &[], &inv(4))).named);
        let other_fabric = FabricName::parse("fab2").unwrap();
        assert_eq!(
            admit(&r, &other_fabric, &[], &inv(4)),
            Err(Refusal::WrongFabric {
                partition: id("ibpart_a"),
                partition_fabric: fab(),
                node: other_fabric,
            })
        );
        let same = existing(&r, AttachmentState::Active);
        assert!(matches!(
            admit(&r, &fab(), std::slice::from_ref(&same), &inv(4)),
            Ok(Admission::Existing(_))
        ));
        let i1 = r.instance_id.clone();
        let moved = req("i1", "ibpart_b", 0x11);
        assert_eq!(
            admit(&moved, &fab(), std::slice::from_ref(&same), &inv(4)),
            Err(Refusal::InstanceInOtherPartition {
                instance: i1.clone(),
                partition: id("ibpart_a"),
            })
        );
        let rekeyed = req("i1", "ibpart_a", 0x11);
        assert_eq!(
            admit(&rekeyed, &fab(), std::slice::from_ref(&same), &inv(4)),
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
            admit(&limited, &fab(), std::slice::from_ref(&same), &inv(4)),
            Err(Refusal::InstanceMembershipDiffers {
                instance: i1.clone(),
                partition: id("ibpart_a"),
                attached: Membership::Full,
                requested: Membership::Limited,
            })
        );
        let released = existing(&r, AttachmentState::Released);
        assert_eq!(
            admit(&r, &fab(), &[released], &inv(4)),
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
                &inv(4)
            ),
            Err(Refusal::PartitionKeyDiffers {
                partition: id("ibpart_a"),
                attached: r.partition.pkey,
                requested: other_instance_rekeyed.partition.pkey,
            })
        );
        let key_clash = req("i2", "ibpart_z", 0x10);
        assert_eq!(
            admit(&key_clash, &fab(), std::slice::from_ref(&same), &inv(4)),
            Err(Refusal::KeyHeldByOtherPartition {
                pkey: r.partition.pkey,
                partition: id("ibpart_a"),
                state: AttachmentState::Active,
            })
        );
        // Another partition on the same ports is refused (one partition per port); a table
        // with no free slot refuses any key.
        let second = req("i2", "ibpart_b", 0x11);
        assert!(matches!(
            admit(&second, &fab(), std::slice::from_ref(&same), &inv(4)),
            Err(Refusal::PortHeldByOtherPartition { .. })
        ));
        assert_eq!(
            admit(&second, &fab(), &[], &inv(0)),
            Err(Refusal::TableFull {
                capacity: 0,
                needed: 1
            })
        );
        let mut other_membership = req("i2", "ibpart_a", 0x10);
        other_membership.membership = Membership::Limited;
        assert_eq!(
            admit(
                &other_membership,
                &fab(),
                std::slice::from_ref(&same),
                &inv(4)
            ),
            Err(Refusal::MembershipConflict {
                holder: i1,
                held: Membership::Full,
                partition: id("ibpart_a"),
                instance: other_membership.instance_id.clone(),
                requested: Membership::Limited,
            })
        );
        let same_partition = req("i2", "ibpart_a", 0x10);
        create(admit(&same_partition, &fab(), &[same], &inv(1)));
    }
}
