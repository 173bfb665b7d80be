//! Why the agent refused or could not carry out a command: typed values built from the domain.
//! The wire codes are chosen in one place per service (`api::agent_v1::convert` for `fabric.agent.v1`).

use crate::domain::{
    AttachmentState, DomainError, FabricName, GrantError, InstanceId, Membership, PKey, PartitionId,
};
use crate::observe::ObserveError;
use crate::store::{LogEpoch, StoreError};
use thiserror::Error;

/// Why the agent refused or could not carry out a command.
#[derive(Debug, Error)]
pub enum AgentError {
    /// Malformed input.
    #[error(transparent)]
    Invalid(#[from] DomainError),
    /// The attach conflicts with the node's fabric, its attachments or its ports' capacity.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// No attachment is stored for this instance.
    #[error("no attachment for instance {0:?}")]
    AttachmentNotFound(String),
    /// The ports have not been read yet, so the node's key capacity is unknown.
    #[error("ports not read yet")]
    PortsNotRead,
    /// The observer could not read the ports.
    #[error(transparent)]
    Observe(#[from] ObserveError),
    /// The agent began to stop while the call waited; the request is stored and carries on
    /// when the agent is back.
    #[error(
        "agent stopping: instance {instance} is {state}{}; the request is stored and carries on when the agent is back",
        if reason.is_empty() { String::new() } else { format!(" ({reason})") }
    )]
    Stopping {
        /// The instance waited on.
        instance: InstanceId,
        /// Its state when the agent began to stop.
        state: AttachmentState,
        /// Its reason then (may be empty).
        reason: String,
    },
    /// A watch asked for events the log does not hold.
    #[error(transparent)]
    Cursor(#[from] CursorError),
    /// A watch stream ended before the client closed it.
    #[error("{why}; resume with after_seq = {sent} and log_epoch = {epoch}")]
    StreamEnded {
        /// Why it ended.
        why: StreamEnd,
        /// The last sequence number sent.
        sent: u64,
        /// The log's epoch.
        epoch: LogEpoch,
    },
    /// The store failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An attach the node's rules refuse. Checked before anything is persisted, so a refusal
/// changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// This node requires a grant with every attach (`[grants] require = true`) and the request
    /// carries none.
    #[error("this node requires the control plane's grant with every attach ([grants] require = true); the request carries none")]
    GrantRequired,
    /// The attach's grant does not match the request or this node, or does not verify.
    #[error("grant refused: {0}")]
    Grant(#[from] GrantError),
    /// The partition is on another fabric than this node.
    #[error("partition {} is on fabric {:?} but this node is on fabric {:?}", .partition.as_str(), .partition_fabric.as_str(), .node.as_str())]
    WrongFabric {
        /// The partition.
        partition: PartitionId,
        /// The partition's fabric.
        partition_fabric: FabricName,
        /// This node's fabric.
        node: FabricName,
    },
    /// The instance was released; a terminated instance is never attached again.
    #[error("instance {instance} was released ({state}); a terminated instance cannot be attached again")]
    InstanceReleased {
        /// The instance.
        instance: InstanceId,
        /// Its state (releasing or released).
        state: AttachmentState,
    },
    /// The instance is attached to another partition; an instance stays in its partition.
    #[error("instance {instance} is attached to partition {}; an instance stays in its partition for its whole life", .partition.as_str())]
    InstanceInOtherPartition {
        /// The instance.
        instance: InstanceId,
        /// The partition it is attached to.
        partition: PartitionId,
    },
    /// The instance is attached to this partition with another P_Key.
    #[error("instance {instance} is attached to partition {} with P_Key {attached}, not {requested}", .partition.as_str())]
    InstanceKeyDiffers {
        /// The instance.
        instance: InstanceId,
        /// The partition.
        partition: PartitionId,
        /// The key it is attached with.
        attached: PKey,
        /// The key asked for.
        requested: PKey,
    },
    /// The instance is attached to this partition with another membership.
    #[error("instance {instance} is attached to partition {} as a {attached} member, not {requested}", .partition.as_str())]
    InstanceMembershipDiffers {
        /// The instance.
        instance: InstanceId,
        /// The partition.
        partition: PartitionId,
        /// Its membership.
        attached: Membership,
        /// The membership asked for.
        requested: Membership,
    },
    /// The partition is attached on this node with another P_Key.
    #[error("partition {} is attached on this node with P_Key {attached}, not {requested}", .partition.as_str())]
    PartitionKeyDiffers {
        /// The partition.
        partition: PartitionId,
        /// The key it is attached with.
        attached: PKey,
        /// The key asked for.
        requested: PKey,
    },
    /// Another instance holds this partition's key with the other membership; a port holds
    /// one membership per key.
    #[error(
        "instance {holder} on this node is a {held} member of partition {}: a port holds one \
         membership per P_Key, so {instance} cannot be attached as a {requested} member here",
        .partition.as_str()
    )]
    MembershipConflict {
        /// The instance holding the key.
        holder: InstanceId,
        /// Its membership.
        held: Membership,
        /// The partition.
        partition: PartitionId,
        /// The instance asking.
        instance: InstanceId,
        /// The membership asked for.
        requested: Membership,
    },
    /// Another partition on this node uses this P_Key.
    #[error("P_Key {pkey} is in use on this node by partition {} ({state})", .partition.as_str())]
    KeyHeldByOtherPartition {
        /// The key.
        pkey: PKey,
        /// The partition using it.
        partition: PartitionId,
        /// That attachment's state.
        state: AttachmentState,
    },
    /// A port the request names is not on this node.
    #[error("port {port} is not on this node")]
    UnknownPort {
        /// The port as named.
        port: String,
    },
    /// A port the request names is not one of the node's fabric ports.
    #[error("port {port} is not a fabric port of this node (see [ports] in the configuration)")]
    NotFabricPort {
        /// The port as named.
        port: String,
    },
    /// The request names one port twice (perhaps once by device and once by GUID).
    #[error("port {port} is named twice")]
    PortNamedTwice {
        /// The port.
        port: String,
    },
    /// The request names more ports than the node has fabric ports.
    #[error("{named} ports named, but this node has {fabric} fabric ports")]
    TooManyPorts {
        /// Ports named.
        named: usize,
        /// Fabric ports of the node.
        fabric: usize,
    },
    /// A named port is covered by a live attachment of another partition: a port carries one
    /// partition's key at a time, and a new tenant waits for the previous one's RELEASED.
    #[error(
        "port {port} is covered by instance {holder} of partition {} ({state}); a port carries \
         one partition at a time: attach again once {holder} is RELEASED",
        .partition.as_str()
    )]
    PortHeldByOtherPartition {
        /// The first overlapping port.
        port: String,
        /// The instance covering it.
        holder: InstanceId,
        /// Its partition.
        partition: PartitionId,
        /// Its state.
        state: AttachmentState,
    },
    /// The instance is attached with other ports.
    #[error("instance {instance} is attached on ports [{attached}], not [{requested}]")]
    InstancePortsDiffer {
        /// The instance.
        instance: InstanceId,
        /// Its ports.
        attached: String,
        /// The ports asked for.
        requested: String,
    },
    /// The ports cannot hold another key.
    #[error(
        "this node's fabric ports hold {capacity} partition keys besides the default partition, \
         and {needed} would be needed"
    )]
    TableFull {
        /// Tenant keys the ports hold (besides the default partition).
        capacity: usize,
        /// Keys needed with this attach.
        needed: usize,
    },
}

/// A watch cursor the event log cannot serve: the client must resynchronise.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CursorError {
    /// The client's log epoch is not this log's (the state directory was wiped or replaced).
    #[error(
        "log_epoch {given:?} is not this agent's event log {epoch} (its state directory was \
         wiped or replaced, and sequence numbers restarted); {}", resync(*.last, .epoch)
    )]
    OtherEpoch {
        /// The epoch the client gave.
        given: String,
        /// This log's epoch.
        epoch: LogEpoch,
        /// The newest event.
        last: u64,
    },
    /// The client's position is past the newest event.
    #[error(
        "after_seq {after} is beyond the newest event {last} of log {epoch} (the log restarted, \
         e.g. a wiped state directory); {}", resync(*.last, .epoch)
    )]
    BeyondNewest {
        /// The position the client gave.
        after: u64,
        /// The newest event.
        last: u64,
        /// This log's epoch.
        epoch: LogEpoch,
    },
    /// Events after the client's position were pruned.
    #[error(
        "events up to {} were pruned (oldest retained is {first}, newest {last}); {}",
        .first - 1, resync(*.last, .epoch)
    )]
    Pruned {
        /// The oldest retained event (above 0).
        first: u64,
        /// The newest event.
        last: u64,
        /// This log's epoch.
        epoch: LogEpoch,
    },
}

fn resync(last: u64, epoch: &LogEpoch) -> String {
    format!(
        "resynchronise with ListAttachments, then watch with after_seq = {last} and log_epoch = {epoch}"
    )
}

/// Why a watch stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum StreamEnd {
    /// The agent is stopping.
    #[error("agent is shutting down")]
    Stopping,
    /// The stream reached its maximum age.
    #[error("stream reached its maximum age ([limits] watch_max_age_secs)")]
    Expired,
}
