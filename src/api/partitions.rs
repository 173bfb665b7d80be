//! `fabric.sm.v1.Partitions`: served by the SM host's agent (backend `opensm`). Nodes send their
//! complete desired set of memberships; the handlers validate, convert and hand it to
//! [`OpenSmBackend`], which persists it, merges it into the partitions file and forces a sweep
//! before the reply.
//!
//! Every call is authorised by the verified [`Caller`] the call gate attached: a certificate
//! may write and read only the node it maps to ([`NodeMapping`]); an operator certificate may
//! read every node; local privileged callers and a plaintext test rig may do anything. A call
//! that reaches the service without a gate is refused.

use super::audit;
use super::caller::Caller;
use super::node_identity::NodeMapping;
use crate::domain::{
    validate_label, Guid, KeySetting, LabelRules, Membership, NodeMemberships, PKey,
};
use crate::proto::sm as pb;
use crate::proto::sm::partitions_server::{Partitions, PartitionsServer};
use crate::sm::opensm::render::is_safe_name;
use crate::sm::opensm::{OpenSmBackend, OpenSmError, StoredNode};
use std::collections::BTreeMap;
use tonic::{Request, Response, Status};

const NODE_ID_RULES: LabelRules = LabelRules {
    max_len: 128,
    punctuation: "._:-",
};

/// The Partitions service over an OpenSM backend.
#[derive(Clone)]
pub struct PartitionsService {
    backend: OpenSmBackend,
    nodes: NodeMapping,
}

impl PartitionsService {
    /// Wraps the backend; certificates map to nodes by the default rule (a DNS SAN equal to the
    /// node id) until [`PartitionsService::with_node_mapping`].
    pub fn new(backend: OpenSmBackend) -> Self {
        PartitionsService {
            backend,
            nodes: NodeMapping::default(),
        }
    }

    /// Uses this identity -> node mapping.
    pub fn with_node_mapping(self, nodes: NodeMapping) -> Self {
        PartitionsService { nodes, ..self }
    }

    /// The tonic server for this service, ready for `Server::add_service`.
    pub fn into_server(self) -> PartitionsServer<PartitionsService> {
        PartitionsServer::new(self)
    }
}

impl PartitionsService {
    /// Validates, authorises (before anything is written) and applies one node's set.
    async fn set(
        &self,
        caller: Option<&Caller>,
        m: pb::NodeMemberships,
    ) -> Result<Response<pb::SetNodeMembershipsResponse>, Status> {
        if m.node_id.is_empty() && m.keys.is_empty() && m.port_guids.is_empty() {
            return Err(Status::invalid_argument("memberships missing"));
        }
        let (desired, generation) = memberships_from_proto(m)?;
        authorise(caller, &self.nodes, &desired.node_id, true)?;
        match self.backend.set_node(desired, generation).await {
            Ok(out) => Ok(Response::new(pb::SetNodeMembershipsResponse {
                sweeps: out.sweeps,
            })),
            Err(e) => {
                tracing::warn!(error = %e, "memberships not applied");
                Err(status_of(&e))
            }
        }
    }
}

/// Type URL of the [`pb::StaleGeneration`] detail of an ABORTED status.
pub const STALE_GENERATION_TYPE_URL: &str = "type.googleapis.com/fabric.sm.v1.StaleGeneration";
/// Trailer carrying the stored generation (decimal) of an ABORTED status.
pub const STORED_GENERATION_TRAILER: &str = "fabric-stored-generation";

/// The ABORTED status refusing a generation: the stored generation as a status detail
/// (`ErrorStatus` = `google.rpc.Status` with a `StaleGeneration` in `details`) and as the
/// `fabric-stored-generation` trailer.
pub fn stale_generation_status(sent: u64, stored: u64, message: String) -> Status {
    use prost::Message;
    let detail = pb::StaleGeneration { stored, sent };
    let details = pb::ErrorStatus {
        code: tonic::Code::Aborted as i32,
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
        tonic::Code::Aborted,
        message,
        details.encode_to_vec().into(),
        metadata,
    )
}

/// The status a backend error answers with.
pub fn status_of(e: &OpenSmError) -> Status {
    let msg = e.to_string();
    match e {
        OpenSmError::Invalid(_) | OpenSmError::OperatorKey(_) => Status::invalid_argument(msg),
        OpenSmError::TableFull(_) => Status::resource_exhausted(msg),
        OpenSmError::StaleGeneration { sent, stored } => {
            stale_generation_status(*sent, *stored, msg)
        }
        OpenSmError::OperatorFile(_)
        | OpenSmError::Rejected(_)
        | OpenSmError::InsecureDefault(_)
        | OpenSmError::PortNotShown(_) => Status::failed_precondition(msg),
        OpenSmError::PortForbidden(_) => Status::permission_denied(msg),
        OpenSmError::Unreachable(_)
        | OpenSmError::Unconfirmed(_)
        | OpenSmError::Io(_)
        | OpenSmError::Store(_)
        | OpenSmError::FabricUnreachable(_) => Status::unavailable(msg),
        OpenSmError::Composed(_) => Status::internal(msg),
    }
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

/// Converts a request's memberships to the domain, with the node's generation.
pub fn memberships_from_proto(m: pb::NodeMemberships) -> Result<(NodeMemberships, u64), Status> {
    validate_label("node_id", &m.node_id, NODE_ID_RULES)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let port_guids = m
        .port_guids
        .iter()
        .map(|g| parse_guid(g))
        .collect::<Result<Vec<_>, _>>()?;
    let mut keys = BTreeMap::new();
    for k in m.keys {
        let key = PKey::new(k.pkey).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !k.name.is_empty() && !is_safe_name(&k.name) {
            return Err(Status::invalid_argument(format!(
                "key {key}: name {:?} must be 1-31 characters [A-Za-z0-9_.-]",
                k.name
            )));
        }
        let setting = KeySetting {
            membership: if k.full {
                Membership::Full
            } else {
                Membership::Limited
            },
            name: k.name,
        };
        if keys.insert(key, setting).is_some() {
            return Err(Status::invalid_argument(format!("key {key} listed twice")));
        }
    }
    Ok((
        NodeMemberships {
            node_id: m.node_id,
            port_guids,
            keys,
        },
        m.generation,
    ))
}

/// Converts a stored node to its protobuf form (the same encoding the remote backend sends).
pub fn memberships_to_proto(n: &StoredNode) -> pb::NodeMemberships {
    crate::sm::remote::memberships_to_proto(&n.memberships, n.generation)
}

/// Whether `caller` may write (or read) `node`'s memberships: PERMISSION_DENIED otherwise.
pub fn authorise(
    caller: Option<&Caller>,
    nodes: &NodeMapping,
    node: &str,
    write: bool,
) -> Result<(), Status> {
    let verb = if write { "write" } else { "read" };
    match caller {
        None => Err(Status::permission_denied(
            "no verified caller: Partitions is only served behind the call gate",
        )),
        Some(Caller::InsecureTest) => Ok(()),
        Some(Caller::Local { privileged, uid }) => {
            if write && !privileged {
                Err(Status::permission_denied(format!(
                    "unix uid={uid} may not write node memberships"
                )))
            } else {
                Ok(())
            }
        }
        Some(Caller::Cert {
            identity,
            matched,
            operator,
        }) => {
            if nodes.maps(identity, node) || (!write && *operator) {
                Ok(())
            } else {
                Err(Status::permission_denied(format!(
                    "{matched} may not {verb} the memberships of node {node:?}: its certificate \
                     does not map to that node{}",
                    if write || *operator {
                        ""
                    } else {
                        " (only operator_clients may read every node)"
                    }
                )))
            }
        }
    }
}

fn keys_summary(keys: &[pb::KeyMembership]) -> String {
    keys.iter()
        .map(|k| {
            format!(
                "{:#06x}:{}",
                k.pkey,
                if k.full { "full" } else { "limited" }
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[tonic::async_trait]
impl Partitions for PartitionsService {
    #[tracing::instrument(skip_all, fields(node_id))]
    async fn set_node_memberships(
        &self,
        request: Request<pb::SetNodeMembershipsRequest>,
    ) -> Result<Response<pb::SetNodeMembershipsResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let m = request.into_inner().memberships.unwrap_or_default();
        tracing::Span::current().record("node_id", m.node_id.as_str());
        let (node, keys, ports, generation) = (
            m.node_id.clone(),
            keys_summary(&m.keys),
            m.port_guids.len(),
            m.generation,
        );
        let result = self.set(caller.as_ref(), m).await;
        audit::set_node_memberships(
            caller.as_ref(),
            &node,
            &keys,
            ports,
            generation,
            audit::code_of(&result),
        );
        result
    }

    #[tracing::instrument(skip_all)]
    async fn get_node_memberships(
        &self,
        request: Request<pb::GetNodeMembershipsRequest>,
    ) -> Result<Response<pb::NodeMemberships>, Status> {
        let caller = Caller::of(&request).cloned();
        let id = request.into_inner().node_id;
        validate_label("node_id", &id, NODE_ID_RULES)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        authorise(caller.as_ref(), &self.nodes, &id, false)?;
        self.backend
            .node(&id)
            .map(|n| Response::new(memberships_to_proto(&n)))
            .ok_or_else(|| Status::not_found(format!("no memberships stored for node {id:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(keys: Vec<pb::KeyMembership>, guids: Vec<&str>) -> pb::NodeMemberships {
        pb::NodeMemberships {
            node_id: "node-1".into(),
            port_guids: guids.into_iter().map(str::to_owned).collect(),
            keys,
            generation: 3,
        }
    }

    fn key(pkey: u32, full: bool, name: &str) -> pb::KeyMembership {
        pb::KeyMembership {
            pkey,
            full,
            name: name.into(),
        }
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
        let back = memberships_to_proto(&StoredNode {
            memberships: m,
            generation: 3,
        });
        assert_eq!(back.port_guids, vec!["0x0002c903000e0b72".to_owned()]);
        for (keys, guids) in [
            (vec![key(0x7fff, true, "")], vec!["0x0000000000000001"]),
            (vec![key(0, true, "")], vec!["0x0000000000000001"]),
            (
                vec![key(1, true, ""), key(1, false, "")],
                vec!["0x0000000000000001"],
            ),
            (vec![key(1, true, "bad name")], vec!["0x0000000000000001"]),
            (vec![], vec!["0002c903000e0b72"]),
            (vec![], vec!["0x0000000000000000"]),
        ] {
            let err = memberships_from_proto(request(keys, guids)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn errors_map_to_codes() {
        assert_eq!(
            status_of(&OpenSmError::TableFull("x".into())).code(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(
            status_of(&OpenSmError::OperatorFile("x".into())).code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            status_of(&OpenSmError::Unreachable("x".into())).code(),
            tonic::Code::Unavailable
        );
        assert_eq!(
            status_of(&OpenSmError::Unconfirmed("x".into())).code(),
            tonic::Code::Unavailable
        );
        assert_eq!(
            status_of(&OpenSmError::InsecureDefault("x".into())).code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            status_of(&OpenSmError::PortForbidden("x".into())).code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            status_of(&OpenSmError::PortNotShown("x".into())).code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            status_of(&OpenSmError::FabricUnreachable("x".into())).code(),
            tonic::Code::Unavailable
        );
    }

    #[test]
    fn stale_generation_carries_the_stored_generation() {
        use prost::Message;
        let s = status_of(&OpenSmError::StaleGeneration { sent: 4, stored: 9 });
        assert_eq!(s.code(), tonic::Code::Aborted);
        let details = pb::ErrorStatus::decode(s.details()).unwrap();
        assert_eq!(details.code, tonic::Code::Aborted as i32);
        assert_eq!(details.details[0].type_url, STALE_GENERATION_TYPE_URL);
        let stale = pb::StaleGeneration::decode(&details.details[0].value[..]).unwrap();
        assert_eq!((stale.stored, stale.sent), (9, 4));
        assert_eq!(s.metadata().get(STORED_GENERATION_TRAILER).unwrap(), "9");
        // The node's side reads it back as the typed error.
        assert_eq!(
            crate::sm::remote::sm_error_of(&s, 4),
            crate::sm::SmError::StaleGeneration { sent: 4, stored: 9 }
        );
    }
}
