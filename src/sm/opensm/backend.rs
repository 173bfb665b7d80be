//! The SM host's backend: merges every node's desired memberships into the agent's region of
//! `partitions.conf`, writes it atomically and forces a heavy sweep.
//!
//! Group commit: a request that arrives while a write + sweep is in flight joins the next one,
//! so a burst from hundreds of nodes costs a handful of sweeps while a lone request goes out at
//! once. Each caller's future resolves when the write + sweep containing its change completes.

use super::file::{read_or_empty, replace_atomically};
use super::model::PartitionsConf;
use super::region::{
    check_composed, check_operator_keys, compose, render_region, split_region, RegionError,
    RegionPlan, TableLimits, TenantEntry,
};
use super::reload::{OpenSmReloader, ReloadError, Reloader};
use super::render::is_safe_name;
use super::store::{NodeMembershipStore, StoredNode};
use super::OpenSmConfig;
use crate::domain::{validate_label, Guid, LabelRules, NodeMemberships, PKey};
use crate::sm::{ApplyOutcome, SmError, SubnetManager};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use thiserror::Error;
use tokio::sync::oneshot;

/// Node ids: 1-128 characters `[A-Za-z0-9._:-]`.
const NODE_ID_RULES: LabelRules = LabelRules {
    max_len: 128,
    punctuation: "._:-",
};
/// Most fabric ports one node may list.
pub const MAX_PORTS_PER_NODE: usize = 64;

/// Why a request was not applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OpenSmError {
    /// Bad node id, GUID, key or name.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A port would hold more keys than its table.
    #[error("P_Key table full: {0}")]
    TableFull(String),
    /// The operator's part of the file does not load: nothing was written.
    #[error("{0}")]
    OperatorFile(String),
    /// A requested key belongs to the operator's part of the file.
    #[error("{0}")]
    OperatorKey(String),
    /// The composed file failed the final check: nothing was written.
    #[error("{0}")]
    Composed(String),
    /// OpenSM's log shows it rejected the written file.
    #[error("{0}")]
    Rejected(String),
    /// OpenSM could not be signalled.
    #[error("{0}")]
    Unreachable(String),
    /// Reading or writing the file failed.
    #[error("partitions file: {0}")]
    Io(String),
    /// The membership store failed.
    #[error("{0}")]
    Store(String),
}

impl From<RegionError> for OpenSmError {
    fn from(e: RegionError) -> Self {
        match e {
            RegionError::OperatorFile(_) => OpenSmError::OperatorFile(e.to_string()),
            RegionError::OperatorKey(m) => OpenSmError::OperatorKey(m),
            RegionError::TableFull(m) => OpenSmError::TableFull(m),
            RegionError::Composed(_) => OpenSmError::Composed(e.to_string()),
        }
    }
}

impl From<ReloadError> for OpenSmError {
    fn from(e: ReloadError) -> Self {
        match e {
            ReloadError::Unreachable(_) => OpenSmError::Unreachable(e.to_string()),
            ReloadError::Rejected(_) => OpenSmError::Rejected(e.to_string()),
        }
    }
}

impl From<OpenSmError> for SmError {
    fn from(e: OpenSmError) -> Self {
        match e {
            OpenSmError::Unreachable(_) | OpenSmError::Io(_) | OpenSmError::Store(_) => {
                SmError::Unavailable(e.to_string())
            }
            _ => SmError::Refused(e.to_string()),
        }
    }
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

struct State {
    nodes: BTreeMap<String, StoredNode>,
    guid_owner: BTreeMap<Guid, String>,
    operator: PartitionsConf,
    pending: Vec<oneshot::Sender<CommitResult>>,
    committing: bool,
}

struct Inner {
    config: OpenSmConfig,
    local_node_id: String,
    store: Arc<dyn NodeMembershipStore>,
    reloader: Arc<dyn Reloader>,
    state: Mutex<State>,
    /// Orders store writes with the in-memory update.
    admit: tokio::sync::Mutex<()>,
    /// Held by a request from admission to reload when group commit is off.
    serial: tokio::sync::Mutex<()>,
    sweeps: AtomicU64,
    writes: AtomicU64,
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

    /// Builds the backend with any [`Reloader`] (tests use a fake one).
    pub fn with_reloader(
        config: OpenSmConfig,
        local_node_id: String,
        store: Arc<dyn NodeMembershipStore>,
        reloader: Arc<dyn Reloader>,
    ) -> Result<Self, OpenSmError> {
        let stored = store
            .load_all()
            .map_err(|e| OpenSmError::Store(e.to_string()))?;
        let mut nodes = BTreeMap::new();
        let mut guid_owner = BTreeMap::new();
        for n in stored {
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
        Ok(OpenSmBackend {
            inner: Arc::new(Inner {
                config,
                local_node_id,
                store,
                reloader,
                state: Mutex::new(State {
                    nodes,
                    guid_owner,
                    operator,
                    pending: Vec::new(),
                    committing: false,
                }),
                admit: tokio::sync::Mutex::new(()),
                serial: tokio::sync::Mutex::new(()),
                sweeps: AtomicU64::new(0),
                writes: AtomicU64::new(0),
            }),
        })
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

    /// Rewrites the region from the stored state (at start, or after an operator fixed the file).
    pub async fn resync(&self) -> Result<SetOutcome, OpenSmError> {
        let _alone = self.serial_unless_grouped().await;
        let detail = self.commit().await?;
        Ok(SetOutcome {
            sweeps: self.sweeps(),
            detail,
        })
    }

    /// Replaces one node's desired set (declarative). Returns once the write + sweep containing
    /// it completed; a generation older than the stored one is ignored.
    pub async fn set_node(
        &self,
        desired: NodeMemberships,
        generation: u64,
    ) -> Result<SetOutcome, OpenSmError> {
        validate(&desired, self.inner.config.pkey_table_size)?;
        // Without group commit each request is admitted and written alone: one write and one
        // sweep per request.
        let _alone = self.serial_unless_grouped().await;
        {
            let _admit = self.inner.admit.lock().await;
            {
                let st = self.inner.lock();
                if let Some(old) = st.nodes.get(&desired.node_id) {
                    if old.generation > generation {
                        return Ok(SetOutcome {
                            sweeps: self.sweeps(),
                            detail: format!(
                                "generation {generation} is older than the stored {}: ignored",
                                old.generation
                            ),
                        });
                    }
                }
                self.admissible(&st, &desired)?;
            }
            let record = StoredNode {
                memberships: desired.clone(),
                generation,
            };
            let store = Arc::clone(&self.inner.store);
            let put = record.clone();
            tokio::task::spawn_blocking(move || store.put(&put))
                .await
                .map_err(|e| OpenSmError::Store(e.to_string()))?
                .map_err(|e| OpenSmError::Store(e.to_string()))?;
            let mut st = self.inner.lock();
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
            st.nodes.insert(desired.node_id.clone(), record);
        }
        let detail = self.commit().await?;
        Ok(SetOutcome {
            sweeps: self.sweeps(),
            detail,
        })
    }

    /// Request checks against the other nodes and the operator's part of the file.
    fn admissible(&self, st: &State, desired: &NodeMemberships) -> Result<(), OpenSmError> {
        for g in &desired.port_guids {
            if let Some(owner) = st.guid_owner.get(g) {
                if owner != &desired.node_id {
                    return Err(OpenSmError::Invalid(format!(
                        "port {g} belongs to node {owner:?}"
                    )));
                }
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
                return Err(OpenSmError::TableFull(format!(
                    "port {g} would need {n} P_Key table entries (default partition and operator entries included) but holds {size}"
                )));
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
    /// holds the serial lock and commits itself).
    async fn commit(&self) -> CommitResult {
        if !self.inner.config.group_commit {
            let snapshot = self.inner.lock().nodes.clone();
            return self.inner.commit_once(&snapshot).await;
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = self.inner.lock();
            st.pending.push(tx);
            !std::mem::replace(&mut st.committing, true)
        };
        if start {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move { inner.commit_loop().await });
        }
        rx.await
            .map_err(|_| OpenSmError::Io("the commit task ended without an answer".into()))?
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
            let (waiters, snapshot) = {
                let mut st = self.lock();
                if st.pending.is_empty() {
                    st.committing = false;
                    return;
                }
                (std::mem::take(&mut st.pending), st.nodes.clone())
            };
            let result = self.commit_once(&snapshot).await;
            for w in waiters {
                let _ = w.send(result.clone());
            }
        }
    }

    fn plan(&self, nodes: &BTreeMap<String, StoredNode>, operator: &PartitionsConf) -> RegionPlan {
        let mut tenants: BTreeMap<PKey, TenantEntry> = BTreeMap::new();
        for n in nodes.values() {
            for (key, setting) in &n.memberships.keys {
                let t = tenants.entry(*key).or_insert_with(|| TenantEntry {
                    name: String::new(),
                    members: BTreeMap::new(),
                });
                // Nodes are visited in node-id order: the first usable name wins.
                if t.name.is_empty() && is_safe_name(&setting.name) {
                    t.name = setting.name.clone();
                }
                for g in &n.memberships.port_guids {
                    let m = t.members.entry(*g).or_insert(setting.membership);
                    // Full wins if two nodes ever listed the same port.
                    *m = (*m).min(setting.membership);
                }
            }
        }
        tenants.retain(|_, t| !t.members.is_empty());
        for (key, t) in tenants.iter_mut() {
            if t.name.is_empty() {
                t.name = format!("pkey_{:04x}", key.base());
            }
        }
        RegionPlan {
            default_entry: (!operator.has_explicit_default())
                .then_some(self.config.default_membership),
            tenants,
        }
    }

    /// One write + sweep of the whole region.
    async fn commit_once(&self, nodes: &BTreeMap<String, StoredNode>) -> CommitResult {
        let path = self.config.partitions_file.clone();
        let current = {
            let path = path.clone();
            let shown = path.display().to_string();
            tokio::task::spawn_blocking(move || read_or_empty(&path))
                .await
                .map_err(|e| OpenSmError::Io(e.to_string()))?
                .map_err(|e| OpenSmError::Io(format!("{shown}: {e}")))?
        };
        let parts = split_region(&current)?;
        let operator = parts.parse()?;
        let plan = self.plan(nodes, &operator);
        check_operator_keys(&operator, plan.tenants.keys())?;
        let region = render_region(&plan);
        let bytes = compose(&parts, &region);
        check_composed(
            &bytes,
            &region,
            &plan,
            TableLimits {
                table_size: self.config.pkey_table_size,
                allow_both_pkeys: self.config.allow_both_pkeys,
            },
        )?;
        self.lock().operator = operator;
        if bytes == current {
            return Ok("partitions file already up to date".into());
        }
        let checkpoint = self.reloader.checkpoint();
        tokio::task::spawn_blocking(move || replace_atomically(&path, &bytes))
            .await
            .map_err(|e| OpenSmError::Io(e.to_string()))?
            .map_err(|e| OpenSmError::Io(e.to_string()))?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let report = self.reloader.reload(checkpoint).await?;
        Ok(if report.file_read {
            format!(
                "partitions file written ({} keys), heavy sweep requested, OpenSM re-read it without error",
                plan.tenants.len()
            )
        } else {
            format!(
                "partitions file written ({} keys), heavy sweep requested, OpenSM not yet seen re-reading it",
                plan.tenants.len()
            )
        })
    }
}

/// Checks a desired set on its own: node id, GUIDs, names, key count.
pub fn validate(desired: &NodeMemberships, table_size: usize) -> Result<(), OpenSmError> {
    validate_label("node_id", &desired.node_id, NODE_ID_RULES)
        .map_err(|e| OpenSmError::Invalid(e.to_string()))?;
    if desired.port_guids.len() > MAX_PORTS_PER_NODE {
        return Err(OpenSmError::Invalid(format!(
            "{} port GUIDs, at most {MAX_PORTS_PER_NODE}",
            desired.port_guids.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for g in &desired.port_guids {
        if g.0 == 0 {
            return Err(OpenSmError::Invalid("port GUID 0 is not a port".into()));
        }
        if !seen.insert(*g) {
            return Err(OpenSmError::Invalid(format!("port GUID {g} listed twice")));
        }
    }
    for (key, s) in &desired.keys {
        if !s.name.is_empty() && !is_safe_name(&s.name) {
            return Err(OpenSmError::Invalid(format!(
                "key {key}: name {:?} must be 1-31 characters [A-Za-z0-9_.-]",
                s.name
            )));
        }
    }
    // The default partition takes one entry.
    if desired.keys.len() + 1 > table_size {
        return Err(OpenSmError::TableFull(format!(
            "{} keys plus the default partition exceed the {table_size}-entry P_Key table",
            desired.keys.len()
        )));
    }
    Ok(())
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
        own.node_id = self.inner.local_node_id.clone();
        let outcome = self.set_node(own, generation).await?;
        Ok(ApplyOutcome {
            detail: outcome.detail,
        })
    }
}
