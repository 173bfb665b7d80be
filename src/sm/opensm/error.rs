//! Why a request to the SM host was not applied ([`OpenSmError`]), and what OpenSM rejected and
//! what the SM host did about it ([`Rejection`], [`Restored`]). OpenSM's own error lines are kept
//! as it wrote them.

use super::ownership::{DirectoryError, InventoryFileError, OwnershipRefusal};
use super::region::{FullDefault, RegionError, TableOverflow};
use super::reload::{ReloadError, Unsignalled};
use super::store::NodeStoreError;
use crate::domain::{DomainError, GrantError, Guid, NodeId, PKey};
use crate::sm::{SmError, SmFailure};
use std::sync::Arc;
use thiserror::Error;

/// Why a request was not applied.
#[derive(Debug, Clone, Error)]
pub enum OpenSmError {
    /// Bad node id, GUID, key or name.
    #[error("invalid request: {0}")]
    Invalid(#[source] DomainError),
    /// A claimed port is stored for another node and does not move.
    #[error("invalid request: port {port} belongs to node {owner:?}")]
    PortHeld {
        /// The port.
        port: Guid,
        /// The node that holds it.
        owner: NodeId,
    },
    /// A port would hold more keys than its table.
    #[error("P_Key table full: {0}")]
    TableFull(TableOverflow),
    /// The operator's part of the file does not load, or would collide with the region:
    /// nothing was written.
    #[error("{0}")]
    OperatorFile(#[source] RegionError),
    /// A requested key belongs to the operator's part of the file.
    #[error("key {key} is defined by the operator's entry on line {line} of the partitions file; the agent does not manage it")]
    OperatorKey {
        /// The key.
        key: PKey,
        /// The operator entry's line.
        line: u32,
    },
    /// The composed file failed the final check: nothing was written.
    #[error("{0}")]
    Composed(#[source] RegionError),
    /// OpenSM's log shows it rejected the file.
    #[error("{0}")]
    Rejected(Rejection),
    /// OpenSM could not be signalled; `written_keys`: after the file was written (with that
    /// many tenant keys), so the write is re-checked on the next attempt.
    #[error("{}", match .written_keys {
        Some(n) => format!("partitions file written ({n} keys) but OpenSM could not be made to re-read it: {source}; the write is re-checked on the next attempt"),
        None => format!("cannot make OpenSM re-read the partitions file: {source}"),
    })]
    Unreachable {
        /// Tenant keys in the written file, if it was written.
        written_keys: Option<usize>,
        /// Why OpenSM could not be signalled.
        #[source]
        source: Unsignalled,
    },
    /// Reading or writing the file failed.
    #[error("partitions file: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// The membership store failed.
    #[error("{0}")]
    Store(#[source] NodeStoreError),
    /// A blocking task (file or store I/O) failed, or the commit task ended without an answer
    /// (`None`).
    #[error("the SM host's {what} task failed{}", .source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Task {
        /// Which task.
        what: &'static str,
        /// Why, when the runtime said.
        #[source]
        source: Option<Arc<tokio::task::JoinError>>,
    },
    /// The SM host holds a newer generation of this node's set (or the same generation with a
    /// different set): the node moves its counter past `stored` and sends its current set again.
    #[error("generation {sent} refused: the SM host holds generation {stored} of this node's set")]
    StaleGeneration {
        /// The generation the request carried.
        sent: u64,
        /// The generation stored for the node.
        stored: u64,
    },
    /// The file was written but OpenSM was not seen re-reading it: the outcome is unknown and
    /// the next attempt writes, signals and checks again.
    #[error("partitions file written ({written_keys} keys) and a heavy sweep requested, but OpenSM was not seen re-reading it within {waited_ms} ms (is OpenSM running and sweeping?); the write is re-checked on the next attempt")]
    Unconfirmed {
        /// Tenant keys in the written file.
        written_keys: usize,
        /// How long OpenSM's log and the file were watched (`reload_check_ms`).
        waited_ms: u64,
    },
    /// The Default entry gives every port full membership of the default partition and the
    /// config does not acknowledge it: tenant keys are not served.
    #[error("{0}; the SM host serves tenant keys only when its config acknowledges this with allow_full_default = true (an empty set is always served)")]
    InsecureDefault(FullDefault),
    /// A claimed port never enters a tenant's set (the SM's port, a switch's, a router's), or
    /// another node holds it and the fabric does not show it in the claiming node.
    #[error("port ownership: {0}")]
    PortForbidden(OwnershipRefusal),
    /// Neither the fabric nor the operator's inventory shows the claimed port in the node.
    #[error("port ownership: {0}")]
    PortNotShown(OwnershipRefusal),
    /// The fabric could not be asked who owns a claimed port (fail closed: nothing accepted).
    #[error("port ownership: the SA could not be asked: {0}")]
    FabricUnreachable(#[source] DirectoryError),
    /// The operator's inventory of ports does not load: no new claim is accepted.
    #[error("port ownership: {0}; no claim is accepted until it is fixed")]
    Inventory(#[source] InventoryFileError),
    /// Grants are required and a key of the node's set has no valid, unconsumed grant for this
    /// node, key and membership (or a carried grant is refused): nothing was written.
    #[error("node {node:?}: key {pkey} refused: {error}")]
    GrantRefused {
        /// The node whose set was refused.
        node: NodeId,
        /// The key the refused grant was for (or the key without a grant).
        pkey: PKey,
        /// What is wrong.
        error: Box<GrantError>,
    },
    /// A revocation on an SM host that does not require grants: no grant was ever recorded.
    #[error("this SM host does not require grants ([grants] require = false), so it records none to revoke")]
    GrantsNotRequired,
    /// A revocation for a node the SM host holds no set of.
    #[error("no memberships stored for node {0:?}")]
    NodeNotStored(NodeId),
    /// The node's stored set no longer passes the whole-file checks against the operator's
    /// part (it changed since the set was admitted): the set is stored but left out of the
    /// file (its ports hold none of its keys) until a set of the node passes again. The other
    /// nodes' sets are written.
    #[error("node {node:?}: set quarantined, none of its keys is in the partitions file: {reason}; send a set without the conflict (a release always goes through)")]
    Quarantined {
        /// The node.
        node: NodeId,
        /// Which check it fails.
        reason: String,
    },
}

impl From<RegionError> for OpenSmError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::OperatorKey { key, line } => OpenSmError::OperatorKey { key, line },
            RegionError::TableFull(t) => OpenSmError::TableFull(t),
            RegionError::Composed(_) => OpenSmError::Composed(e),
            RegionError::OperatorFile(_) | RegionError::Collision(_) => {
                OpenSmError::OperatorFile(e)
            }
        }
    }
}

impl From<ReloadError> for OpenSmError {
    fn from(e: ReloadError) -> Self {
        match e {
            ReloadError::Unreachable(source) => OpenSmError::Unreachable {
                written_keys: None,
                source,
            },
            ReloadError::Rejected(lines) => OpenSmError::Rejected(Rejection::Reread { lines }),
        }
    }
}

impl From<OpenSmError> for SmError {
    fn from(e: OpenSmError) -> Self {
        match e {
            OpenSmError::StaleGeneration { sent, stored } => {
                SmError::StaleGeneration { sent, stored }
            }
            OpenSmError::Unreachable { .. }
            | OpenSmError::Unconfirmed { .. }
            | OpenSmError::Io(_)
            | OpenSmError::Store(_)
            | OpenSmError::Task { .. }
            | OpenSmError::FabricUnreachable(_) => SmError::Unreachable(SmFailure::OpenSm(e)),
            _ => SmError::Refused(SmFailure::OpenSm(e)),
        }
    }
}

/// A partitions file OpenSM rejected.
#[derive(Debug, Clone, Error)]
pub enum Rejection {
    /// OpenSM rejected the file the agent had just written; `restored`: what was put back.
    #[error("{}; {restored}", Rejection::written_before_restore(.lines))]
    Written {
        /// OpenSM's error lines.
        lines: String,
        /// What the agent put back.
        restored: Restored,
    },
    /// OpenSM rejected a file that added what this set adds (or these exact bytes) before: it
    /// is not written again before `wait_s` seconds have passed (the hold doubles with each
    /// rejection of the same bytes or additions; see [`super::repair::RejectedFile`]). The
    /// rest of the file (other nodes' releases) is written without it meanwhile.
    #[error(
        "OpenSM rejected a partitions file with this addition before; it is not written again for {wait_s} s ({earlier})"
    )]
    Repeated {
        /// The earlier rejection, as recorded in the commit state.
        earlier: String,
        /// Seconds until the bytes may be written again.
        wait_s: u64,
    },
    /// OpenSM rejected files with this addition `times` times in a row: it is refused, not
    /// written again until the node sends a set that differs (see
    /// [`super::repair::RejectedFile::refused`]). The rest of the file is written without it.
    #[error(
        "OpenSM rejected a partitions file with this addition {times} times in a row; it is refused until the node's set changes ({earlier})"
    )]
    Refused {
        /// The earlier rejection, as recorded in the commit state.
        earlier: String,
        /// Rejections in a row.
        times: u32,
    },
    /// A reload that wrote nothing found OpenSM rejecting the file on disk.
    #[error("OpenSM rejected the partitions file: {lines}")]
    Reread {
        /// OpenSM's error lines.
        lines: String,
    },
}

impl Rejection {
    /// How a rejection of the agent's write is recorded before anything is restored: the start
    /// of [`Rejection::Written`]'s text.
    pub fn written_before_restore(lines: &str) -> String {
        format!("OpenSM rejected the partitions file the agent wrote ({lines})")
    }
}

/// What putting the last accepted file back achieved.
#[derive(Debug, Clone, Error)]
pub enum Restored {
    /// Restored, and OpenSM re-read it.
    #[error("the last accepted file was restored and OpenSM re-read it")]
    Reread,
    /// Restored, but OpenSM was not seen re-reading it in time.
    #[error("the last accepted file was restored; OpenSM was not seen re-reading it within {waited_ms} ms")]
    Unseen {
        /// How long it was watched (`reload_check_ms`).
        waited_ms: u64,
    },
    /// Restored, but OpenSM could not be made to re-read it, or rejected it too.
    #[error("the last accepted file was restored; {0}")]
    NotReread(#[source] ReloadError),
    /// The accepted file could not be written back.
    #[error("the last accepted file could not be restored: {0}")]
    Failed(#[source] Box<OpenSmError>),
    /// No accepted file is kept (nothing was ever accepted, or it is the rejected one).
    #[error("no accepted file is kept to restore")]
    NothingKept,
}

impl Restored {
    /// Whether OpenSM is known to be serving the restored file.
    pub fn reread(&self) -> bool {
        matches!(self, Restored::Reread)
    }
}

/// A blocking task (file, store, inventory) that ended without an answer.
pub(super) fn task_failed(what: &'static str, e: tokio::task::JoinError) -> OpenSmError {
    OpenSmError::Task {
        what,
        source: Some(Arc::new(e)),
    }
}
