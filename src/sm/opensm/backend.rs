//! The SM host's backend: merges every node's desired memberships into the agent's region of
//! `partitions.conf`, writes it atomically and forces a heavy sweep.
//!
//! Group commit: a request that arrives while a write + sweep is in flight joins the next one,
//! so a burst from hundreds of nodes costs a handful of sweeps while a lone request goes out at
//! once. Each caller's future resolves when the write + sweep containing its change completes.
//! An admitted set is held in memory and marked unsaved; each commit first stores every unsaved
//! set of its group, with the commit state marking the write in progress, in one store
//! transaction, then writes the file. A set is answered OK only once it is durable and OpenSM
//! was seen re-reading a file containing it; a file never holds a set that is not durable.
//!
//! Generations (fencing): each node orders its sets with a persisted counter. A set with a lower
//! generation than the stored one, or the same generation and a different set, is refused with
//! [`OpenSmError::StaleGeneration`] carrying the stored generation (never answered OK); the same
//! generation with the same set is a retry and re-checks the file.
//!
//! Fail-closed: a commit answers OK only once OpenSM was seen re-reading the file without an
//! error in its log. From just before a write until then the write is *unconfirmed*, persisted
//! in the store ([`CommitState`]), so the next commit writes, signals and checks again even when
//! the bytes are unchanged. A copy of the last file OpenSM accepted is kept beside the file
//! (`.<name>.fabric-agent-accepted`, replaced atomically); when OpenSM rejects a file (the
//! agent's, or an operator's edit it re-read on its own sweep or a SIGHUP), that copy is put back
//! at once and OpenSM signalled again, since a rejected file leaves OpenSM fail-open (every port
//! a full member of one partition). An operator's rejected edit is kept as `<name>.rejected`.
//! Rejections the agent did not cause are noticed at the next commit and by a log watch every
//! `watch_ms`, also those logged while the agent was down (the log mark is persisted); see
//! [`super::repair`].

use super::file::{accepted_copy_path, rejected_copy_path};
use super::file::{read_or_empty, replace_atomically};
use super::isolation;
use super::model::PartitionsConf;
use super::ownership::{
    judge, DirectoryError, Inventory, InventoryFileError, PortDirectory, Proof, Refusal,
    UmadDirectory,
};
use super::region::{
    check_composed, check_operator_keys, check_operator_unchanged, compose,
    default_grants_all_full, render_region, split_region, tenant_entry_name, FullDefault,
    RegionError, RegionPlan, TableLimits, TableOverflow, TenantEntry,
};
use super::rejection::{Rejection, Restored};
use super::reload::{OpenSmReloader, ReloadError, Reloader, Unsignalled};
use super::repair::{describe, operator_part, rejected_bytes_path, takes_away_only};
use super::store::AcceptedGrant;
use super::store::{
    CommitState, LogMark, NodeMembershipStore, NodeStoreError, OperatorRejected, StoredNode,
};
use super::OpenSmConfig;
use crate::domain::{
    is_safe_key_name, Condition, ConditionKind, DomainError, GrantError, Guid, Membership, NodeId,
    NodeMemberships, PKey, SignedGrant,
};
use crate::sm::{ApplyOutcome, SmError, SmFailure, SubnetManager};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::oneshot;

/// Most fabric ports one node may list.
pub const MAX_PORTS_PER_NODE: usize = NodeMemberships::MAX_PORTS;

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
    PortForbidden(Refusal),
    /// Neither the fabric nor the operator's inventory shows the claimed port in the node.
    #[error("port ownership: {0}")]
    PortNotShown(Refusal),
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

/// What a revocation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocation {
    /// Grant ids consumed by this call (empty on a repeat).
    pub revoked_grant_ids: Vec<String>,
    /// Keys removed from the node's programmed set.
    pub removed_pkeys: Vec<PKey>,
    /// Sweeps requested since the backend started.
    pub sweeps: u64,
}

/// What a request achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetOutcome {
    /// Sweeps requested since the backend started.
    pub sweeps: u64,
    /// One line for humans.
    pub detail: String,
}

/// The result one commit hands to every caller it carried.
type CommitResult = Result<String, OpenSmError>;

/// What one commit did: its detail, and the nodes whose sets it left out of the file.
struct Committed {
    detail: String,
    quarantined: BTreeMap<NodeId, String>,
}

impl Committed {
    /// The answer for a caller that carried `node`'s set: an error when that set was left out.
    fn answer(&self, node: Option<&NodeId>) -> CommitResult {
        match node.and_then(|n| self.quarantined.get_key_value(n)) {
            Some((node, reason)) => Err(OpenSmError::Quarantined {
                node: node.clone(),
                reason: reason.clone(),
            }),
            None => Ok(self.detail.clone()),
        }
    }
}

/// What of a node's set is admitted ([`OpenSmBackend::judge_set`]).
struct Admitted {
    set: NodeMemberships,
    moves: BTreeMap<Guid, NodeId>,
    accepted: Option<Vec<AcceptedGrant>>,
    /// When given, `set` is only the part of the request that could be admitted (refused ports
    /// left out, or only its removals) and the caller gets this refusal after the commit.
    refusal: Option<OpenSmError>,
}

/// What the fabric and the inventory said about a request's new ports.
#[derive(Default)]
struct Evidence {
    facts: super::ownership::FabricFacts,
    inventory: Inventory,
    /// Why the fabric or the inventory could not be asked: every new port is unproven.
    failure: Option<OpenSmError>,
}

struct State {
    nodes: BTreeMap<NodeId, StoredNode>,
    /// Every consumed grant id (any node's): refused forever.
    consumed: BTreeSet<String>,
    guid_owner: BTreeMap<Guid, NodeId>,
    operator: PartitionsConf,
    /// Callers waiting for the next commit, with the node whose set each one carried.
    pending: Vec<(Option<NodeId>, oneshot::Sender<CommitResult>)>,
    /// Requests admitted in part (a port refused, or only their removals), by node: the
    /// request and its generation. The same request again is judged again, not refused as a
    /// stale generation (the stored set differs from it).
    partial: BTreeMap<NodeId, (u64, NodeMemberships)>,
    /// Admitted node sets not yet stored: the next commit stores them before it writes.
    unsaved: BTreeSet<NodeId>,
    committing: bool,
    health: Health,
}

impl State {
    /// Every node's set, and the unsaved ones (taken: the commit that writes this snapshot
    /// stores them first).
    fn snapshot(&mut self) -> (BTreeMap<NodeId, StoredNode>, Vec<StoredNode>) {
        let unsaved = std::mem::take(&mut self.unsaved)
            .into_iter()
            .filter_map(|id| self.nodes.get(&id).cloned())
            .collect();
        (self.nodes.clone(), unsaved)
    }

    /// [`StoredNode::fence`] for `set` against `old`, the node's stored set, except that a
    /// request admitted only in part is judged again when it comes back with the same
    /// generation (its port may be provable now), instead of being refused as another set.
    fn fence(&self, old: &StoredNode, set: &NodeMemberships, generation: u64) -> Result<bool, u64> {
        match old.fence(set, generation) {
            Err(stored)
                if stored == generation
                    && self
                        .partial
                        .get(&set.node_id)
                        .is_some_and(|(g, r)| *g == generation && r == set) =>
            {
                Ok(false)
            }
            other => other,
        }
    }
}

/// What the backend knows about the file and OpenSM's verdicts.
#[derive(Debug, Default)]
struct Health {
    /// Persisted: unconfirmed write, rejected file.
    commit: CommitState,
    /// Where the Default entry grants `ALL=full`, as of the last read of the operator's part.
    all_full: Option<FullDefault>,
    /// The last file OpenSM rejected and its hold (the bytes are kept beside the file across
    /// restarts, [`rejected_bytes_path`]).
    rejected: Option<RejectedFile>,
    /// OpenSM's log was checked for rejections up to here.
    log_mark: u64,
    /// `operator_file` mode: why the operator's file is refused (the previous live operator
    /// part is used meanwhile).
    operator_file_refused: Option<String>,
    /// Nodes whose stored set the last commit left out of the file, and why.
    quarantined: BTreeMap<NodeId, String>,
}

/// The first hold on bytes OpenSM rejected; it doubles with each rejection of the same bytes.
const REJECTED_HOLD_FIRST: Duration = Duration::from_secs(60);
/// The longest hold on bytes OpenSM rejected.
const REJECTED_HOLD_MAX: Duration = Duration::from_secs(600);

/// The last file OpenSM rejected, and until when it is held back.
///
/// OpenSM's verdict is a property of the bytes it reads, and the agent writes only bytes the
/// strict parser (OpenSM's own parser, re-implemented) accepts: a rejection of them is most
/// likely not caused by them (an error line of a sweep that read something else). Writing them
/// again opens a fail-open window if OpenSM does reject them, so:
/// - bytes that only take away from the last accepted file ([`takes_away_only`]: a release) are
///   written again at once: they add nothing OpenSM did not accept, and a release must go
///   through;
/// - other rejected bytes are held back: not written again before the hold ends (1 min, doubling
///   with each rejection of the same bytes in a row, at most 10 min), so a file OpenSM does
///   reject costs at most one fail-open window per hold, and a rejection not caused by the bytes
///   does not stall the node for good.
#[derive(Debug)]
struct RejectedFile {
    bytes: Vec<u8>,
    /// Rejections of these bytes in a row.
    times: u32,
    /// The bytes are not written again before this (unless they only take away).
    hold_until: tokio::time::Instant,
}

impl RejectedFile {
    /// `bytes` rejected (again, when `earlier` held the same bytes).
    fn after(earlier: Option<RejectedFile>, bytes: Vec<u8>) -> RejectedFile {
        let times = earlier
            .filter(|e| e.bytes == bytes)
            .map_or(1, |e| e.times.saturating_add(1));
        let hold = REJECTED_HOLD_FIRST
            .saturating_mul(1 << (times - 1).min(16))
            .min(REJECTED_HOLD_MAX);
        RejectedFile {
            bytes,
            times,
            hold_until: tokio::time::Instant::now() + hold,
        }
    }

    /// Whether the hold still keeps `bytes` from being written (`accepted`: the last accepted
    /// file): the time left, `None` when they may be written.
    fn holds(&self, bytes: &[u8], accepted: Option<&[u8]>) -> Option<Duration> {
        if self.bytes != bytes || accepted.is_some_and(|a| takes_away_only(a, bytes)) {
            return None;
        }
        let left = self
            .hold_until
            .saturating_duration_since(tokio::time::Instant::now());
        (!left.is_zero()).then_some(left)
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, OpenSmError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| task_failed("file", e))?
        .map_err(|e| OpenSmError::Io(Arc::new(e)))
}

fn read_optional(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

struct Inner {
    config: OpenSmConfig,
    local_node_id: String,
    store: Arc<dyn NodeMembershipStore>,
    reloader: Arc<dyn Reloader>,
    /// Asked about ports other nodes claim; `None` when ownership checks are off.
    directory: Option<Arc<dyn PortDirectory>>,
    state: Mutex<State>,
    /// Orders store writes with the in-memory update.
    admit: tokio::sync::Mutex<()>,
    /// Held by a request from admission to reload when group commit is off.
    serial: tokio::sync::Mutex<()>,
    sweeps: AtomicU64,
    writes: AtomicU64,
    /// `set_node` calls entered since start: the commit linger watches it for a burst.
    arrivals: AtomicU64,
    /// `set_node` calls between entry and their place in a commit group (or their refusal).
    admitting: AtomicUsize,
}

/// Counts one `set_node` call as admitting until dropped.
struct Admitting<'a>(&'a AtomicUsize);

impl<'a> Admitting<'a> {
    fn enter(arrivals: &AtomicU64, admitting: &'a AtomicUsize) -> Admitting<'a> {
        admitting.fetch_add(1, Ordering::SeqCst);
        arrivals.fetch_add(1, Ordering::SeqCst);
        Admitting(admitting)
    }
}

impl Drop for Admitting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The OpenSM backend. Cheap to clone (shared state).
#[derive(Clone)]
pub struct OpenSmBackend {
    inner: Arc<Inner>,
}

impl OpenSmBackend {
    /// Builds the backend with the real reloader (SIGHUP or console, per `config.reload`).
    /// `local_node_id` is the SM host's own node id, used by [`SubnetManager::apply`].
    pub fn new(
        config: OpenSmConfig,
        local_node_id: String,
        store: Arc<dyn NodeMembershipStore>,
    ) -> Result<Self, OpenSmError> {
        let reloader = Arc::new(OpenSmReloader::new(&config));
        Self::with_reloader(config, local_node_id, store, reloader)
    }

    /// Builds the backend with any [`Reloader`] (tests use a fake one). Port ownership is
    /// checked through the SA on `config.ownership.umad_device` when `config.ownership.enabled`.
    pub fn with_reloader(
        config: OpenSmConfig,
        local_node_id: String,
        store: Arc<dyn NodeMembershipStore>,
        reloader: Arc<dyn Reloader>,
    ) -> Result<Self, OpenSmError> {
        let directory = config
            .ownership
            .enabled
            .then(|| Arc::new(UmadDirectory::new(&config.ownership)) as Arc<dyn PortDirectory>);
        Self::with_directory(config, local_node_id, store, reloader, directory)
    }

    /// Builds the backend with any [`Reloader`] and [`PortDirectory`] (`None`: ownership is
    /// not checked).
    pub fn with_directory(
        config: OpenSmConfig,
        local_node_id: String,
        store: Arc<dyn NodeMembershipStore>,
        reloader: Arc<dyn Reloader>,
        directory: Option<Arc<dyn PortDirectory>>,
    ) -> Result<Self, OpenSmError> {
        let stored = store.load_all().map_err(OpenSmError::Store)?;
        let mut nodes = BTreeMap::new();
        let mut guid_owner = BTreeMap::new();
        let mut consumed = BTreeSet::new();
        for n in stored {
            consumed.extend(n.consumed.iter().cloned());
            for g in &n.memberships.port_guids {
                guid_owner.insert(*g, n.memberships.node_id.clone());
            }
            nodes.insert(n.memberships.node_id.clone(), n);
        }
        // A broken operator file is reported by the first commit; start with no operator keys.
        let operator = read_or_empty(&config.partitions_file)
            .ok()
            .and_then(|b| split_region(&b).ok())
            .and_then(|p| p.parse().ok())
            .unwrap_or_default();
        let commit = store.load_commit_state().map_err(OpenSmError::Store)?;
        // The persisted mark: rejections OpenSM logged while the agent was down lie after it
        // and are repaired by the first watch (at once). A rotated log is read from its start.
        let (log_mark, rescan) = match (commit.log_mark, reloader.log_identity()) {
            (Some(m), Some(now)) if m.file.is_some_and(|f| f != now) => (0, true),
            (Some(m), _) => (m.offset, true),
            (None, _) => (reloader.checkpoint(), false),
        };
        // Bytes rejected in an earlier run: held back again from this start.
        let rejected = read_optional(&rejected_bytes_path(&config.partitions_file))
            .map_err(|e| OpenSmError::Io(Arc::new(e)))?
            .map(|bytes| RejectedFile::after(None, bytes));
        let health = Health {
            commit,
            all_full: all_full_of(&config, &operator),
            rejected,
            log_mark,
            operator_file_refused: None,
            quarantined: BTreeMap::new(),
        };
        let watch = Duration::from_millis(config.watch_ms);
        let backend = OpenSmBackend {
            inner: Arc::new(Inner {
                config,
                local_node_id,
                store,
                reloader,
                directory,
                state: Mutex::new(State {
                    nodes,
                    consumed,
                    guid_owner,
                    operator,
                    pending: Vec::new(),
                    partial: BTreeMap::new(),
                    unsaved: BTreeSet::new(),
                    committing: false,
                    health,
                }),
                admit: tokio::sync::Mutex::new(()),
                serial: tokio::sync::Mutex::new(()),
                sweeps: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                arrivals: AtomicU64::new(0),
                admitting: AtomicUsize::new(0),
            }),
        };
        if !watch.is_zero() && tokio::runtime::Handle::try_current().is_ok() {
            let first = if rescan { Duration::ZERO } else { watch };
            tokio::spawn(watch_log(Arc::downgrade(&backend.inner), first, watch));
        }
        Ok(backend)
    }

    /// Sweeps requested since start.
    pub fn sweeps(&self) -> u64 {
        self.inner.sweeps.load(Ordering::Relaxed)
    }

    /// Files written since start.
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }

    /// What the SM host holds for one node.
    pub fn node(&self, node_id: &str) -> Option<StoredNode> {
        self.inner.lock().nodes.get(node_id).cloned()
    }

    /// Rewrites the region from the stored state: the log watch's repair after OpenSM rejected
    /// a partitions file (an operator's edit).
    pub async fn resync(&self) -> Result<SetOutcome, OpenSmError> {
        let _alone = self.serial_unless_grouped().await;
        let detail = self.commit(None).await?;
        Ok(SetOutcome {
            sweeps: self.sweeps(),
            detail,
        })
    }

    /// Replaces one node's desired set (declarative), as another node asks for it through
    /// `fabric.sm.v1.Partitions`. Returns once the write + sweep containing it completed and
    /// OpenSM was seen re-reading the file without error. A generation older than the stored
    /// one, or the same generation with a different set, is refused with
    /// [`OpenSmError::StaleGeneration`]; the same generation with the same set is a retry.
    ///
    /// With ownership checks on, every port GUID not yet in the node's stored set must be
    /// proven the node's (see [`super::ownership`]) before anything is stored or written;
    /// a refusal is logged and answered with [`OpenSmError::PortForbidden`],
    /// [`OpenSmError::PortNotShown`] or [`OpenSmError::FabricUnreachable`].
    pub async fn set_node(
        &self,
        desired: NodeMemberships,
        generation: u64,
    ) -> Result<SetOutcome, OpenSmError> {
        self.set_node_checked(desired, &[], generation, true).await
    }

    /// [`OpenSmBackend::set_node`] with the grants the node carries. When the SM host requires
    /// grants (see [`OpenSmBackend::judge_grants`]) a key without a valid, unconsumed grant
    /// refuses the whole set with [`OpenSmError::GrantRefused`] before anything is stored.
    pub async fn set_node_granted(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<SetOutcome, OpenSmError> {
        self.set_node_checked(desired, grants, generation, true)
            .await
    }

    /// Whether this SM host requires grants.
    pub fn requires_grants(&self) -> bool {
        self.inner.config.grants.as_ref().is_some_and(|g| g.require)
    }

    async fn set_node_checked(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
        check_ports: bool,
    ) -> Result<SetOutcome, OpenSmError> {
        let admitting = Admitting::enter(&self.inner.arrivals, &self.inner.admitting);
        validate(&desired, self.inner.config.pkey_table_size)?;
        let evidence = match (&self.inner.directory, check_ports) {
            (Some(directory), true) => Some(
                self.gather_evidence(directory, &desired, generation)
                    .await?,
            ),
            _ => None,
        };
        // Without group commit each request is admitted and written alone: one write and one
        // sweep per request.
        let _alone = self.serial_unless_grouped().await;
        let refusal = {
            let _admit = self.inner.admit.lock().await;
            let admission = {
                let st = self.inner.lock();
                self.judge_set(&st, &desired, grants, generation, evidence.as_ref())?
            };
            match admission {
                None => None,
                Some(Admitted {
                    set,
                    moves,
                    accepted,
                    refusal,
                }) => {
                    let mut st = self.inner.lock();
                    match &refusal {
                        Some(e) => {
                            tracing::warn!(node_id = %desired.node_id, generation, error = %e, "set refused in part: the rest of it (at least its removals) is applied");
                            st.partial
                                .insert(desired.node_id.clone(), (generation, desired.clone()));
                        }
                        None => {
                            st.partial.remove(&desired.node_id);
                        }
                    }
                    drop(st);
                    self.admit(set, generation, moves, accepted);
                    refusal
                }
            }
        };
        drop(admitting);
        let detail = self.commit(Some(&desired.node_id)).await?;
        if let Some(e) = refusal {
            return Err(e);
        }
        Ok(SetOutcome {
            sweeps: self.sweeps(),
            detail,
        })
    }

    /// Decides what of `desired` is admitted (under the admission lock); `None`: a retry of
    /// the stored set (same generation), served again.
    ///
    /// Rules (docs/OPENSM.md, "Failure isolation"): the generation fences first. A port that
    /// cannot be proven the node's, or that another node holds, is refused with its keys and
    /// the rest of the set goes on. A set that only takes away from the stored one (a release)
    /// needs no posture, operator-key or table check. A set refused for any other reason still
    /// has its removals applied when it carries any (the node gets the refusal either way).
    fn judge_set(
        &self,
        st: &State,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
        evidence: Option<&Evidence>,
    ) -> Result<Option<Admitted>, OpenSmError> {
        let stored = st.nodes.get(&desired.node_id);
        if let Some(old) = stored {
            match st.fence(old, desired, generation) {
                Ok(true) => return Ok(None),
                Ok(false) => {}
                Err(stored) => {
                    return Err(OpenSmError::StaleGeneration {
                        sent: generation,
                        stored,
                    })
                }
            }
        }
        let (moves, mut refused) = match evidence {
            Some(ev) => self.prove_claims(st, desired, ev),
            None => (BTreeMap::new(), BTreeMap::new()),
        };
        for g in &desired.port_guids {
            if let Some(owner) = st.guid_owner.get(g) {
                if owner != &desired.node_id && moves.get(g) != Some(owner) {
                    refused.entry(*g).or_insert(OpenSmError::PortHeld {
                        port: *g,
                        owner: owner.clone(),
                    });
                }
            }
        }
        let set = isolation::strip_ports(desired, &refused.keys().copied().collect());
        // A port that is forbidden or another node's is refused even when it carries no key;
        // an unproven one (the fabric does not show it yet, or cannot be asked) only when the
        // request gives it a key: a keyless new port does not hold up a release.
        let port_refusal = refused
            .values()
            .find(|e| {
                matches!(
                    e,
                    OpenSmError::PortForbidden(_) | OpenSmError::PortHeld { .. }
                )
            })
            .or_else(|| {
                refused
                    .iter()
                    .find(|(g, _)| desired.keys.keys().any(|k| desired.gives(*k, **g)))
                    .map(|(_, e)| e)
            })
            .cloned();
        if let Some(e) = &port_refusal {
            // Nothing else would change: refused, nothing stored or written.
            let unchanged = match stored {
                Some(old) => isolation::same_effect(&old.memberships, &set),
                None => set.port_guids.is_empty(),
            };
            if unchanged {
                return Err(e.clone());
            }
        }
        let release = stored.is_some_and(|old| isolation::removes_only(&old.memberships, &set));
        let checked = self.judge_grants(st, &set, grants).and_then(|accepted| {
            if !release {
                self.admissible(st, &set, &moves)?;
            }
            Ok(accepted)
        });
        match checked {
            Ok(accepted) => Ok(Some(Admitted {
                set,
                moves,
                accepted,
                refusal: port_refusal,
            })),
            Err(e) => {
                let Some(old) = stored else {
                    return Err(e);
                };
                let part = isolation::removal_part(&old.memberships, &set);
                if !isolation::takes_away(&old.memberships, &part) {
                    return Err(e);
                }
                let accepted = self.requires_grants().then(|| {
                    old.grants
                        .iter()
                        .filter(|g| {
                            part.keys
                                .get(&g.pkey)
                                .is_some_and(|k| k.membership == g.membership)
                        })
                        .cloned()
                        .collect()
                });
                Ok(Some(Admitted {
                    set: part,
                    moves: BTreeMap::new(),
                    accepted,
                    refusal: Some(e),
                }))
            }
        }
    }

    /// Takes an admitted set in memory, marked unsaved (the next commit stores it). Ports that
    /// move (`moves`: GUID -> the node that held it) leave their old node's set (same
    /// generation); both sets are stored in the same transaction, so the port is never stored
    /// in two.
    fn admit(
        &self,
        desired: NodeMemberships,
        generation: u64,
        moves: BTreeMap<Guid, NodeId>,
        accepted: Option<Vec<AcceptedGrant>>,
    ) {
        let mut st = self.inner.lock();
        let losers: BTreeSet<&NodeId> = moves.values().collect();
        for from in losers {
            let Some(old) = st.nodes.get_mut(from) else {
                continue;
            };
            old.memberships
                .port_guids
                .retain(|g| moves.get(g).is_none_or(|f| f != from));
            st.unsaved.insert(from.clone());
        }
        for (g, f) in &moves {
            if st.guid_owner.get(g) == Some(f) {
                st.guid_owner.remove(g);
            }
        }
        let old_guids = st
            .nodes
            .get(&desired.node_id)
            .map(|old| old.memberships.port_guids.clone())
            .unwrap_or_default();
        for g in &old_guids {
            st.guid_owner.remove(g);
        }
        for g in &desired.port_guids {
            st.guid_owner.insert(*g, desired.node_id.clone());
        }
        st.unsaved.insert(desired.node_id.clone());
        let mut record = st
            .nodes
            .remove(&desired.node_id)
            .unwrap_or_else(|| StoredNode::new(desired.clone(), generation));
        if let Some(accepted) = accepted {
            // A grant of the previous accepted set that this one no longer carries is consumed:
            // its instance was released. Stored in the same record, so in the same transaction.
            let kept: BTreeSet<&str> = accepted.iter().map(|g| g.grant_id.as_str()).collect();
            let gone: Vec<String> = record
                .grants
                .iter()
                .filter(|g| !kept.contains(g.grant_id.as_str()))
                .map(|g| g.grant_id.clone())
                .collect();
            for id in gone {
                tracing::info!(node_id = %desired.node_id, grant_id = %id, "grant consumed: its key left the node's set");
                st.consumed.insert(id.clone());
                record.consumed.insert(id);
            }
            record.grants = accepted;
        }
        record.memberships = desired;
        record.generation = generation;
        record.gated = false;
        st.nodes.insert(record.memberships.node_id.clone(), record);
    }

    /// With grants required: the grants that justify `desired.keys`, or the refusal naming the
    /// key and the reason. `None` when grants are not required (nothing is recorded).
    ///
    /// Rules: every carried grant must verify (known key id, signature, the key's validity
    /// window), name this node exactly, this fabric, a key of the set with exactly its
    /// membership, an instance not revoked on this node, and not be consumed; a refused carried
    /// grant refuses the whole set. Every key of the set needs a carried grant, except a key the
    /// node's stored set already holds with the same membership: a set that only removes keys
    /// (a release) needs no grant, and such a key keeps the grants stored for it.
    fn judge_grants(
        &self,
        st: &State,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
    ) -> Result<Option<Vec<AcceptedGrant>>, OpenSmError> {
        let Some(policy) = self.inner.config.grants.as_ref().filter(|g| g.require) else {
            return Ok(None);
        };
        let stored = st.nodes.get(&desired.node_id);
        crate::sm::grant_judge::judge(policy, &st.consumed, stored, desired, grants)
            .map(Some)
            .map_err(|(pkey, error)| {
                let e = OpenSmError::GrantRefused {
                    node: desired.node_id.clone(),
                    pkey,
                    error: Box::new(error),
                };
                tracing::warn!(node_id = %desired.node_id, error = %e, "set refused: grant");
                e
            })
    }

    /// Consumes every grant of `instance` on `node` the SM host holds, removes the keys no other
    /// grant of the node justifies from its stored set (whatever the node keeps sending: its
    /// later sets carrying a revoked grant are refused), then writes and confirms like a set.
    /// Idempotent: a repeat consumes nothing and re-confirms the file.
    pub async fn revoke_instance(
        &self,
        node: &NodeId,
        instance: &str,
    ) -> Result<Revocation, OpenSmError> {
        if !self.requires_grants() {
            return Err(OpenSmError::GrantsNotRequired);
        }
        let _alone = self.serial_unless_grouped().await;
        let mut out = Revocation::default();
        {
            let _admit = self.inner.admit.lock().await;
            let mut st = self.inner.lock();
            let st = &mut *st;
            let record = st
                .nodes
                .get_mut(node)
                .ok_or_else(|| OpenSmError::NodeNotStored(node.clone()))?;
            let (ids, removed) = crate::sm::grant_judge::revoke(record, instance);
            st.consumed.extend(ids.iter().cloned());
            out.revoked_grant_ids = ids;
            out.removed_pkeys = removed;
            st.unsaved.insert(node.clone());
            tracing::warn!(node_id = %node, instance, revoked = ?out.revoked_grant_ids, removed = ?out.removed_pkeys.iter().map(ToString::to_string).collect::<Vec<_>>(), "instance revoked on the fabric side");
        }
        self.commit(None).await?;
        out.sweeps = self.sweeps();
        Ok(out)
    }

    /// Records revocations a peer SM host holds (node, instance, the grant ids it consumed) as
    /// if [`OpenSmBackend::revoke_instance`] had been called here for each, then writes and
    /// confirms like a set when any changed something. Union only: what this host already holds
    /// changes nothing, and nothing is ever un-revoked. A node this host holds no set for gets a
    /// record with the revocations alone, so its first set here is judged against them.
    /// Returns the revocations that changed something.
    pub async fn learn_revocations(
        &self,
        learned: &[(NodeId, String, BTreeSet<String>)],
    ) -> Result<Vec<(NodeId, String)>, OpenSmError> {
        let new = |st: &State| {
            learned.iter().any(|(node, instance, ids)| {
                st.nodes
                    .get(node)
                    .is_none_or(|r| !crate::sm::grant_judge::holds_revocation(r, instance, ids))
            })
        };
        if !self.requires_grants() || !new(&self.inner.lock()) {
            return Ok(Vec::new());
        }
        let _alone = self.serial_unless_grouped().await;
        let mut changed = Vec::new();
        {
            let _admit = self.inner.admit.lock().await;
            let mut st = self.inner.lock();
            let st = &mut *st;
            for (node, instance, grant_ids) in learned {
                let record = st
                    .nodes
                    .entry(node.clone())
                    .or_insert_with(|| StoredNode::revocations_only(node.clone()));
                let Some((ids, removed)) =
                    crate::sm::grant_judge::learn_revocation(record, instance, grant_ids)
                else {
                    continue;
                };
                st.consumed.extend(ids.iter().cloned());
                st.unsaved.insert(node.clone());
                tracing::warn!(node_id = %node, instance, revoked = ?ids, removed = ?removed.iter().map(ToString::to_string).collect::<Vec<_>>(), "instance revoked on a peer SM host: revoked here too");
                changed.push((node.clone(), instance.clone()));
            }
        }
        if !changed.is_empty() {
            self.commit(None).await?;
        }
        Ok(changed)
    }

    /// The ports OpenSM's last accepted partitions file puts in `pkey` (the copy kept beside
    /// the file; the file itself before any write was accepted), with the node each belongs to
    /// as the stored sets say.
    pub async fn partition_members(
        &self,
        pkey: PKey,
    ) -> Result<Vec<(super::members::FileMember, Option<NodeId>)>, OpenSmError> {
        let file = self.inner.config.partitions_file.clone();
        let bytes = blocking(move || {
            Ok(match read_optional(&accepted_copy_path(&file))? {
                Some(b) => b,
                None => read_or_empty(&file)?,
            })
        })
        .await?;
        let members = super::members::members_of(&bytes, pkey).ok_or_else(|| {
            OpenSmError::Io(Arc::new(std::io::Error::other(
                "the accepted partitions file does not parse",
            )))
        })?;
        let st = self.inner.lock();
        Ok(members
            .into_iter()
            .map(|m| {
                let owner = st.guid_owner.get(&m.guid).cloned();
                (m, owner)
            })
            .collect())
    }

    /// Every stored node's set (for the fabric's view of a partition).
    pub fn nodes(&self) -> Vec<StoredNode> {
        self.inner.lock().nodes.values().cloned().collect()
    }

    /// The node a port GUID belongs to, as the SM host's stored sets say.
    pub fn owner_of(&self, guid: Guid) -> Option<NodeId> {
        self.inner.lock().guid_owner.get(&guid).cloned()
    }

    /// Asks the fabric about every GUID of `desired` not already in the node's stored set
    /// (and reads the inventory), outside the admission lock. Fails closed. Asks nothing for a
    /// set the generation check will refuse anyway (that refusal must not wait for the SA).
    async fn gather_evidence(
        &self,
        directory: &Arc<dyn PortDirectory>,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<Evidence, OpenSmError> {
        let held: BTreeSet<Guid> = {
            let st = self.inner.lock();
            match st.nodes.get(&desired.node_id) {
                Some(old) if st.fence(old, desired, generation).is_err() => {
                    return Ok(Evidence::default());
                }
                Some(old) => old.memberships.port_guids.iter().copied().collect(),
                None => BTreeSet::new(),
            }
        };
        let new: Vec<Guid> = desired
            .port_guids
            .iter()
            .copied()
            .filter(|g| !held.contains(g))
            .collect();
        if new.is_empty() {
            return Ok(Evidence::default());
        }
        // Fail closed: a port the fabric or the inventory cannot speak for is refused (with
        // its keys); the rest of the set, its removals first, does not wait for it.
        let unproven = |e: OpenSmError| {
            tracing::warn!(node_id = %desired.node_id, error = %e, "port claim refused");
            Evidence {
                failure: Some(e),
                ..Evidence::default()
            }
        };
        let facts = match directory.facts(&new).await {
            Ok(facts) => facts,
            Err(e) => return Ok(unproven(OpenSmError::FabricUnreachable(e))),
        };
        let inventory = match &self.inner.config.ownership.inventory_file {
            Some(path) => {
                let path = path.clone();
                match tokio::task::spawn_blocking(move || Inventory::load(&path))
                    .await
                    .map_err(|e| task_failed("inventory", e))?
                {
                    Ok(inventory) => inventory,
                    Err(e) => return Ok(unproven(OpenSmError::Inventory(e))),
                }
            }
            None => Inventory::default(),
        };
        Ok(Evidence {
            facts,
            inventory,
            failure: None,
        })
    }

    /// Judges every GUID of `desired` not already in the node's stored set. Returns the ports
    /// that move from another node, and the refused ports with why (each logged).
    fn prove_claims(
        &self,
        st: &State,
        desired: &NodeMemberships,
        evidence: &Evidence,
    ) -> (BTreeMap<Guid, NodeId>, BTreeMap<Guid, OpenSmError>) {
        let held: BTreeSet<Guid> = st
            .nodes
            .get(&desired.node_id)
            .map(|n| n.memberships.port_guids.iter().copied().collect())
            .unwrap_or_default();
        let mut moves = BTreeMap::new();
        let mut refused = BTreeMap::new();
        for g in desired.port_guids.iter().filter(|g| !held.contains(g)) {
            if let Some(e) = &evidence.failure {
                refused.insert(*g, e.clone());
                continue;
            }
            let holder = st.guid_owner.get(g);
            let verdict = judge(
                desired.node_id.as_str(),
                *g,
                &evidence.facts,
                &self.inner.config.ownership.description_patterns,
                &evidence.inventory,
                holder.map(NodeId::as_str),
            );
            match verdict {
                Ok(Proof::Moved { from, description }) => {
                    tracing::info!(node_id = %desired.node_id, guid = %g, from = %from, description = %description, "port moves to the node the fabric shows it in");
                    if let Some(holder) = holder {
                        moves.insert(*g, holder.clone());
                    }
                }
                Ok(proof) => {
                    tracing::debug!(node_id = %desired.node_id, guid = %g, ?proof, "port claim proven");
                }
                Err(refusal) => {
                    tracing::warn!(node_id = %desired.node_id, guid = %g, reason = %refusal, "port claim refused");
                    let e = match refusal {
                        Refusal::Forbidden { .. } | Refusal::OwnedByOther { .. } => {
                            OpenSmError::PortForbidden(refusal)
                        }
                        Refusal::NotAsked { .. } | Refusal::NotShown { .. } => {
                            OpenSmError::PortNotShown(refusal)
                        }
                    };
                    refused.insert(*g, e);
                }
            }
        }
        (moves, refused)
    }

    /// Request checks against the other nodes and the operator's part of the file. Ports in
    /// `moves` were proven to have moved to this node and may be held by another.
    fn admissible(
        &self,
        st: &State,
        desired: &NodeMemberships,
        moves: &BTreeMap<Guid, NodeId>,
    ) -> Result<(), OpenSmError> {
        for g in &desired.port_guids {
            if let Some(owner) = st.guid_owner.get(g) {
                if owner != &desired.node_id && moves.get(g) != Some(owner) {
                    return Err(OpenSmError::PortHeld {
                        port: *g,
                        owner: owner.clone(),
                    });
                }
            }
        }
        if !desired.keys.is_empty() && !self.inner.config.allow_full_default {
            if let Some(why) = st.health.all_full {
                return Err(OpenSmError::InsecureDefault(why));
            }
        }
        check_operator_keys(&st.operator, desired.keys.keys())?;
        let size = self.inner.config.pkey_table_size;
        for g in &desired.port_guids {
            let n = st
                .operator
                .table_entries_for(*g, self.inner.config.allow_both_pkeys)
                + desired.keys.len();
            if n > size {
                return Err(OpenSmError::TableFull(TableOverflow {
                    port: Some(*g),
                    needed: n,
                    capacity: size,
                }));
            }
        }
        Ok(())
    }

    async fn serial_unless_grouped(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        if self.inner.config.group_commit {
            None
        } else {
            Some(self.inner.serial.lock().await)
        }
    }

    /// Queues a commit and waits for the one that carries it (without group commit the caller
    /// holds the serial lock and commits itself). `node`: the node whose set the caller
    /// carries, answered with an error when the commit left that set out of the file.
    async fn commit(&self, node: Option<&NodeId>) -> CommitResult {
        if !self.inner.config.group_commit {
            let (snapshot, unsaved) = self.inner.lock().snapshot();
            return self
                .inner
                .commit_once(&snapshot, unsaved)
                .await
                .and_then(|c| c.answer(node));
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = self.inner.lock();
            st.pending.push((node.cloned(), tx));
            !std::mem::replace(&mut st.committing, true)
        };
        if start {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move { inner.commit_loop().await });
        }
        rx.await.map_err(|_| OpenSmError::Task {
            what: "commit",
            source: None,
        })?
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that matters
        // more than stopping would: keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn commit_loop(self: Arc<Self>) {
        loop {
            self.linger().await;
            let (waiters, (snapshot, unsaved)) = {
                let mut st = self.lock();
                if st.pending.is_empty() {
                    st.committing = false;
                    return;
                }
                (std::mem::take(&mut st.pending), st.snapshot())
            };
            let result = self.commit_once(&snapshot, unsaved).await;
            for (node, w) in waiters {
                let answer = match &result {
                    Ok(c) => c.answer(node.as_ref()),
                    Err(e) => Err(e.clone()),
                };
                let _ = w.send(answer);
            }
        }
    }

    /// Before a group is taken: while `set_node` calls keep arriving (one within every
    /// `commit_linger_ms`) or are still being admitted, waits for them, up to
    /// `commit_linger_max_ms`, so a burst shares one write + sweep instead of its first request
    /// going out alone. A lone request waits one `commit_linger_ms`.
    async fn linger(&self) {
        let gap = Duration::from_millis(self.config.commit_linger_ms);
        if gap.is_zero() {
            return;
        }
        let until =
            tokio::time::Instant::now() + Duration::from_millis(self.config.commit_linger_max_ms);
        let mut seen = self.arrivals.load(Ordering::SeqCst);
        loop {
            let wake = (tokio::time::Instant::now() + gap).min(until);
            tokio::time::sleep_until(wake).await;
            let now = self.arrivals.load(Ordering::SeqCst);
            let quiet = now == seen && self.admitting.load(Ordering::SeqCst) == 0;
            if quiet || wake >= until {
                return;
            }
            seen = now;
        }
    }

    fn plan(&self, nodes: &BTreeMap<NodeId, StoredNode>, operator: &PartitionsConf) -> RegionPlan {
        let mut tenants: BTreeMap<PKey, TenantEntry> = BTreeMap::new();
        for n in nodes.values() {
            for (key, setting) in &n.memberships.keys {
                let t = tenants.entry(*key).or_insert_with(|| TenantEntry {
                    name: String::new(),
                    members: BTreeMap::new(),
                });
                // Nodes are visited in node-id order: the first usable name wins.
                if t.name.is_empty() && is_safe_key_name(&setting.name) {
                    t.name = setting.name.clone();
                }
                // Each key goes to its own ports (every port of the node when it names none).
                for g in &n.memberships.guids_for(*key) {
                    let m = t.members.entry(*g).or_insert(setting.membership);
                    // Full wins if two nodes ever listed the same port.
                    *m = (*m).min(setting.membership);
                }
            }
        }
        tenants.retain(|_, t| !t.members.is_empty());
        for (key, t) in tenants.iter_mut() {
            t.name = tenant_entry_name(*key, &t.name);
        }
        RegionPlan {
            default_entry: (!operator.has_explicit_default())
                .then_some(self.config.default_membership),
            tenants,
        }
    }

    /// Saves the persisted part of the health after `change`.
    async fn save_commit(&self, change: impl FnOnce(&mut CommitState)) -> Result<(), OpenSmError> {
        self.save_group(&mut Vec::new(), Some(change)).await
    }

    /// Stores the `unsaved` node sets and, when `change` is given, the persisted part of the
    /// health after it, in one transaction; `unsaved` is emptied once they are durable.
    async fn save_group(
        &self,
        unsaved: &mut Vec<StoredNode>,
        change: Option<impl FnOnce(&mut CommitState)>,
    ) -> Result<(), OpenSmError> {
        let identity = self.reloader.log_identity();
        let state = change.map(|change| {
            let mut st = self.lock();
            change(&mut st.health.commit);
            st.health.commit.log_mark = Some(LogMark {
                offset: st.health.log_mark,
                file: identity,
            });
            st.health.commit.clone()
        });
        if unsaved.is_empty() && state.is_none() {
            return Ok(());
        }
        let store = Arc::clone(&self.store);
        let nodes = std::mem::take(unsaved);
        let (nodes, result) = tokio::task::spawn_blocking(move || {
            let result = store.put_group(&nodes, state.as_ref());
            (nodes, result)
        })
        .await
        .map_err(|e| task_failed("store", e))?;
        if let Err(e) = result {
            *unsaved = nodes;
            return Err(OpenSmError::Store(e));
        }
        Ok(())
    }

    /// Writes `bytes` and makes OpenSM re-read them: the outer error when the file could not be
    /// written, else `Ok(true)` when OpenSM's log shows a whole heavy sweep started after the
    /// write and no error (the sweep fence of [`super::reload`]). Moves the log mark past the
    /// verdict.
    async fn write_and_reload(
        &self,
        bytes: Vec<u8>,
    ) -> Result<Result<bool, ReloadError>, OpenSmError> {
        let path = self.config.partitions_file.clone();
        // Held through the write and OpenSM's verdict: `opensm apply` and a cooperating
        // operator's editor take the same advisory lock.
        let _lock = blocking(move || {
            let lock = super::operator::lock_live_file(&path)?;
            replace_atomically(&path, &bytes)?;
            Ok(lock)
        })
        .await?;
        // The sweep fence's mark: taken after the file is in place (see `super::reload`).
        let checkpoint = self.reloader.checkpoint();
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let result = self.reloader.reload(checkpoint).await;
        self.lock().health.log_mark = self.reloader.checkpoint();
        Ok(result.map(|r| r.file_read))
    }

    /// Puts the last accepted file back after OpenSM rejected one, and signals OpenSM again.
    /// Returns what that achieved ([`Restored::reread`]: OpenSM was seen re-reading it).
    async fn restore(&self, good: Vec<u8>) -> Restored {
        match self.write_and_reload(good).await {
            Ok(Ok(true)) => Restored::Reread,
            Ok(Ok(false)) => Restored::Unseen {
                waited_ms: self.config.reload_check_ms,
            },
            Ok(Err(e)) => Restored::NotReread(e),
            Err(e) => Restored::Failed(Box::new(e)),
        }
    }

    /// Repairs a rejection OpenSM logged on its own since the last check (an operator's edit it
    /// re-read on a sweep or a SIGHUP, or any rejection logged while the agent was down): keeps
    /// the edit as `<name>.rejected`, restores the last accepted file and raises the rejected
    /// condition with OpenSM's lines and the strict parser's line and reason. The condition
    /// stays until the operator's part changes again and OpenSM accepts the result.
    async fn repair_foreign_rejection(&self) -> Result<(), OpenSmError> {
        let mark = self.lock().health.log_mark;
        let (errors, end) = self.reloader.rejections_since(mark);
        self.lock().health.log_mark = end;
        if errors.is_empty() {
            return Ok(());
        }
        let seen = errors.join(" | ");
        let path = self.config.partitions_file.clone();
        let accepted_path = accepted_copy_path(&path);
        let (current, accepted) = {
            let path = path.clone();
            blocking(move || Ok((read_or_empty(&path)?, read_optional(&accepted_path)?))).await?
        };
        let first = format!(
            "OpenSM rejected the partitions file on a sweep the agent did not trigger ({seen}); \
             the file it read: {}",
            describe(&current)
        );
        let detail = match accepted {
            Some(good) if good != current => {
                // Raised before anything is restored: whoever sees the restored file sees why.
                let restored_part = operator_part(&good);
                self.save_commit(|c| {
                    c.operator_rejected = Some(OperatorRejected {
                        detail: first.clone(),
                        restored_operator_part: restored_part.clone(),
                    })
                })
                .await?;
                {
                    let mut st = self.lock();
                    let earlier = st.health.rejected.take();
                    st.health.rejected = Some(RejectedFile::after(earlier, current.clone()));
                }
                let kept = rejected_copy_path(&path);
                let shown = kept.display().to_string();
                let copy = current.clone();
                let saved = blocking(move || replace_atomically(&kept, &copy)).await;
                self.keep_rejected_bytes(current.clone()).await;
                let restored = self.restore(good).await;
                let reread = restored.reread();
                let kept = match saved {
                    Ok(()) => format!("the rejected file was kept as {shown}"),
                    Err(e) => format!("the rejected file could not be kept ({e})"),
                };
                let detail = format!(
                    "{first}; {kept}; {restored}; fix the operator's part and apply it again"
                );
                self.save_commit(|c| {
                    c.operator_rejected = Some(OperatorRejected {
                        detail: detail.clone(),
                        restored_operator_part: restored_part,
                    });
                    if !reread {
                        c.unconfirmed = Some(detail.clone());
                    }
                })
                .await?;
                detail
            }
            Some(_) => {
                // The file is the accepted one again (a rejection of the agent's own write,
                // already undone): check it again on this commit.
                let detail = format!("{first}; the file on disk is the last accepted one");
                self.save_commit(|c| {
                    c.rejected = Some(detail.clone());
                    c.unconfirmed = Some("OpenSM logged a rejection since the last check".into())
                })
                .await?;
                detail
            }
            None => {
                let detail = format!("{first}; no accepted file is kept to restore: fix the file");
                let part = operator_part(&current);
                self.save_commit(|c| {
                    c.operator_rejected = Some(OperatorRejected {
                        detail: detail.clone(),
                        restored_operator_part: part,
                    })
                })
                .await?;
                detail
            }
        };
        tracing::warn!(detail = %detail, "partitions file rejected");
        Ok(())
    }

    /// Keeps `bytes` as the last rejected file across restarts (best effort: a failure is
    /// logged; the copy in memory still holds for this run).
    async fn keep_rejected_bytes(&self, bytes: Vec<u8>) {
        let path = rejected_bytes_path(&self.config.partitions_file);
        if let Err(e) = blocking(move || replace_atomically(&path, &bytes)).await {
            tracing::warn!(error = %e, "cannot keep the rejected partitions file's bytes");
        }
    }

    /// `operator_file` mode: the operator's part from their file, or `None` (in-place mode, or
    /// their file is refused: the live file's own operator part is kept, and the refusal is
    /// shown as a condition with its line and reason).
    async fn operator_parts(&self) -> Result<Option<super::region::OperatorParts>, OpenSmError> {
        let Some(op) = self.config.operator_file.clone() else {
            return Ok(None);
        };
        let loaded = tokio::task::spawn_blocking(move || super::operator::load_operator_file(&op))
            .await
            .map_err(|e| task_failed("operator file", e))?;
        let mut st = self.lock();
        match loaded {
            Ok((parts, _)) => {
                st.health.operator_file_refused = None;
                Ok(Some(parts))
            }
            Err(e) => {
                let why = format!("{e}; the live partitions file keeps the previous operator part");
                if st.health.operator_file_refused.as_deref() != Some(&why) {
                    tracing::warn!(detail = %why, "operator file refused");
                }
                st.health.operator_file_refused = Some(why);
                Ok(None)
            }
        }
    }

    /// Puts the last accepted file back when the file in place holds bytes OpenSM rejected (a
    /// restore that failed earlier, or in an earlier run).
    async fn retry_restore(&self) -> Result<(), OpenSmError> {
        let Some(rejected) = self
            .lock()
            .health
            .rejected
            .as_ref()
            .map(|r| r.bytes.clone())
        else {
            return Ok(());
        };
        let path = self.config.partitions_file.clone();
        let accepted_path = accepted_copy_path(&path);
        let (current, accepted) =
            blocking(move || Ok((read_or_empty(&path)?, read_optional(&accepted_path)?))).await?;
        match accepted {
            Some(good) if current == rejected && good != current => {
                let restored = self.restore(good).await;
                tracing::warn!(restored = %restored, "the rejected partitions file was still in place");
                if !restored.reread() {
                    let why = restored.to_string();
                    self.save_commit(|c| c.unconfirmed = Some(why)).await?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether the watch should run a commit without a new log line: a rejection whose repair
    /// is not confirmed (a failed or unseen restore), the rejected bytes still in place, or an
    /// operator's rejected edit changed again (to be confirmed and cleared).
    async fn needs_repair(&self) -> bool {
        let (pending, rejected_bytes, restored_part) = {
            let st = self.lock();
            let c = &st.health.commit;
            (
                c.unconfirmed.is_some() && (c.rejected.is_some() || c.operator_rejected.is_some()),
                st.health.rejected.as_ref().map(|r| r.bytes.clone()),
                c.operator_rejected
                    .as_ref()
                    .map(|o| o.restored_operator_part.clone()),
            )
        };
        if pending {
            return true;
        }
        if rejected_bytes.is_none() && restored_part.is_none() {
            return false;
        }
        let path = self.config.partitions_file.clone();
        let Ok(current) = blocking(move || read_or_empty(&path)).await else {
            return false;
        };
        if rejected_bytes.as_deref() == Some(&current[..]) {
            return true;
        }
        restored_part.is_some_and(|part| {
            operator_part(&current) != part && super::parse::parse(&current).is_ok()
        })
    }

    /// One write + sweep of the whole region, answered OK only once the `unsaved` sets are
    /// durable and OpenSM was seen re-reading the file without error. Sets that could not be
    /// stored stay marked unsaved for the next commit.
    async fn commit_once(
        &self,
        nodes: &BTreeMap<NodeId, StoredNode>,
        mut unsaved: Vec<StoredNode>,
    ) -> Result<Committed, OpenSmError> {
        let result = self.commit_steps(nodes, &mut unsaved).await;
        let mut st = self.lock();
        if !unsaved.is_empty() {
            st.unsaved
                .extend(unsaved.into_iter().map(|n| n.memberships.node_id));
        }
        result.map(|detail| Committed {
            detail,
            quarantined: st.health.quarantined.clone(),
        })
    }

    /// The stored sets that no longer pass the whole-file checks against `operator` on their
    /// own (see [`isolation::quarantine_reason`]), with why; logged when newly quarantined.
    fn quarantine(
        &self,
        nodes: &BTreeMap<NodeId, StoredNode>,
        operator: &PartitionsConf,
    ) -> BTreeMap<NodeId, String> {
        let out: BTreeMap<NodeId, String> = nodes
            .iter()
            .filter_map(|(id, n)| {
                isolation::quarantine_reason(
                    operator,
                    &n.memberships,
                    self.config.pkey_table_size,
                    self.config.allow_both_pkeys,
                )
                .map(|e| (id.clone(), e.to_string()))
            })
            .collect();
        let st = self.lock();
        for (id, why) in &out {
            if st.health.quarantined.get(id) != Some(why) {
                tracing::warn!(node_id = %id, reason = %why, "node set quarantined: left out of the partitions file");
            }
        }
        for id in st.health.quarantined.keys() {
            if !out.contains_key(id) {
                tracing::info!(node_id = %id, "node set no longer quarantined");
            }
        }
        out
    }

    async fn commit_steps(
        &self,
        nodes: &BTreeMap<NodeId, StoredNode>,
        unsaved: &mut Vec<StoredNode>,
    ) -> CommitResult {
        self.repair_foreign_rejection().await?;
        self.retry_restore().await?;
        let path = self.config.partitions_file.clone();
        let (current, accepted) = {
            let path = path.clone();
            let shown = path.display().to_string();
            let accepted_path = accepted_copy_path(&path);
            blocking(move || {
                let current = read_or_empty(&path)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{shown}: {e}")))?;
                Ok((current, read_optional(&accepted_path)?))
            })
            .await?
        };
        let parts = match self.operator_parts().await? {
            Some(parts) => parts,
            None => split_region(&current)?,
        };
        let operator = parts.parse()?;
        // A stored set the operator's part now conflicts with is left out; the rest is written.
        let quarantined = self.quarantine(nodes, &operator);
        let served: std::borrow::Cow<'_, BTreeMap<NodeId, StoredNode>> = if quarantined.is_empty() {
            std::borrow::Cow::Borrowed(nodes)
        } else {
            std::borrow::Cow::Owned(
                nodes
                    .iter()
                    .filter(|(id, _)| !quarantined.contains_key(*id))
                    .map(|(id, n)| (id.clone(), n.clone()))
                    .collect(),
            )
        };
        {
            let mut st = self.lock();
            st.health.all_full = all_full_of(&self.config, &operator);
            st.health.quarantined = quarantined;
            st.operator = operator.clone();
        }
        let plan = self.plan(&served, &operator);
        check_operator_keys(&operator, plan.tenants.keys())?;
        let region = render_region(&plan);
        let bytes = compose(&parts, &region);
        let whole = check_composed(
            &bytes,
            &region,
            &plan,
            TableLimits {
                table_size: self.config.pkey_table_size,
                allow_both_pkeys: self.config.allow_both_pkeys,
            },
        )?;
        check_operator_unchanged(&operator, &whole, &plan)?;
        let (confirmed, held) = {
            let st = self.lock();
            (
                st.health.commit.unconfirmed.is_none(),
                st.health
                    .rejected
                    .as_ref()
                    .and_then(|r| r.holds(&bytes, accepted.as_deref())),
            )
        };
        if bytes == current && confirmed && accepted.as_deref() == Some(&current[..]) {
            self.save_group(unsaved, None::<fn(&mut CommitState)>)
                .await?;
            return Ok("partitions file already up to date (OpenSM accepted it)".into());
        }
        if let Some(left) = held {
            let why = self
                .lock()
                .health
                .commit
                .rejected
                .clone()
                .unwrap_or_default();
            return Err(OpenSmError::Rejected(Rejection::Repeated {
                earlier: why,
                wait_s: left.as_secs().max(1),
            }));
        }
        self.save_group(
            unsaved,
            Some(|c: &mut CommitState| {
                c.unconfirmed = Some("a write is in progress or was interrupted".into())
            }),
        )
        .await?;
        match self.write_and_reload(bytes.clone()).await? {
            Ok(true) => {
                let copy = accepted_copy_path(&path);
                let good = bytes.clone();
                blocking(move || replace_atomically(&copy, &good)).await?;
                self.lock().health.rejected = None;
                let gone = rejected_bytes_path(&path);
                let _ = blocking(move || match std::fs::remove_file(&gone) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .await;
                let written_part = operator_part(&bytes);
                self.save_commit(|c| {
                    c.unconfirmed = None;
                    c.rejected = None;
                    // The operator's rejected edit is cleared once the operator's part changed
                    // and OpenSM accepted it; the restored part alone does not clear it.
                    if c.operator_rejected
                        .as_ref()
                        .is_some_and(|o| o.restored_operator_part != written_part)
                    {
                        c.operator_rejected = None;
                    }
                })
                .await?;
                Ok(format!(
                    "partitions file written ({} keys), heavy sweep requested, OpenSM re-read it without error",
                    plan.tenants.len()
                ))
            }
            Ok(false) => {
                let e = OpenSmError::Unconfirmed {
                    written_keys: plan.tenants.len(),
                    waited_ms: self.config.reload_check_ms,
                };
                let why = e.to_string();
                self.save_commit(|c| c.unconfirmed = Some(why)).await?;
                Err(e)
            }
            Err(ReloadError::Unreachable(source)) => {
                let e = OpenSmError::Unreachable {
                    written_keys: Some(plan.tenants.len()),
                    source,
                };
                let why = e.to_string();
                self.save_commit(|c| c.unconfirmed = Some(why)).await?;
                Err(e)
            }
            Err(ReloadError::Rejected(lines)) => {
                {
                    let mut st = self.lock();
                    let earlier = st.health.rejected.take();
                    st.health.rejected = Some(RejectedFile::after(earlier, bytes.clone()));
                }
                self.keep_rejected_bytes(bytes.clone()).await;
                // Raised before anything is restored: whoever sees the restored file sees why.
                let first = Rejection::written_before_restore(&lines);
                self.save_commit(|c| c.rejected = Some(first.clone()))
                    .await?;
                let fallback = accepted.or_else(|| (current != bytes).then_some(current));
                let restored = match fallback {
                    Some(good) => self.restore(good).await,
                    None => Restored::NothingKept,
                };
                let reread = restored.reread();
                let rejection = Rejection::Written { lines, restored };
                let why = rejection.to_string();
                tracing::error!(detail = %why, "partitions file rejected");
                self.save_commit(|c| {
                    c.rejected = Some(why.clone());
                    c.unconfirmed = (!reread).then(|| why.clone());
                })
                .await?;
                Err(OpenSmError::Rejected(rejection))
            }
        }
    }
}

/// Where the Default entry (the operator's, or the region's when the operator has none) grants
/// every port full membership.
fn all_full_of(config: &OpenSmConfig, operator: &PartitionsConf) -> Option<FullDefault> {
    if operator.has_explicit_default() {
        default_grants_all_full(operator)
    } else if config.default_membership == Membership::Full {
        Some(FullDefault::Configured)
    } else {
        None
    }
}

/// Looks at OpenSM's log every `every` (the first time after `first`) for rejections the agent
/// did not cause, and repairs them with a commit; also retries a repair that was not confirmed
/// and confirms an operator's new edit after a rejected one. Ends when the backend is dropped.
async fn watch_log(inner: Weak<Inner>, first: Duration, every: Duration) {
    let mut scanned = 0u64;
    let mut wait = first;
    let mut at_start = first.is_zero();
    loop {
        tokio::time::sleep(wait).await;
        wait = every;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mark = inner.lock().health.log_mark;
        let (errors, end) = inner.reloader.rejections_since(scanned.max(mark));
        scanned = end;
        let start = std::mem::take(&mut at_start);
        if let Err(e) = inner.operator_parts().await {
            tracing::warn!(error = %e, "operator file check");
        }
        if !errors.is_empty() || start || inner.needs_repair().await {
            let backend = OpenSmBackend { inner };
            if let Err(e) = backend.resync().await {
                tracing::warn!(error = %e, "repair after a rejected partitions file");
            }
        }
    }
}

/// Checks a desired set on its own ([`NodeMemberships::validate`]) and its key count.
pub fn validate(desired: &NodeMemberships, table_size: usize) -> Result<(), OpenSmError> {
    desired.validate().map_err(OpenSmError::Invalid)?;
    // The default partition takes one entry.
    if desired.keys.len() + 1 > table_size {
        return Err(OpenSmError::TableFull(TableOverflow {
            port: None,
            needed: desired.keys.len() + 1,
            capacity: table_size,
        }));
    }
    Ok(())
}

fn task_failed(what: &'static str, e: tokio::task::JoinError) -> OpenSmError {
    OpenSmError::Task {
        what,
        source: Some(Arc::new(e)),
    }
}

#[async_trait]
impl SubnetManager for OpenSmBackend {
    fn backend(&self) -> &'static str {
        "opensm"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let mut own = desired.clone();
        own.node_id = NodeId::parse(&self.inner.local_node_id).map_err(OpenSmError::Invalid)?;
        // The SM host's own ports, read by its own observer: not a claim by another node, so
        // the fabric is not asked (the other rules, including other nodes' ports, still hold).
        let outcome = self.set_node_checked(own, &[], generation, false).await?;
        Ok(ApplyOutcome {
            detail: outcome.detail,
        })
    }

    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let mut own = desired.clone();
        own.node_id = NodeId::parse(&self.inner.local_node_id).map_err(OpenSmError::Invalid)?;
        let outcome = self
            .set_node_checked(own, grants, generation, false)
            .await?;
        Ok(ApplyOutcome {
            detail: outcome.detail,
        })
    }

    fn conditions(&self) -> Vec<Condition> {
        self.conditions_now()
    }
}

impl OpenSmBackend {
    /// The standing conditions of the partitions file and OpenSM, as the SM host sees them now:
    /// the Default entry grants `ALL=full`, OpenSM rejected a file (last accepted one restored),
    /// the last write is unconfirmed.
    pub fn conditions_now(&self) -> Vec<Condition> {
        let st = self.inner.lock();
        let h = &st.health;
        let mut out = Vec::new();
        if let Some(why) = &h.all_full {
            let ack = if self.inner.config.allow_full_default {
                "acknowledged by allow_full_default = true"
            } else {
                "tenant keys are not served until allow_full_default = true"
            };
            out.push(Condition {
                kind: ConditionKind::OperatorDefaultAllFull,
                detail: format!("{why} ({ack})"),
            });
        }
        let rejected: Vec<&str> = [
            h.commit.rejected.as_deref(),
            h.commit
                .operator_rejected
                .as_ref()
                .map(|o| o.detail.as_str()),
            h.operator_file_refused.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !rejected.is_empty() {
            out.push(Condition {
                kind: ConditionKind::PartitionsFileRejected,
                detail: rejected.join(" | "),
            });
        }
        if let Some(why) = &h.commit.unconfirmed {
            out.push(Condition {
                kind: ConditionKind::PartitionsFileUnconfirmed,
                detail: why.clone(),
            });
        }
        if !h.quarantined.is_empty() {
            let nodes: Vec<String> = h
                .quarantined
                .iter()
                .map(|(node, why)| format!("node {node}: {why}"))
                .collect();
            out.push(Condition {
                kind: ConditionKind::NodeSetQuarantined,
                detail: format!(
                    "{}; left out of the partitions file (its ports hold none of its keys) until the node sends a set that passes",
                    nodes.join(" | ")
                ),
            });
        }
        out
    }
}
