//! The `fabric.sm.v1` boundary: protobuf <-> domain conversion both ways and the error mapping
//! both ways, used by the SM host's service ([`super::service`]) and by the nodes' remote
//! backend ([`super::client`]). Validation is the domain's ([`NodeMemberships::validate`]).

use super::authorisation::PartitionsRefusal;
use crate::domain::{Guid, KeySetting, Membership, NodeId, NodeMemberships, PKey};
use crate::proto::sm as pb;
use crate::sm::ufm::broker::BrokerError;
use crate::sm::{
    FabricSideError, FabricSideErrorKind, OpenSmError, SmError, SmFailure, StoredNode,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::{Code, Status};

/// Type URL of the [`pb::StaleGeneration`] detail of an ABORTED status.
pub const STALE_GENERATION_TYPE_URL: &str = "type.googleapis.com/fabric.sm.v1.StaleGeneration";
/// Trailer carrying the stored generation (decimal) of an ABORTED status.
pub const STORED_GENERATION_TRAILER: &str = "fabric-stored-generation";

/// A node's desired set as `fabric.sm.v1` sends it.
pub fn memberships_to_proto(desired: &NodeMemberships, generation: u64) -> pb::NodeMemberships {
    pb::NodeMemberships {
        node_id: desired.node_id.to_string(),
        port_guids: desired.port_guids.iter().map(ToString::to_string).collect(),
        keys: desired
            .keys
            .iter()
            .map(|(k, s)| pb::KeyMembership {
                pkey: u32::from(k.base()),
                full: s.membership == Membership::Full,
                name: s.name.clone(),
                port_guids: s.ports.iter().flatten().map(ToString::to_string).collect(),
            })
            .collect(),
        generation,
        grants: Vec::new(),
    }
}

/// A stored node as `fabric.sm.v1` returns it (the same encoding the remote backend sends).
pub fn stored_to_proto(n: &StoredNode) -> pb::NodeMemberships {
    memberships_to_proto(&n.memberships, n.generation)
}

/// The highest generation the SM host accepts: 2^53. A node reserves generations in blocks of
/// 1024 and sends one per apply; at a thousand applies a second it would take 285,000 years to
/// get there, so a higher one is a mistake or an attack (one near `u64::MAX` would fence the
/// node for good: no later set could be newer). Also the largest integer a JSON number keeps
/// exactly, for the tools that read the SM host's records.
pub const MAX_GENERATION: u64 = 1 << 53;

/// Converts a request's memberships to the domain, with the node's generation; a set that
/// fails [`NodeMemberships::validate`], or whose generation is 0 or above [`MAX_GENERATION`],
/// is INVALID_ARGUMENT.
pub fn memberships_from_proto(m: pb::NodeMemberships) -> Result<(NodeMemberships, u64), Status> {
    if !(1..=MAX_GENERATION).contains(&m.generation) {
        return Err(Status::invalid_argument(format!(
            "generation {} is outside 1..={MAX_GENERATION}; a node's generations are a persisted counter starting at 1",
            m.generation
        )));
    }
    let node_id = node_id(&m.node_id)?;
    let port_guids = m
        .port_guids
        .iter()
        .map(|g| parse_guid(g))
        .collect::<Result<Vec<_>, _>>()?;
    let mut keys = BTreeMap::new();
    for k in m.keys {
        let key = PKey::new(k.pkey).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let setting = KeySetting {
            membership: if k.full {
                Membership::Full
            } else {
                Membership::Limited
            },
            name: k.name,
            ports: if k.port_guids.is_empty() {
                None
            } else {
                Some(
                    k.port_guids
                        .iter()
                        .map(|g| parse_guid(g))
                        .collect::<Result<_, _>>()?,
                )
            },
        };
        if keys.insert(key, setting).is_some() {
            return Err(Status::invalid_argument(format!("key {key} listed twice")));
        }
    }
    let desired = NodeMemberships {
        node_id,
        port_guids,
        keys,
    };
    desired
        .validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((desired, m.generation))
}

/// A node id from a request: INVALID_ARGUMENT unless it follows [`NodeId`]'s rules.
pub fn node_id(s: &str) -> Result<NodeId, Status> {
    NodeId::parse(s).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn parse_guid(s: &str) -> Result<Guid, Status> {
    let hex = s
        .strip_prefix("0x")
        .filter(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    match hex.map(|h| u64::from_str_radix(h, 16)) {
        Some(Ok(0)) => Err(Status::invalid_argument(
            "port GUID 0x0000000000000000 is not a port",
        )),
        Some(Ok(g)) => Ok(Guid(g)),
        _ => Err(Status::invalid_argument(format!(
            "port GUID {s:?} is not \"0x\" followed by 16 hex digits"
        ))),
    }
}

/// The status the SM host answers a backend error with.
pub fn status_of(e: &OpenSmError) -> Status {
    status_of_fabric_side(&e.clone().into())
}

/// The status of a fabric side's failure (the SM host's or the UFM broker's): the one place for
/// `fabric.sm.v1`'s codes, with the backend's message.
pub fn status_of_fabric_side(e: &FabricSideError) -> Status {
    let msg = e.message().to_owned();
    match e.kind() {
        FabricSideErrorKind::Invalid => Status::invalid_argument(msg),
        FabricSideErrorKind::StaleGeneration { sent, stored } => {
            stale_generation_status(sent, stored, msg)
        }
        FabricSideErrorKind::Exhausted => Status::resource_exhausted(msg),
        FabricSideErrorKind::Precondition => Status::failed_precondition(msg),
        FabricSideErrorKind::Denied => Status::permission_denied(msg),
        FabricSideErrorKind::NotFound => Status::not_found(msg),
        FabricSideErrorKind::Unavailable => Status::unavailable(msg),
        FabricSideErrorKind::Internal => Status::internal(msg),
    }
}

/// The status of a UFM broker failure.
pub fn status_of_broker(e: &BrokerError) -> Status {
    status_of_fabric_side(&e.clone().into())
}

/// The status the SM host answers a call it refuses before the backend sees it with.
pub fn status_of_refusal(r: &PartitionsRefusal) -> Status {
    let msg = r.to_string();
    match r {
        PartitionsRefusal::MembershipsMissing => Status::invalid_argument(msg),
        PartitionsRefusal::NoVerifiedCaller
        | PartitionsRefusal::UidMayNotWrite { .. }
        | PartitionsRefusal::NodeNotMapped { .. }
        | PartitionsRefusal::NotOperator { .. }
        | PartitionsRefusal::Grant(_) => Status::permission_denied(msg),
        PartitionsRefusal::NotStored(_) => Status::not_found(msg),
    }
}

/// The ABORTED status refusing a generation: the stored generation as a status detail
/// (`ErrorStatus` = `google.rpc.Status` with a `StaleGeneration` in `details`) and as the
/// `fabric-stored-generation` trailer.
pub fn stale_generation_status(sent: u64, stored: u64, message: String) -> Status {
    use prost::Message;
    let detail = pb::StaleGeneration { stored, sent };
    let details = pb::ErrorStatus {
        code: Code::Aborted as i32,
        message: message.clone(),
        details: vec![prost_types::Any {
            type_url: STALE_GENERATION_TYPE_URL.into(),
            value: detail.encode_to_vec(),
        }],
    };
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(
        STORED_GENERATION_TRAILER,
        stored
            .to_string()
            .parse()
            .expect("decimal digits are valid metadata"),
    );
    Status::with_details_and_metadata(
        Code::Aborted,
        message,
        details.encode_to_vec().into(),
        metadata,
    )
}

/// The generation the SM host holds, when `status` is its ABORTED refusing a generation
/// (`fabric.sm.v1.StaleGeneration` in the status details, else the `fabric-stored-generation`
/// trailer); `None` for any other status.
pub fn stored_generation(status: &Status) -> Option<u64> {
    use prost::Message;
    if status.code() != Code::Aborted {
        return None;
    }
    let from_details = pb::ErrorStatus::decode(status.details())
        .ok()
        .and_then(|s| {
            s.details
                .into_iter()
                .find(|a| a.type_url == STALE_GENERATION_TYPE_URL)
        })
        .and_then(|a| pb::StaleGeneration::decode(&a.value[..]).ok())
        .map(|s| s.stored);
    from_details.or_else(|| {
        status
            .metadata()
            .get(STORED_GENERATION_TRAILER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    })
}

/// Maps the SM host's status to the backend error: ABORTED refusing a generation becomes
/// [`SmError::StaleGeneration`] (`sent` is the generation the request carried), other transient
/// codes are retried soon, the rest are refusals carrying the SM host's message.
pub fn sm_error_of(status: &Status, sent: u64) -> SmError {
    if let Some(stored) = stored_generation(status) {
        return SmError::StaleGeneration { sent, stored };
    }
    let failure = SmFailure::SmHost {
        message: status.message().to_owned(),
        source: Arc::new(status.clone()),
    };
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
            SmError::Unreachable(failure)
        }
        // tonic reports transport failures (refused connection, reset) as Unknown with a
        // transport source.
        Code::Unknown if std::error::Error::source(status).is_some() => {
            SmError::Unreachable(failure)
        }
        _ => SmError::Refused(failure),
    }
}

/// The SM host's status behind an apply error of the remote backend, if it is one.
pub fn sm_host_status(e: &SmError) -> Option<&Status> {
    match e {
        SmError::Unreachable(SmFailure::SmHost { source, .. })
        | SmError::Refused(SmFailure::SmHost { source, .. }) => source.downcast_ref::<Status>(),
        _ => None,
    }
}

/// A fenced SM host on the wire.
pub fn fenced_to_proto(f: &crate::sm::opensm::fenced_host::FencedHost) -> pb::FencedSmHost {
    pb::FencedSmHost {
        host: f.host.clone(),
        since_unix_ms: f.since_unix_ms,
        evidence: f.evidence.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::opensm::ownership::{
        DirectoryError, ForbiddenPort, InventoryError, InventoryFileError, OwnershipRefusal,
    };
    use crate::sm::opensm::region::{OperatorFileProblem, RegionError};
    use crate::sm::opensm::reload::Unsignalled;
    use crate::sm::opensm::FullDefault;
    use crate::sm::opensm::TableOverflow;

    fn request(keys: Vec<pb::KeyMembership>, guids: Vec<&str>) -> pb::NodeMemberships {
        pb::NodeMemberships {
            node_id: "node-1".into(),
            port_guids: guids.into_iter().map(str::to_owned).collect(),
            keys,
            generation: 3,
            grants: Vec::new(),
        }
    }

    fn key(pkey: u32, full: bool, name: &str) -> pb::KeyMembership {
        pb::KeyMembership {
            pkey,
            full,
            name: name.into(),
            port_guids: Vec::new(),
        }
    }

    #[test]
    fn generations_outside_the_bound_are_invalid_arguments() {
        for generation in [0, MAX_GENERATION + 1, u64::MAX - 1, u64::MAX] {
            let mut r = request(vec![key(0x12, true, "")], vec!["0x0000000000000001"]);
            r.generation = generation;
            let e = memberships_from_proto(r).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{generation}");
            assert!(e.message().contains(&generation.to_string()), "{e:?}");
        }
        let mut r = request(vec![key(0x12, true, "")], vec!["0x0000000000000001"]);
        r.generation = MAX_GENERATION;
        assert_eq!(memberships_from_proto(r).unwrap().1, MAX_GENERATION);
    }

    #[test]
    fn a_keys_own_ports_cross_the_wire_and_must_be_the_sets() {
        let (a, b) = ("0x0000000000000001", "0x0000000000000002");
        let mut k = key(0x0a12, true, "t1");
        k.port_guids = vec![b.into()];
        let (m, _) = memberships_from_proto(request(vec![k.clone()], vec![a, b])).unwrap();
        let pkey = PKey::new(0x0a12).unwrap();
        assert_eq!(m.guids_for(pkey), vec![Guid(2)]);
        let back = memberships_to_proto(&m, 3);
        assert_eq!(back.keys[0].port_guids, vec![b.to_owned()]);
        // A key without ports goes to every port of the set (as before the field existed).
        let (all, _) =
            memberships_from_proto(request(vec![key(0x0a12, true, "")], vec![a, b])).unwrap();
        assert_eq!(all.guids_for(pkey), vec![Guid(1), Guid(2)]);
        // A key's port outside the set's ports is refused.
        let err = memberships_from_proto(request(vec![k], vec![a])).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
    }

    #[test]
    fn converts_and_validates() {
        let (m, generation) = memberships_from_proto(request(
            vec![key(0x0a12, true, "t1"), key(0x0b, false, "")],
            vec!["0x0002c903000e0b72"],
        ))
        .unwrap();
        assert_eq!(generation, 3);
        assert_eq!(
            m.keys[&PKey::new(0x0a12).unwrap()].membership,
            Membership::Full
        );
        let back = stored_to_proto(&StoredNode::new(m.clone(), 3));
        assert_eq!(back.port_guids, vec!["0x0002c903000e0b72".to_owned()]);
        assert_eq!(memberships_from_proto(back).unwrap(), (m, 3));
        let one = "0x0000000000000001";
        for (keys, guids) in [
            (vec![key(0x7fff, true, "")], vec![one]),
            (vec![key(0, true, "")], vec![one]),
            (vec![key(1, true, ""), key(1, false, "")], vec![one]),
            (vec![key(1, true, "bad name")], vec![one]),
            (vec![], vec!["0002c903000e0b72"]),
            (vec![], vec!["0x0000000000000000"]),
            (vec![], vec![one, one]),
        ] {
            let err = memberships_from_proto(request(keys, guids)).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
        }
        let mut bad_id = request(vec![], vec![one]);
        bad_id.node_id = "node 1".into();
        assert_eq!(
            memberships_from_proto(bad_id).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn errors_map_to_codes() {
        for (e, code) in [
            (
                OpenSmError::TableFull(TableOverflow {
                    port: None,
                    needed: 5,
                    capacity: 4,
                }),
                Code::ResourceExhausted,
            ),
            (
                OpenSmError::PortHeld {
                    port: crate::domain::Guid(0x10),
                    owner: NodeId::parse("a").unwrap(),
                },
                Code::InvalidArgument,
            ),
            (
                OpenSmError::Task {
                    what: "commit",
                    source: None,
                },
                Code::Unavailable,
            ),
            (
                OpenSmError::OperatorFile(RegionError::OperatorFile(
                    OperatorFileProblem::OpenEntryAtEnd,
                )),
                Code::FailedPrecondition,
            ),
            (
                OpenSmError::Unreachable {
                    written_keys: Some(1),
                    source: Unsignalled::NoPid,
                },
                Code::Unavailable,
            ),
            (
                OpenSmError::Unconfirmed {
                    written_keys: 1,
                    waited_ms: 300,
                },
                Code::Unavailable,
            ),
            (
                OpenSmError::InsecureDefault(FullDefault::Configured),
                Code::FailedPrecondition,
            ),
            (
                OpenSmError::PortForbidden(OwnershipRefusal::Forbidden {
                    port: crate::domain::Guid(1),
                    why: ForbiddenPort::SmHost,
                }),
                Code::PermissionDenied,
            ),
            (
                OpenSmError::PortNotShown(OwnershipRefusal::NotAsked {
                    port: crate::domain::Guid(1),
                }),
                Code::FailedPrecondition,
            ),
            (
                OpenSmError::FabricUnreachable(DirectoryError::Busy {
                    device: "/dev/infiniband/umad0".into(),
                    deadline: std::time::Duration::from_secs(1),
                }),
                Code::Unavailable,
            ),
            (
                OpenSmError::Inventory(InventoryFileError {
                    path: "/etc/inventory.toml".into(),
                    source: InventoryError::Twice {
                        guid: crate::domain::Guid(5),
                        first: "a".into(),
                        second: "b".into(),
                    },
                }),
                Code::FailedPrecondition,
            ),
        ] {
            assert_eq!(status_of(&e).code(), code, "{e:?}");
        }
    }

    #[test]
    fn refusals_map_to_codes() {
        let node = NodeId::parse("node-1").unwrap();
        for (r, code) in [
            (PartitionsRefusal::MembershipsMissing, Code::InvalidArgument),
            (PartitionsRefusal::NoVerifiedCaller, Code::PermissionDenied),
            (
                PartitionsRefusal::UidMayNotWrite { uid: 1000 },
                Code::PermissionDenied,
            ),
            (PartitionsRefusal::NotStored(node), Code::NotFound),
        ] {
            assert_eq!(status_of_refusal(&r).code(), code, "{r:?}");
        }
    }

    #[test]
    fn broker_failures_keep_their_codes_and_messages() {
        let node = NodeId::parse("node-1").unwrap();
        let down = SmError::Unreachable(SmFailure::Broker(std::sync::Arc::new(
            BrokerError::GrantsNotRequired,
        )));
        for (e, code) in [
            (BrokerError::GrantsNotRequired, Code::FailedPrecondition),
            (BrokerError::NodeNotStored(node.clone()), Code::NotFound),
            (
                BrokerError::PortHeld {
                    port: Guid(7),
                    owner: node.clone(),
                },
                Code::InvalidArgument,
            ),
            (
                BrokerError::PortNotOwned {
                    node,
                    port: Guid(7),
                    shown: None,
                },
                Code::PermissionDenied,
            ),
            (BrokerError::Ufm(down), Code::Unavailable),
            (
                BrokerError::StaleGeneration { sent: 2, stored: 5 },
                Code::Aborted,
            ),
        ] {
            let s = status_of_broker(&e);
            assert_eq!(s.code(), code, "{e:?}");
            assert_eq!(s.message(), e.to_string());
            let side = FabricSideError::from(e);
            assert_eq!(status_of_fabric_side(&side).code(), code);
        }
        let stale = status_of_broker(&BrokerError::StaleGeneration { sent: 2, stored: 5 });
        assert_eq!(stored_generation(&stale), Some(5));
    }

    #[test]
    fn statuses_map_to_errors() {
        assert!(sm_error_of(&Status::unavailable("x"), 1).is_transient());
        assert!(sm_error_of(&Status::deadline_exceeded("x"), 1).is_transient());
        let refused = sm_error_of(&Status::resource_exhausted("table full"), 1);
        assert!(matches!(refused, SmError::Refused(_)), "{refused:?}");
        assert_eq!(
            sm_host_status(&refused).map(Status::code),
            Some(Code::ResourceExhausted)
        );
        // An ABORTED without the generation detail stays a transient Unreachable.
        let conflict = sm_error_of(&Status::aborted("conflict"), 3);
        assert!(matches!(conflict, SmError::Unreachable(_)), "{conflict:?}");
        assert_eq!(
            sm_host_status(&conflict).map(Status::code),
            Some(Code::Aborted)
        );
        // The trailer alone is enough.
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(STORED_GENERATION_TRAILER, "12".parse().unwrap());
        let s = Status::with_metadata(Code::Aborted, "stale", md);
        assert!(matches!(
            sm_error_of(&s, 7),
            SmError::StaleGeneration {
                sent: 7,
                stored: 12
            }
        ));
    }

    #[test]
    fn stale_generation_carries_the_stored_generation() {
        use prost::Message;
        let s = status_of(&OpenSmError::StaleGeneration { sent: 4, stored: 9 });
        assert_eq!(s.code(), Code::Aborted);
        let details = pb::ErrorStatus::decode(s.details()).unwrap();
        assert_eq!(details.code, Code::Aborted as i32);
        assert_eq!(details.details[0].type_url, STALE_GENERATION_TYPE_URL);
        let stale = pb::StaleGeneration::decode(&details.details[0].value[..]).unwrap();
        assert_eq!((stale.stored, stale.sent), (9, 4));
        assert_eq!(s.metadata().get(STORED_GENERATION_TRAILER).unwrap(), "9");
        // The node's side reads it back as the typed error.
        assert!(matches!(
            sm_error_of(&s, 4),
            SmError::StaleGeneration { sent: 4, stored: 9 }
        ));
    }
}
