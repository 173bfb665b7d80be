//! The SM host's backend: merges every node's desired memberships into the agent's region of
//! `partitions.conf`, writes it atomically and forces a heavy sweep; the glue between
//! [`super::admission`] (what of a set is admitted), [`super::group_commit`] (requests during a
//! commit share the next one) and [`super::file_commit`] (one write, confirmed by OpenSM), as
//! [`crate::sm::SubnetManager`].
//!
//! Group commit: a request that arrives while a write + sweep is in flight joins the next one,
//! so a burst from hundreds of nodes costs a handful of sweeps while a lone request goes out at
//! once. Each caller's future resolves when the write + sweep containing its change completes.
//! An admitted set is held in memory and marked unsaved; each commit first stores every unsaved
//! set of its group, with the commit state marking the write in progress, in one store
//! transaction, then writes the file. A set is answered OK only once it is durable and OpenSM
//! was seen re-reading a file containing it; a file never holds a set that is not durable.

use super::admission::{gather_evidence, lock, requires_grants, Admitted, Carried, Posture, State};
use super::config::OpenSmConfig;
use super::error::OpenSmError;
use super::file::{accepted_copy_path, read_or_empty};
use super::file_commit::{
    all_full_of, read_optional, watch_log, CommitResult, Committed, FileCommitter, Health,
};
use super::group_commit::{GroupCommit, NodePace};
use super::ownership::{PortDirectory, UmadDirectory};
use super::region::split_region;
use super::reload::{OpenSmReloader, Reloader};
use super::repair::{rejected_bytes_path, RejectedFile};
use super::store::{NodeMembershipStore, StoredNode};
use crate::domain::{Condition, Guid, NodeId, NodeMemberships, PKey, SignedGrant};
use crate::sm::grant_judge::{verify_all, Freshness, VerifiedGrants};
use crate::sm::{ApplyOutcome, SmError, SubnetManager};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use super::admission::validate;
pub use ledger::Retirement;

mod ledger;

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

struct Inner {
    config: OpenSmConfig,
    local_node_id: String,
    /// Asked about ports other nodes claim; `None` when ownership checks are off.
    directory: Option<Arc<dyn PortDirectory>>,
    /// Every node's set, as admitted.
    state: Mutex<State>,
    /// Where the sets (and the retired keys) are kept.
    store: Arc<dyn NodeMembershipStore>,
    /// Orders store writes with the in-memory update.
    admit: tokio::sync::Mutex<()>,
    /// Held by a request from admission to reload when group commit is off.
    serial: tokio::sync::Mutex<()>,
    /// Callers waiting for the next commit, with the node whose set each one carried.
    group: GroupCommit<Option<NodeId>, CommitResult>,
    /// Each node's admission slots (`node_commit_interval_ms`).
    pace: NodePace<NodeId>,
    /// Writes the file and confirms it with OpenSM.
    files: Arc<FileCommitter>,
    /// The tasks the backend spawned (the commit loop, the log watch), for
    /// [`OpenSmBackend::shutdown`].
    tasks: Mutex<Tasks>,
    /// Open (true) unless held until the catch-up's commit
    /// ([`OpenSmBackend::hold_commits_until_caught_up`]).
    start_gate: tokio::sync::watch::Sender<bool>,
}

/// The backend's spawned tasks, and whether it was shut down (then it spawns none).
#[derive(Default)]
struct Tasks {
    running: Vec<tokio::task::AbortHandle>,
    shut_down: bool,
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
        let retired = store.load_retired().map_err(OpenSmError::Store)?;
        let mut unsaved = BTreeSet::new();
        for mut n in stored {
            // A retirement stored before the sets it ends were (a crash between the two).
            if crate::sm::grant_judge::apply_retired(&mut n, &retired).is_some() {
                unsaved.insert(n.memberships.node_id.clone());
            }
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
        // Bytes rejected in an earlier run: what they add to the accepted file is held back
        // again from this start.
        let io = |e| OpenSmError::Io(Arc::new(e));
        let accepted = read_optional(&accepted_copy_path(&config.partitions_file)).map_err(io)?;
        let rejected = read_optional(&rejected_bytes_path(&config.partitions_file))
            .map_err(io)?
            .map(|bytes| RejectedFile::after(None, bytes, accepted.as_deref()));
        let health = Health {
            commit,
            all_full: all_full_of(&config, &operator),
            operator: Arc::new(operator),
            rejected,
            log_mark,
            operator_file_refused: None,
            quarantined: BTreeMap::new(),
        };
        let watch = Duration::from_millis(config.watch_ms);
        let files = Arc::new(FileCommitter::new(
            config.clone(),
            Arc::clone(&store),
            reloader,
            health,
        ));
        let backend = OpenSmBackend {
            inner: Arc::new(Inner {
                group: GroupCommit::new(
                    Duration::from_millis(config.commit_linger_ms),
                    Duration::from_millis(config.commit_linger_max_ms),
                ),
                pace: NodePace::new(Duration::from_millis(config.node_commit_interval_ms)),
                config,
                local_node_id,
                directory,
                state: Mutex::new(State {
                    nodes,
                    consumed,
                    retired,
                    guid_owner,
                    partial: BTreeMap::new(),
                    unsaved,
                }),
                store,
                admit: tokio::sync::Mutex::new(()),
                serial: tokio::sync::Mutex::new(()),
                files: Arc::clone(&files),
                tasks: Mutex::new(Tasks::default()),
                start_gate: tokio::sync::watch::Sender::new(true),
            }),
        };
        if !watch.is_zero() && tokio::runtime::Handle::try_current().is_ok() {
            let first = if rescan { Duration::ZERO } else { watch };
            let weak = Arc::downgrade(&backend.inner);
            let resync = move || {
                let inner = weak.upgrade()?;
                Some(async move { OpenSmBackend { inner }.resync().await.map(|_| ()) })
            };
            let _ = backend
                .inner
                .spawn(watch_log(Arc::downgrade(&files), first, watch, resync));
        }
        Ok(backend)
    }

    /// An SM host with peers, from its start until its catch-up: a set sent by a node, a
    /// revocation and the local apply wait (admitted nowhere, written nowhere) until
    /// [`OpenSmBackend::caught_up_commit`], so nothing rewrites the partitions file, and signals
    /// an OpenSM that may be running, before the catch-up has confirmed or replaced the sets
    /// held back at load. The peers' sets taken during the catch-up are not held.
    pub fn hold_commits_until_caught_up(&self) {
        self.inner.start_gate.send_replace(false);
    }

    /// Whether commits are held until the catch-up's commit.
    pub fn commits_held(&self) -> bool {
        !*self.inner.start_gate.borrow()
    }

    /// The catch-up's commit: the region rewritten from everything the catch-up confirmed or
    /// took, then the held requests let through (they commit after it).
    pub async fn caught_up_commit(&self) -> Result<SetOutcome, OpenSmError> {
        let result = self.resync().await;
        self.inner.start_gate.send_replace(true);
        result
    }

    /// Waits while commits are held until the catch-up's commit.
    async fn after_catch_up(&self) {
        let mut open = self.inner.start_gate.subscribe();
        let _ = open.wait_for(|o| *o).await;
    }

    /// Ends the backend where it stands, as a crash of its process would: the commit loop and
    /// the log watch are aborted at their next await point (a write already handed to the
    /// kernel completes or not, like any crash), callers waiting for a commit are answered
    /// with an error, and every later request is refused without being stored or written.
    /// Idempotent. What the store holds is all a new backend on it starts from. For a crash
    /// inside one process (the simulation, tests); the daemon's stop does not call it: its exit
    /// ends every task, and until then a commit in flight may finish and be answered.
    pub fn shutdown(&self) {
        let running = {
            let mut t = self.inner.tasks();
            t.shut_down = true;
            std::mem::take(&mut t.running)
        };
        running.iter().for_each(tokio::task::AbortHandle::abort);
        drop(self.inner.group.abandon());
    }

    /// Whether [`OpenSmBackend::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.tasks().shut_down
    }

    /// Sweeps requested since start.
    pub fn sweeps(&self) -> u64 {
        self.inner.files.sweeps()
    }

    /// Files written since start.
    pub fn writes(&self) -> u64 {
        self.inner.files.writes()
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

    /// At start, before OpenSM may read the partitions file (the daemon calls it before READY,
    /// and OpenSM is ordered after the agent): when the store was found restored from a copy
    /// (`restored`: why, from `Store::rolled_back`), writes the region rendered from the
    /// restored store, whose sets load without their keys (fail closed), so a partitions file
    /// put back with the store (a whole-host restore) never hands OpenSM sets the nodes have
    /// replaced since. Its safety is the file's content (the restored sets' keys left out), not
    /// its confirmation: with OpenSM not running yet the write is confirmed only where OpenSM is
    /// proven not running (SM hosts with peers: no SMInfo answer and its pid gone), else it
    /// stays unconfirmed and the next commit checks it again. Nothing to do (Ok) when the store
    /// was not restored.
    pub async fn render_after_restore(&self, restored: Option<&str>) -> Result<(), OpenSmError> {
        let Some(why) = restored else {
            return Ok(());
        };
        tracing::warn!(%why, "store restored: rendering the partitions file from it before OpenSM reads it");
        self.resync().await.map(|_| ())
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
        self.set_node_checked(desired, &[], generation, true, Freshness::now())
            .await
    }

    /// [`OpenSmBackend::set_node_granted`] for a node's own request: it waits while commits
    /// are held until the catch-up ([`OpenSmBackend::hold_commits_until_caught_up`]).
    pub async fn set_node_from_node(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<SetOutcome, OpenSmError> {
        self.after_catch_up().await;
        self.set_node_checked(desired, grants, generation, true, Freshness::now())
            .await
    }

    /// [`OpenSmBackend::revoke_instance`] for the control plane's request: it waits while
    /// commits are held until the catch-up.
    pub async fn revoke_instance_after_catch_up(
        &self,
        node: &NodeId,
        instance: &str,
    ) -> Result<Revocation, OpenSmError> {
        self.after_catch_up().await;
        self.revoke_instance(node, instance).await
    }

    /// [`OpenSmBackend::set_node`] with the grants the node carries. When the SM host requires
    /// grants (see [`super::admission`]) a key without a valid, unconsumed grant
    /// refuses the whole set with [`OpenSmError::GrantRefused`] before anything is stored.
    pub async fn set_node_granted(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<SetOutcome, OpenSmError> {
        self.set_node_checked(desired, grants, generation, true, Freshness::now())
            .await
    }

    /// [`OpenSmBackend::set_node_granted`] for a set a peer SM host forwards (it admitted it):
    /// judged the same way, except that grants are not judged by age again
    /// ([`Freshness::AdmittedByPeer`]).
    pub async fn set_node_from_peer(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<SetOutcome, OpenSmError> {
        self.set_node_checked(desired, grants, generation, true, Freshness::AdmittedByPeer)
            .await
    }

    /// Whether this SM host requires grants.
    pub fn requires_grants(&self) -> bool {
        requires_grants(&self.inner.config)
    }

    async fn set_node_checked(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
        check_ports: bool,
        freshness: Freshness,
    ) -> Result<SetOutcome, OpenSmError> {
        if self.is_shut_down() {
            return Err(OpenSmError::Task {
                what: "request (the backend is shut down)",
                source: None,
            });
        }
        validate(&desired, self.inner.config.pkey_table_size)?;
        // Copies dropped and signatures checked here, outside the admission lock: one node's
        // flood of grants costs that node, not the others' admission.
        let grants = match self.inner.config.grants.as_ref().filter(|g| g.require) {
            Some(policy) => verify_all(policy, &desired, grants).map_err(|(pkey, error)| {
                let e = OpenSmError::GrantRefused {
                    node: desired.node_id.clone(),
                    pkey,
                    error: Box::new(error),
                };
                tracing::warn!(node_id = %desired.node_id, error = %e, "set refused: grant");
                e
            })?,
            None => VerifiedGrants::default(),
        };
        self.inner.pace.wait(&desired.node_id).await;
        let arriving = self.inner.group.arriving();
        let evidence = match (&self.inner.directory, check_ports) {
            (Some(directory), true) => Some(
                gather_evidence(
                    &self.inner.state,
                    &self.inner.config,
                    directory,
                    &desired,
                    generation,
                )
                .await?,
            ),
            _ => None,
        };
        // Without group commit each request is admitted and written alone: one write and one
        // sweep per request.
        let _alone = self.serial_unless_grouped().await;
        let refusal = {
            let _admit = self.inner.admit.lock().await;
            let (operator, all_full) = {
                let h = self.inner.files.health();
                (Arc::clone(&h.operator), h.all_full)
            };
            let posture = Posture {
                operator: &operator,
                all_full,
            };
            let admission = self.inner.lock().judge_set(
                &self.inner.config,
                posture,
                &desired,
                Carried {
                    grants: &grants,
                    freshness,
                },
                generation,
                evidence.as_ref(),
            )?;
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
                    st.admit(set, generation, moves, accepted);
                    refusal
                }
            }
        };
        drop(arriving);
        let detail = self.commit(Some(&desired.node_id)).await?;
        if let Some(e) = refusal {
            return Err(e);
        }
        Ok(SetOutcome {
            sweeps: self.sweeps(),
            detail,
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
        let bytes = self.inner.files.accepted_file().await?;
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

    /// An SM host its peers may have fenced (its own OpenSM not running, no peer's agent
    /// answering, a peer's SM alive: `sm::opensm::sync`): every stored set is held back again as
    /// at start (its keys out of the region until the node or a caught-up peer confirms it) and
    /// the region rewritten, so an OpenSM restarted alone on this host programs no key a release
    /// acknowledged meanwhile without this host has ended. Sets admitted and not yet stored are
    /// kept (they come from their node). Returns how many sets were held back.
    pub async fn hold_back_all(&self) -> Result<usize, OpenSmError> {
        let held = {
            let mut s = self.inner.lock();
            let unsaved = s.unsaved.clone();
            let mut held = 0;
            for (id, n) in &mut s.nodes {
                if n.gated || !n.has_set() || unsaved.contains(id) {
                    continue;
                }
                *n = n.clone().gated();
                held += 1;
            }
            held
        };
        if held > 0 {
            self.resync().await?;
        }
        Ok(held)
    }

    /// Every stored node's set (for the fabric's view of a partition).
    pub fn nodes(&self) -> Vec<StoredNode> {
        self.inner.lock().nodes.values().cloned().collect()
    }

    /// The node a port GUID belongs to, as the SM host's stored sets say.
    pub fn owner_of(&self, guid: Guid) -> Option<NodeId> {
        self.inner.lock().guid_owner.get(&guid).cloned()
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
        let shut_down = || OpenSmError::Task {
            what: "commit (the backend is shut down)",
            source: None,
        };
        if self.is_shut_down() {
            return Err(shut_down());
        }
        if !self.inner.config.group_commit {
            return self.inner.commit_once().await.and_then(|c| c.answer(node));
        }
        let (rx, start) = self.inner.group.join(node.cloned());
        if start && !self.inner.spawn(Arc::clone(&self.inner).commit_loop()) {
            return Err(shut_down());
        }
        rx.await.map_err(|_| OpenSmError::Task {
            what: "commit",
            source: None,
        })?
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn tasks(&self) -> MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns one of the backend's tasks, kept for [`OpenSmBackend::shutdown`]; false after
    /// it (the future is dropped unpolled).
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) -> bool {
        let mut t = self.tasks();
        if t.shut_down {
            return false;
        }
        t.running.retain(|h| !h.is_finished());
        t.running.push(tokio::spawn(task).abort_handle());
        true
    }

    async fn commit_loop(self: Arc<Self>) {
        while let Some(waiters) = self.group.next_group().await {
            let result = self.commit_once().await;
            for (node, w) in waiters {
                let answer = match &result {
                    Ok(c) => c.answer(node.as_ref()),
                    Err(e) => Err(e.clone()),
                };
                let _ = w.send(answer);
            }
        }
    }

    /// One commit of every node's set as it is now; the sets it could not store stay unsaved
    /// for the next one.
    async fn commit_once(&self) -> Result<Committed, OpenSmError> {
        let (snapshot, unsaved) = self.lock().snapshot();
        let (result, unsaved) = self.files.commit_once(&snapshot, unsaved).await;
        if !unsaved.is_empty() {
            self.lock()
                .unsaved
                .extend(unsaved.into_iter().map(|n| n.memberships.node_id));
        }
        result
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
        self.after_catch_up().await;
        let mut own = desired.clone();
        own.node_id = NodeId::parse(&self.inner.local_node_id).map_err(OpenSmError::Invalid)?;
        // The SM host's own ports, read by its own observer: not a claim by another node, so
        // the fabric is not asked (the other rules, including other nodes' ports, still hold).
        let outcome = self
            .set_node_checked(own, &[], generation, false, Freshness::now())
            .await?;
        Ok(ApplyOutcome {
            detail: outcome.detail,
            acknowledged_by: Vec::new(),
        })
    }

    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.after_catch_up().await;
        let mut own = desired.clone();
        own.node_id = NodeId::parse(&self.inner.local_node_id).map_err(OpenSmError::Invalid)?;
        let outcome = self
            .set_node_checked(own, grants, generation, false, Freshness::now())
            .await?;
        Ok(ApplyOutcome {
            detail: outcome.detail,
            acknowledged_by: Vec::new(),
        })
    }

    fn conditions(&self) -> Vec<Condition> {
        self.conditions_now()
    }
}

impl OpenSmBackend {
    /// The standing conditions of the partitions file and OpenSM, as the SM host sees them now:
    /// the Default entry grants `ALL=full`, OpenSM rejected a file (last accepted one restored),
    /// the last write is unconfirmed, a node's set is quarantined.
    pub fn conditions_now(&self) -> Vec<Condition> {
        self.inner.files.conditions()
    }
}
