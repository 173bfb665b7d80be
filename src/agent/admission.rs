//! Pure admission rules for attach requests: what an attach may do given every attachment the
//! node already has. Checked before anything is persisted, so a refusal changes nothing.

use super::AgentError;
use crate::domain::{Attachment, AttachmentState, FabricName, InstanceId, Membership, Partition};
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
) -> Result<Admission, AgentError> {
    let p = &request.partition;
    if p.fabric != *node_fabric {
        return Err(AgentError::FailedPrecondition(format!(
            "partition {} is on fabric {:?} but this node is on fabric {:?}",
            p.id.as_str(),
            p.fabric.as_str(),
            node_fabric.as_str()
        )));
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
            return Err(AgentError::AlreadyExists(format!(
                "partition {} is attached on this node with P_Key {}, not {}",
                p.id.as_str(),
                a.partition.pkey,
                p.pkey
            )));
        }
        // A port holds one entry per key: two memberships of one key on one node cannot both
        // be true, and the second would wait forever.
        if a.partition.id == p.id
            && a.state != AttachmentState::Failed
            && a.membership != request.membership
        {
            return Err(AgentError::FailedPrecondition(format!(
                "instance {} on this node is a {} member of partition {}: a port holds one \
                 membership per P_Key, so {} cannot be attached as a {} member here",
                a.instance_id,
                a.membership,
                p.id.as_str(),
                request.instance_id,
                request.membership
            )));
        }
        if a.partition.id != p.id && a.partition.pkey == p.pkey {
            return Err(AgentError::FailedPrecondition(format!(
                "P_Key {} is in use on this node by partition {} ({})",
                p.pkey,
                a.partition.id.as_str(),
                a.state
            )));
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
        return Err(AgentError::ResourceExhausted(format!(
            "this node's fabric ports hold {key_capacity} partition keys besides the default partition, \
             and {} would be needed",
            keys.len()
        )));
    }
    Ok(Admission::Create)
}

fn same_instance(request: &AttachRequest, existing: &Attachment) -> Result<Admission, AgentError> {
    let p = &request.partition;
    if existing.state.is_released_or_releasing() {
        return Err(AgentError::FailedPrecondition(format!(
            "instance {} was released ({}); a terminated instance cannot be attached again",
            existing.instance_id, existing.state
        )));
    }
    if existing.partition.id != p.id {
        return Err(AgentError::FailedPrecondition(format!(
            "instance {} is attached to partition {}; an instance stays in its partition for its whole life",
            existing.instance_id,
            existing.partition.id.as_str()
        )));
    }
    if existing.partition.pkey != p.pkey {
        return Err(AgentError::AlreadyExists(format!(
            "instance {} is attached to partition {} with P_Key {}, not {}",
            existing.instance_id,
            p.id.as_str(),
            existing.partition.pkey,
            p.pkey
        )));
    }
    if existing.membership != request.membership {
        return Err(AgentError::AlreadyExists(format!(
            "instance {} is attached to partition {} as a {} member, not {}",
            existing.instance_id,
            p.id.as_str(),
            existing.membership,
            request.membership
        )));
    }
    Ok(Admission::Existing(Box::new(existing.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(instance: &str, id: &str, pkey: u32) -> AttachRequest {
        AttachRequest {
            instance_id: InstanceId::parse(instance).unwrap(),
            partition: Partition::new(id, "p", "ws", "acct", "fab1", pkey).unwrap(),
            membership: Membership::Full,
        }
    }

    fn existing(r: &AttachRequest, state: AttachmentState) -> Attachment {
        Attachment {
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

    #[test]
    fn rules() {
        let r = req("i1", "ibpart_a", 0x10);
        assert_eq!(admit(&r, &fab(), &[], 4).unwrap(), Admission::Create);
        let other_fabric = FabricName::parse("fab2").unwrap();
        assert!(matches!(
            admit(&r, &other_fabric, &[], 4),
            Err(AgentError::FailedPrecondition(_))
        ));
        let same = existing(&r, AttachmentState::Active);
        assert!(matches!(
            admit(&r, &fab(), std::slice::from_ref(&same), 4),
            Ok(Admission::Existing(_))
        ));
        let moved = req("i1", "ibpart_b", 0x11);
        assert!(matches!(
            admit(&moved, &fab(), std::slice::from_ref(&same), 4),
            Err(AgentError::FailedPrecondition(_))
        ));
        let rekeyed = req("i1", "ibpart_a", 0x11);
        assert!(matches!(
            admit(&rekeyed, &fab(), std::slice::from_ref(&same), 4),
            Err(AgentError::AlreadyExists(_))
        ));
        let mut limited = r.clone();
        limited.membership = Membership::Limited;
        assert!(matches!(
            admit(&limited, &fab(), std::slice::from_ref(&same), 4),
            Err(AgentError::AlreadyExists(_))
        ));
        let released = existing(&r, AttachmentState::Released);
        assert!(matches!(
            admit(&r, &fab(), &[released], 4),
            Err(AgentError::FailedPrecondition(_))
        ));
        let other_instance_rekeyed = req("i2", "ibpart_a", 0x11);
        assert!(matches!(
            admit(
                &other_instance_rekeyed,
                &fab(),
                std::slice::from_ref(&same),
                4
            ),
            Err(AgentError::AlreadyExists(_))
        ));
        let key_clash = req("i2", "ibpart_z", 0x10);
        assert!(matches!(
            admit(&key_clash, &fab(), std::slice::from_ref(&same), 4),
            Err(AgentError::FailedPrecondition(_))
        ));
        let second = req("i2", "ibpart_b", 0x11);
        assert!(matches!(
            admit(&second, &fab(), std::slice::from_ref(&same), 1),
            Err(AgentError::ResourceExhausted(_))
        ));
        let mut other_membership = req("i2", "ibpart_a", 0x10);
        other_membership.membership = Membership::Limited;
        match admit(&other_membership, &fab(), std::slice::from_ref(&same), 4) {
            Err(AgentError::FailedPrecondition(m)) => assert!(m.contains("i1"), "{m}"),
            other => panic!("a second membership of one key must be refused: {other:?}"),
        }
        let same_partition = req("i2", "ibpart_a", 0x10);
        assert_eq!(
            admit(&same_partition, &fab(), &[same], 1).unwrap(),
            Admission::Create
        );
    }
}
