//! Protobuf <-> domain conversions and the single `AgentError` -> `tonic::Status` mapping.

use super::page_token;
use crate::agent::{
    AgentError, AttachRequest, CursorError, ListFilter, NodeView, Refusal, SmStatus,
};
use crate::domain::{
    Attachment, AttachmentPort, AttachmentState, Condition, DomainError, Event, EventKind,
    Evidence, Guid, InstanceId, LinkLayer, Membership, Partition, PortInfo, PortName, PortState,
    SmState,
};
use crate::proto::agent as pb;
use std::time::Duration;
use tonic::{Code, Status};

/// Trailer naming which refusal or failure a status carries, as a stable upper-case name
/// (e.g. `TABLE_FULL`), so clients can act on it without reading the message.
pub const ERROR_REASON_TRAILER: &str = "fabric-error-reason";

/// The one place `fabric.agent.v1` errors become gRPC statuses: the code, the error's text as
/// the message, and its [`reason`] in the [`ERROR_REASON_TRAILER`] trailer.
pub fn status(e: AgentError) -> Status {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(
        ERROR_REASON_TRAILER,
        tonic::metadata::MetadataValue::from_static(reason(&e)),
    );
    Status::with_metadata(code(&e), e.to_string(), metadata)
}

/// The stable name of an agent error, sent in the [`ERROR_REASON_TRAILER`] trailer.
pub fn reason(e: &AgentError) -> &'static str {
    match e {
        AgentError::Invalid(_) => "INVALID",
        AgentError::Refused(r) => match r {
            Refusal::WrongFabric { .. } => "WRONG_FABRIC",
            Refusal::InstanceReleased { .. } => "INSTANCE_RELEASED",
            Refusal::InstanceInOtherPartition { .. } => "INSTANCE_IN_OTHER_PARTITION",
            Refusal::InstanceKeyDiffers { .. } => "INSTANCE_KEY_DIFFERS",
            Refusal::InstanceMembershipDiffers { .. } => "INSTANCE_MEMBERSHIP_DIFFERS",
            Refusal::PartitionKeyDiffers { .. } => "PARTITION_KEY_DIFFERS",
            Refusal::MembershipConflict { .. } => "MEMBERSHIP_CONFLICT",
            Refusal::KeyHeldByOtherPartition { .. } => "KEY_HELD_BY_OTHER_PARTITION",
            Refusal::TableFull { .. } => "TABLE_FULL",
            Refusal::UnknownPort { .. } => "UNKNOWN_PORT",
            Refusal::NotFabricPort { .. } => "NOT_FABRIC_PORT",
            Refusal::PortNamedTwice { .. } => "PORT_NAMED_TWICE",
            Refusal::TooManyPorts { .. } => "TOO_MANY_PORTS",
            Refusal::PortHeldByOtherPartition { .. } => "PORT_HELD_BY_OTHER_PARTITION",
            Refusal::InstancePortsDiffer { .. } => "INSTANCE_PORTS_DIFFER",
            Refusal::GrantRequired => "GRANT_REQUIRED",
            Refusal::Grant(_) => "GRANT_REFUSED",
        },
        AgentError::AttachmentNotFound(_) => "ATTACHMENT_NOT_FOUND",
        AgentError::PortsNotRead => "PORTS_NOT_READ",
        AgentError::Observe(_) => "PORTS_UNREADABLE",
        AgentError::Stopping { .. } => "AGENT_STOPPING",
        AgentError::Cursor(c) => match c {
            CursorError::OtherEpoch { .. } => "LOG_OTHER_EPOCH",
            CursorError::BeyondNewest { .. } => "LOG_BEYOND_NEWEST",
            CursorError::Pruned { .. } => "LOG_PRUNED",
        },
        AgentError::StreamEnded { .. } => "STREAM_ENDED",
        AgentError::Store(_) => "STORE_FAILED",
    }
}

/// The gRPC code each agent error answers with.
pub fn code(e: &AgentError) -> Code {
    match e {
        AgentError::Invalid(_) => Code::InvalidArgument,
        AgentError::Refused(r) => refusal_code(r),
        AgentError::AttachmentNotFound(_) => Code::NotFound,
        AgentError::PortsNotRead
        | AgentError::Observe(_)
        | AgentError::Stopping { .. }
        | AgentError::StreamEnded { .. } => Code::Unavailable,
        AgentError::Cursor(_) => Code::OutOfRange,
        AgentError::Store(_) => Code::Internal,
    }
}

fn refusal_code(r: &Refusal) -> Code {
    match r {
        Refusal::WrongFabric { .. }
        | Refusal::InstanceReleased { .. }
        | Refusal::InstanceInOtherPartition { .. }
        | Refusal::MembershipConflict { .. }
        | Refusal::KeyHeldByOtherPartition { .. }
        | Refusal::UnknownPort { .. }
        | Refusal::NotFabricPort { .. }
        | Refusal::PortHeldByOtherPartition { .. } => Code::FailedPrecondition,
        Refusal::PortNamedTwice { .. } | Refusal::TooManyPorts { .. } => Code::InvalidArgument,
        Refusal::InstancePortsDiffer { .. }
        | Refusal::InstanceKeyDiffers { .. }
        | Refusal::InstanceMembershipDiffers { .. }
        | Refusal::PartitionKeyDiffers { .. } => Code::AlreadyExists,
        Refusal::TableFull { .. } => Code::ResourceExhausted,
        Refusal::GrantRequired | Refusal::Grant(_) => Code::FailedPrecondition,
    }
}

fn invalid(field: &'static str, reason: &str) -> AgentError {
    AgentError::Invalid(DomainError::invalid(field, reason))
}

/// Validates an attach request into the domain form plus its wait.
pub fn attach_request(
    r: pb::AttachPartitionRequest,
) -> Result<(AttachRequest, Option<Duration>), AgentError> {
    let p = r
        .partition
        .ok_or_else(|| invalid("partition", "required"))?;
    let partition = Partition::new(&p.id, &p.name, &p.workspace, &p.account, &p.fabric, p.pkey)?;
    let membership = match pb::Membership::try_from(r.membership) {
        Ok(pb::Membership::Unspecified | pb::Membership::Full) => Membership::Full,
        Ok(pb::Membership::Limited) => Membership::Limited,
        Err(_) => return Err(invalid("membership", "unknown value")),
    };
    if r.ports.len() > MAX_NAMED_PORTS {
        return Err(invalid("ports", "at most 64 ports"));
    }
    let ports = r
        .ports
        .iter()
        .map(port_name)
        .collect::<Result<Vec<_>, _>>()?;
    let grant = r
        .grant
        .as_ref()
        .map(crate::api::grant_v1::signed_grant_from_proto)
        .transpose()
        .map_err(|e| invalid("grant", &e.to_string()))?;
    Ok((
        AttachRequest {
            instance_id: InstanceId::parse(&r.instance_id)?,
            partition,
            membership,
            grant,
            ports,
        },
        wait(r.wait_ms)?,
    ))
}

/// Most ports one attach may name.
const MAX_NAMED_PORTS: usize = 64;

/// A port name: a GUID alone, or a device with a port number 1-255.
fn port_name(p: &pb::PortName) -> Result<PortName, AgentError> {
    match (p.device.is_empty(), p.port_guid.is_empty()) {
        (true, false) if p.port_number == 0 => {
            let g: Guid = p
                .port_guid
                .parse()
                .map_err(|_| invalid("ports", &format!("{:?} is not a port GUID", p.port_guid)))?;
            if g.0 == 0 {
                return Err(invalid("ports", "port GUID 0 is not a port"));
            }
            Ok(PortName::Guid(g))
        }
        (false, true) => {
            let port_number = u8::try_from(p.port_number)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    invalid(
                        "ports",
                        &format!("{}: port number {} is not 1-255", p.device, p.port_number),
                    )
                })?;
            if p.device.len() > 64 || !p.device.bytes().all(|b| b.is_ascii_graphic() && b != b'/') {
                return Err(invalid(
                    "ports",
                    &format!("{:?} is not a device name", p.device),
                ));
            }
            Ok(PortName::Device {
                device: p.device.clone(),
                port_number,
            })
        }
        _ => Err(invalid(
            "ports",
            "name a port by port_guid alone, or by device with port_number",
        )),
    }
}

fn attachment_port_to_pb(p: &AttachmentPort) -> pb::AttachmentPort {
    pb::AttachmentPort {
        device: p.device.clone(),
        port_number: u32::from(p.port_number),
        port_guid: p.port_guid.to_string(),
    }
}

/// Validates a wait in milliseconds (at most 600,000).
pub fn wait(ms: Option<u32>) -> Result<Option<Duration>, AgentError> {
    match ms {
        Some(ms) if Duration::from_millis(u64::from(ms)) > crate::agent::MAX_WAIT => {
            Err(invalid("wait_ms", "at most 600000"))
        }
        Some(ms) => Ok(Some(Duration::from_millis(u64::from(ms)))),
        None => Ok(None),
    }
}

/// Validates an instance id field.
pub fn instance_id(s: &str) -> Result<String, AgentError> {
    Ok(InstanceId::parse(s)?.as_str().to_owned())
}

/// A validated ListAttachments request: filters, where the page starts, its size.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// The filters.
    pub filter: ListFilter,
    /// Start after this instance id (from the page token).
    pub after: Option<String>,
    /// Attachments per page.
    pub size: usize,
}

/// Validates a list request: filters, `page_size` (0 = `default`, at most `max`) and
/// `page_token` (one this agent issued for the same filters).
pub fn list_page(
    mut r: pb::ListAttachmentsRequest,
    default: u32,
    max: u32,
) -> Result<ListPage, AgentError> {
    let size = match r.page_size {
        0 => default,
        n if n > max => {
            return Err(AgentError::Invalid(DomainError::invalid(
                "page_size",
                format!("at most {max}"),
            )))
        }
        n => n,
    };
    let token = std::mem::take(&mut r.page_token);
    let filter = list_filter(r)?;
    let after = if token.is_empty() {
        None
    } else {
        Some(page_token::decode(&token, &filter).map_err(|e| invalid("page_token", e.reason()))?)
    };
    Ok(ListPage {
        filter,
        after,
        size: size as usize,
    })
}

/// Validates list filters.
pub fn list_filter(r: pb::ListAttachmentsRequest) -> Result<ListFilter, AgentError> {
    let state = r
        .state
        .map(|s| {
            pb::AttachmentState::try_from(s)
                .ok()
                .and_then(state_from_pb)
                .ok_or_else(|| invalid("state", "unknown attachment state"))
        })
        .transpose()?;
    if let Some(id) = &r.instance_id {
        instance_id(id)?;
    }
    if let Some(p) = &r.partition_id {
        crate::domain::PartitionId::parse(p)?;
    }
    Ok(ListFilter {
        state,
        partition_id: r.partition_id,
        instance_id: r.instance_id,
    })
}

fn state_from_pb(s: pb::AttachmentState) -> Option<AttachmentState> {
    Some(match s {
        pb::AttachmentState::Unspecified => return None,
        pb::AttachmentState::Pending => AttachmentState::Pending,
        pb::AttachmentState::Programming => AttachmentState::Programming,
        pb::AttachmentState::Active => AttachmentState::Active,
        pb::AttachmentState::Drifted => AttachmentState::Drifted,
        pb::AttachmentState::Releasing => AttachmentState::Releasing,
        pb::AttachmentState::Released => AttachmentState::Released,
        pb::AttachmentState::Failed => AttachmentState::Failed,
    })
}

/// A domain state as the protobuf enum.
pub fn state_to_pb(s: AttachmentState) -> pb::AttachmentState {
    match s {
        AttachmentState::Pending => pb::AttachmentState::Pending,
        AttachmentState::Programming => pb::AttachmentState::Programming,
        AttachmentState::Active => pb::AttachmentState::Active,
        AttachmentState::Drifted => pb::AttachmentState::Drifted,
        AttachmentState::Releasing => pb::AttachmentState::Releasing,
        AttachmentState::Released => pb::AttachmentState::Released,
        AttachmentState::Failed => pb::AttachmentState::Failed,
    }
}

fn timestamp(unix_ns: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: unix_ns.div_euclid(1_000_000_000),
        // rem_euclid keeps it in 0..1e9, which always fits.
        nanos: i32::try_from(unix_ns.rem_euclid(1_000_000_000)).unwrap_or(0),
    }
}

fn membership_to_pb(m: Membership) -> pb::Membership {
    match m {
        Membership::Full => pb::Membership::Full,
        Membership::Limited => pb::Membership::Limited,
    }
}

/// A partition as protobuf.
pub fn partition_to_pb(p: &Partition) -> pb::Partition {
    pb::Partition {
        id: p.id.as_str().to_owned(),
        name: p.name.clone(),
        workspace: p.workspace.clone(),
        account: p.account.clone(),
        fabric: p.fabric.as_str().to_owned(),
        pkey: u32::from(p.pkey.base()),
    }
}

/// An attachment as protobuf.
pub fn attachment_to_pb(a: &Attachment) -> pb::Attachment {
    pb::Attachment {
        instance_id: a.instance_id.as_str().to_owned(),
        partition: Some(partition_to_pb(&a.partition)),
        membership: membership_to_pb(a.membership) as i32,
        state: state_to_pb(a.state) as i32,
        reason: a.reason.clone(),
        created: Some(timestamp(a.created_unix_ns)),
        updated: Some(timestamp(a.updated_unix_ns)),
        pkey_value: u32::from(a.pkey_value().0),
        ports: a.ports.iter().map(attachment_port_to_pb).collect(),
        named_ports: a.named_ports,
        // Only the current state's evidence (a record keeps it for ACTIVE and RELEASED).
        evidence: matches!(a.state, AttachmentState::Active | AttachmentState::Released)
            .then(|| a.evidence.as_ref().map(evidence_to_pb))
            .flatten(),
    }
}

fn port_state_to_pb(s: PortState) -> pb::PortState {
    match s {
        PortState::Unknown => pb::PortState::Unspecified,
        PortState::Down => pb::PortState::Down,
        PortState::Init => pb::PortState::Init,
        PortState::Armed => pb::PortState::Armed,
        PortState::Active => pb::PortState::Active,
        PortState::ActiveDefer => pb::PortState::ActiveDefer,
    }
}

/// A port as protobuf.
pub fn port_to_pb(p: &PortInfo) -> pb::Port {
    pb::Port {
        device: p.device.clone(),
        port_number: u32::from(p.port_number),
        port_guid: p.port_guid.to_string(),
        node_guid: p.node_guid.to_string(),
        lid: u32::from(p.lid),
        sm_lid: u32::from(p.sm_lid),
        state: port_state_to_pb(p.state) as i32,
        link_layer: match p.link_layer {
            LinkLayer::Unknown => pb::LinkLayer::Unspecified,
            LinkLayer::Infiniband => pb::LinkLayer::Infiniband,
            LinkLayer::Ethernet => pb::LinkLayer::Ethernet,
        } as i32,
        fabric_port: p.fabric_port,
        pkeys: p.entries().map(|k| u32::from(k.0)).collect(),
        // A table holds at most 65536 entries: saturating never happens.
        pkey_table_size: u32::try_from(p.pkeys.len()).unwrap_or(u32::MAX),
    }
}

/// The subnet manager's state on the wire; `reachable` speaks for events recorded before the
/// state was.
fn sm_state_to_pb(state: SmState, reachable: bool) -> pb::SubnetManagerState {
    match state {
        SmState::Reachable => pb::SubnetManagerState::Reachable,
        SmState::Refused => pb::SubnetManagerState::Refused,
        SmState::Unreachable => pb::SubnetManagerState::Unreachable,
        SmState::Unknown if reachable => pb::SubnetManagerState::Reachable,
        SmState::Unknown => pb::SubnetManagerState::Unspecified,
    }
}

fn sm_to_pb(s: &SmStatus) -> pb::SubnetManagerStatus {
    pb::SubnetManagerStatus {
        backend: s.backend.clone(),
        reachable: s.reachable,
        state: sm_state_to_pb(s.state, s.reachable) as i32,
        apply_in_flight_since: s.in_flight.as_ref().map(|f| timestamp(f.since_unix_ns)),
        apply_in_flight_generation: s.in_flight.as_ref().map_or(0, |f| f.generation),
        last_error: s.last_error.clone(),
        last_apply: (s.last_apply_unix_ns > 0).then(|| timestamp(s.last_apply_unix_ns)),
        applies: s.applies,
        generation: s.generation,
        in_doubt_pkeys: s.in_doubt.iter().map(|k| u32::from(k.base())).collect(),
        in_doubt_pkey_values: s.in_doubt_values.iter().map(|v| u32::from(v.0)).collect(),
        sm_host: None,
        sm_hosts: s
            .sm_hosts
            .as_ref()
            .map(super::convert_sm_hosts::sm_hosts_to_pb),
    }
}

fn condition_to_pb(c: &Condition) -> pb::Condition {
    pb::Condition {
        kind: c.kind.name().to_owned(),
        detail: c.detail.clone(),
    }
}

fn evidence_to_pb(e: &Evidence) -> pb::Evidence {
    pb::Evidence {
        sm_generation: e.sm_generation,
        sm_acknowledged: Some(timestamp(e.sm_ack_unix_ns)),
        read_started: Some(timestamp(e.read_unix_ns)),
        ports: e
            .ports
            .iter()
            .map(|p| pb::PortReading {
                device: p.device.clone(),
                port_number: u32::from(p.port_number),
                port_guid: p.port_guid.to_string(),
                state: port_state_to_pb(p.state) as i32,
            })
            .collect(),
        acknowledged_by: e.acknowledged_by.clone(),
    }
}

/// The node view as protobuf.
pub fn node_to_pb(n: NodeView) -> pb::GetNodeResponse {
    pb::GetNodeResponse {
        node_id: n.node_id,
        fabric: n.fabric,
        ports: n.ports.iter().map(port_to_pb).collect(),
        subnet_manager: Some(sm_to_pb(&n.sm)),
        observer: n.observer,
        observer_reason: n.observer_reason,
        attachment_counts: n
            .counts
            .iter()
            .map(|(s, c)| (s.name().to_owned(), *c))
            .collect(),
        last_event_seq: n.last_event_seq,
        log_epoch: n.log_epoch,
        first_event_seq: n.first_event_seq,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        // Saturates: a capacity beyond u32 is as good as unlimited.
        pkey_capacity: u32::try_from(n.pkey_capacity).unwrap_or(u32::MAX),
        conditions: n.conditions.iter().map(condition_to_pb).collect(),
    }
}

/// The SM host's sync state as `GetNode` shows it (`fabric.agent.v1.SmHostStatus`).
pub fn sync_status_to_pb(s: &crate::sm::opensm::sync::SyncStatus) -> pb::SmHostStatus {
    pb::SmHostStatus {
        // An OpenSM seen dead is "not running", never the log's last word.
        role: match &s.role_source {
            Some(crate::sm::opensm::sminfo::RoleSource::NotRunning { .. }) => "not running",
            _ => s.role.unwrap_or_default().as_str(),
        }
        .to_owned(),
        role_source: s.role_source.as_ref().map_or("", |r| r.as_str()).to_owned(),
        role_fallback_reason: s
            .role_source
            .as_ref()
            .and_then(|r| r.reason())
            .unwrap_or_default()
            .to_owned(),
        caught_up: s.caught_up,
        catching_up_with: s.waiting_for.clone(),
        held_back_nodes: s.gated_nodes.clone(),
        disagreeing_nodes: s.disagreements.clone(),
        peers: s
            .peers
            .iter()
            .map(|p| pb::SmPeerStatus {
                endpoint: p.name.clone(),
                host: p.host.clone(),
                last_answer: p.last_answer.map(prost_types::Timestamp::from),
                last_error: p.last_error.clone().unwrap_or_default(),
                caught_up: p.caught_up,
                last_generation: p.generations.values().copied().max().unwrap_or(0),
                nodes: u32::try_from(p.generations.len()).unwrap_or(u32::MAX),
            })
            .collect(),
    }
}

/// An event as protobuf, with the log epoch its seq belongs to.
pub fn event_to_pb(e: &Event, node_id: &str, log_epoch: &str) -> pb::Event {
    use pb::event::Kind;
    let kind = match &e.kind {
        EventKind::AttachmentChanged {
            instance_id,
            partition_id,
            pkey_value,
            from,
            to,
            reason,
            evidence,
            ports,
        } => Kind::AttachmentChanged(pb::AttachmentChanged {
            instance_id: instance_id.clone(),
            partition_id: partition_id.clone(),
            pkey_value: u32::from(pkey_value.0),
            from: from.map_or(pb::AttachmentState::Unspecified, state_to_pb) as i32,
            to: state_to_pb(*to) as i32,
            reason: reason.clone(),
            evidence: evidence.as_ref().map(evidence_to_pb),
            ports: ports.iter().map(attachment_port_to_pb).collect(),
        }),
        EventKind::PKeyTableChanged {
            device,
            port_number,
            port_guid,
            added,
            removed,
        } => Kind::PkeyTableChanged(pb::PKeyTableChanged {
            device: device.clone(),
            port_number: u32::from(*port_number),
            port_guid: port_guid.to_string(),
            added: added.iter().map(|k| u32::from(k.0)).collect(),
            removed: removed.iter().map(|k| u32::from(k.0)).collect(),
        }),
        EventKind::PortStateChanged {
            device,
            port_number,
            port_guid,
            from,
            to,
        } => Kind::PortStateChanged(pb::PortStateChanged {
            device: device.clone(),
            port_number: u32::from(*port_number),
            port_guid: port_guid.to_string(),
            from: port_state_to_pb(*from) as i32,
            to: port_state_to_pb(*to) as i32,
        }),
        EventKind::SubnetManagerChanged {
            backend,
            reachable,
            error,
            state,
        } => Kind::SubnetManagerChanged(pb::SubnetManagerChanged {
            backend: backend.clone(),
            reachable: *reachable,
            error: error.clone(),
            state: sm_state_to_pb(*state, *reachable) as i32,
        }),
        EventKind::ForeignPKey {
            device,
            port_number,
            port_guid,
            pkey_value,
        } => Kind::ForeignPkey(pb::ForeignPKey {
            device: device.clone(),
            port_number: u32::from(*port_number),
            port_guid: port_guid.to_string(),
            pkey_value: u32::from(pkey_value.0),
        }),
        EventKind::ConditionChanged {
            condition,
            active,
            detail,
        } => Kind::ConditionChanged(pb::ConditionChanged {
            condition: Some(pb::Condition {
                kind: condition.name().to_owned(),
                detail: detail.clone(),
            }),
            active: *active,
        }),
    };
    pb::Event {
        seq: e.seq,
        time: Some(timestamp(e.time_unix_ns)),
        node_id: node_id.to_owned(),
        log_epoch: log_epoch.to_owned(),
        kind: Some(kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_one_code_and_reason_each() {
        let instance = InstanceId::parse("i1").unwrap();
        let state = AttachmentState::Released;
        for (e, code, reason) in [
            (
                AgentError::from(Refusal::TableFull {
                    capacity: 2,
                    needed: 3,
                }),
                Code::ResourceExhausted,
                "TABLE_FULL",
            ),
            (
                Refusal::InstanceReleased {
                    instance: instance.clone(),
                    state,
                }
                .into(),
                Code::FailedPrecondition,
                "INSTANCE_RELEASED",
            ),
            (
                AgentError::AttachmentNotFound("i1".into()),
                Code::NotFound,
                "ATTACHMENT_NOT_FOUND",
            ),
            (
                AgentError::Stopping {
                    instance,
                    state,
                    reason: String::new(),
                },
                Code::Unavailable,
                "AGENT_STOPPING",
            ),
            (
                AgentError::PortsNotRead,
                Code::Unavailable,
                "PORTS_NOT_READ",
            ),
        ] {
            let text = e.to_string();
            let s = status(e);
            assert_eq!(s.code(), code, "{text}");
            assert_eq!(s.message(), text);
            assert_eq!(s.metadata().get(ERROR_REASON_TRAILER).unwrap(), reason);
        }
    }

    fn request(pkey: u32) -> pb::AttachPartitionRequest {
        pb::AttachPartitionRequest {
            partition: Some(pb::Partition {
                id: "ibpart_a".into(),
                name: "a".into(),
                workspace: "ws".into(),
                account: "acct".into(),
                fabric: "fab1".into(),
                pkey,
            }),
            instance_id: "i-1".into(),
            membership: 0,
            wait_ms: None,
            grant: None,
            ports: Vec::new(),
        }
    }

    #[test]
    fn attach_validation_maps_to_invalid_argument() {
        for bad in [0, 0x7FFF, 0x8001, 0x10000] {
            let e = attach_request(request(bad)).unwrap_err();
            assert_eq!(status(e).code(), Code::InvalidArgument, "pkey {bad:#x}");
        }
        let (r, _) = attach_request(request(0x12)).unwrap();
        assert_eq!(r.membership, Membership::Full);
        let mut too_long = request(0x12);
        too_long.wait_ms = Some(600_001);
        assert_eq!(
            status(attach_request(too_long).unwrap_err()).code(),
            Code::InvalidArgument
        );
        let mut no_partition = request(0x12);
        no_partition.partition = None;
        assert_eq!(
            status(attach_request(no_partition).unwrap_err()).code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn page_requests_validate_size_and_token() {
        let req = |size: u32, token: &str| pb::ListAttachmentsRequest {
            page_size: size,
            page_token: token.into(),
            ..Default::default()
        };
        let p = list_page(req(0, ""), 500, 5000).unwrap();
        assert_eq!((p.size, p.after), (500, None));
        assert_eq!(list_page(req(7, ""), 500, 5000).unwrap().size, 7);
        let e = list_page(req(5001, ""), 500, 5000).unwrap_err();
        assert_eq!(status(e).code(), Code::InvalidArgument);
        let token = page_token::encode("i-42", &ListFilter::default());
        let p = list_page(req(0, &token), 500, 5000).unwrap();
        assert_eq!(p.after.as_deref(), Some("i-42"));
        for bad in [
            "junk",
            "p1.zz.0000000000000000",
            "p1.692d3.0000000000000000",
            "p2.692d3432.0000000000000000",
            &format!("{token}.x"),
            // A valid id, but the fingerprint of other filters.
            &page_token::encode(
                "i-42",
                &ListFilter {
                    state: Some(AttachmentState::Active),
                    ..Default::default()
                },
            ),
        ] {
            let e = list_page(req(0, bad), 500, 5000).unwrap_err();
            let s = status(e);
            assert_eq!(s.code(), Code::InvalidArgument, "{bad}");
            assert!(s.message().contains("page_token"), "{}", s.message());
        }
    }

    #[test]
    fn an_attachment_shows_the_evidence_of_its_current_active_or_released_state_only() {
        let mut a = Attachment {
            grant: None,
            instance_id: InstanceId::parse("i1").unwrap(),
            partition: Partition::new("ibpart_a", "a", "ws", "acct", "fab1", 0x10).unwrap(),
            membership: Membership::Full,
            state: AttachmentState::Active,
            reason: String::new(),
            created_unix_ns: 1,
            updated_unix_ns: 2,
            ports: Vec::new(),
            named_ports: false,
            restored: None,
            evidence: Some(Evidence {
                sm_generation: 4,
                sm_ack_unix_ns: 10,
                read_unix_ns: 11,
                ports: Vec::new(),
                acknowledged_by: vec!["sm1".into(), "sm2".into()],
            }),
        };
        let e = attachment_to_pb(&a)
            .evidence
            .expect("ACTIVE shows its evidence");
        assert_eq!(
            (e.sm_generation, e.acknowledged_by),
            (4, vec!["sm1".into(), "sm2".into()])
        );
        // A record that kept stale evidence into another state shows none.
        a.state = AttachmentState::Drifted;
        assert!(attachment_to_pb(&a).evidence.is_none());
        a.state = AttachmentState::Released;
        assert!(attachment_to_pb(&a).evidence.is_some());
    }

    #[test]
    fn timestamps_split_nanoseconds() {
        let t = timestamp(1_500_000_000_123);
        assert_eq!((t.seconds, t.nanos), (1500, 123));
    }
}
