//! One commit of the whole region to OpenSM's partitions file: compose and check it, store the
//! group's sets and the commit state, write the file atomically, make OpenSM re-read it and
//! confirm it by the sweep fence; keep the last accepted copy, restore it after a rejection,
//! repair rejections the agent did not cause (at the next commit and by the log watch), and the
//! standing conditions of the file (`Health`).
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
//! [`super::repair`]. Bytes OpenSM rejected are written again only as [`RejectedFile`] allows;
//! while it holds back what a rejected file added (a node's addition), every commit renders the
//! region without that ([`isolation::without_held`]), and right after a rejection the same commit
//! writes the file again without it once the accepted one is back: another node's release is
//! answered OK at once, the held node with the rejection or the hold.

use super::config::OpenSmConfig;
use super::error::{task_failed, OpenSmError, Rejection, Restored};
use super::file::{accepted_copy_path, read_or_empty, rejected_copy_path, replace_atomically};
use super::isolation;
use super::model::PartitionsConf;
use super::region::{
    check_composed, check_operator_keys, check_operator_unchanged, compose,
    default_grants_all_full, render_region, split_region, tenant_entry_name, FullDefault,
    RegionPlan, TableLimits, TenantEntry,
};
use super::reload::{ReloadError, Reloader};
use super::repair::{describe, operator_part, region_members, rejected_bytes_path, RejectedFile};
use super::store::{CommitState, LogMark, NodeMembershipStore, OperatorRejected, StoredNode};
use crate::domain::{is_safe_key_name, Condition, ConditionKind, Membership, NodeId, PKey};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod log_watch;
mod outcome;

pub(super) use log_watch::watch_log;

/// The result one commit hands to every caller it carried.
pub(super) type CommitResult = Result<String, OpenSmError>;

/// The nodes whose sets a written file did not serve whole because OpenSM's rejection holds
/// back what they add, with the answer each gets.
type Withheld = BTreeMap<NodeId, OpenSmError>;

/// What one commit did: its detail, the nodes whose sets it left out of the file, and those it
/// served only in part (an addition held back after OpenSM rejected it).
pub(super) struct Committed {
    detail: String,
    quarantined: BTreeMap<NodeId, String>,
    withheld: Withheld,
}

impl Committed {
    /// The answer for a caller that carried `node`'s set: an error when that set was left out.
    pub(super) fn answer(&self, node: Option<&NodeId>) -> CommitResult {
        if let Some((node, reason)) = node.and_then(|n| self.quarantined.get_key_value(n)) {
            return Err(OpenSmError::Quarantined {
                node: node.clone(),
                reason: reason.clone(),
            });
        }
        match node.and_then(|n| self.withheld.get(n)) {
            Some(e) => Err(e.clone()),
            None => Ok(self.detail.clone()),
        }
    }
}

/// What the backend knows about the file and OpenSM's verdicts.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// Persisted: unconfirmed write, rejected file.
    pub(super) commit: CommitState,
    /// The operator's part of the file, as of its last read.
    pub(super) operator: Arc<PartitionsConf>,
    /// Where the Default entry grants `ALL=full`, as of the last read of the operator's part.
    pub(super) all_full: Option<FullDefault>,
    /// The last file OpenSM rejected and its hold (the bytes are kept beside the file across
    /// restarts, [`rejected_bytes_path`]).
    pub(super) rejected: Option<RejectedFile>,
    /// OpenSM's log was checked for rejections up to here.
    pub(super) log_mark: u64,
    /// `operator_file` mode: why the operator's file is refused (the previous live operator
    /// part is used meanwhile).
    pub(super) operator_file_refused: Option<String>,
    /// Nodes whose stored set the last commit left out of the file, and why.
    pub(super) quarantined: BTreeMap<NodeId, String>,
}

/// Writes the region to the file and confirms it with OpenSM; holds what is known of the file.
pub(super) struct FileCommitter {
    config: OpenSmConfig,
    store: Arc<dyn NodeMembershipStore>,
    pub(super) reloader: Arc<dyn Reloader>,
    health: Mutex<Health>,
    sweeps: AtomicU64,
    writes: AtomicU64,
}

impl FileCommitter {
    /// A committer starting from `health` (read at start: the commit state, the operator's
    /// part, the log mark, rejected bytes kept from an earlier run).
    pub(super) fn new(
        config: OpenSmConfig,
        store: Arc<dyn NodeMembershipStore>,
        reloader: Arc<dyn Reloader>,
        health: Health,
    ) -> FileCommitter {
        FileCommitter {
            config,
            store,
            reloader,
            health: Mutex::new(health),
            sweeps: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// What is known of the file now.
    pub(super) fn health(&self) -> MutexGuard<'_, Health> {
        // A panic while holding the lock cannot leave Health half-updated in a way that
        // matters more than stopping would: keep serving.
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sweeps requested since start.
    pub(super) fn sweeps(&self) -> u64 {
        self.sweeps.load(Ordering::Relaxed)
    }

    /// Files written since start.
    pub(super) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// The last file OpenSM accepted (the copy kept beside the file; the file itself before any
    /// write was accepted).
    pub(super) async fn accepted_file(&self) -> Result<Vec<u8>, OpenSmError> {
        let file = self.config.partitions_file.clone();
        blocking(move || {
            Ok(match read_optional(&accepted_copy_path(&file))? {
                Some(b) => b,
                None => read_or_empty(&file)?,
            })
        })
        .await
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
            let mut st = self.health();
            change(&mut st.commit);
            st.commit.log_mark = Some(LogMark {
                offset: st.log_mark,
                file: identity,
            });
            st.commit.clone()
        });
        if unsaved.is_empty() && state.is_none() {
            return Ok(());
        }
        let store = Arc::clone(&self.store);
        let nodes = std::mem::take(unsaved);
        let (nodes, result) = crate::sm::blocking::unblock(move || {
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
        self.health().log_mark = self.reloader.checkpoint();
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
        let mark = self.health().log_mark;
        let (errors, end) = self.reloader.rejections_since(mark);
        self.health().log_mark = end;
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
                    let mut st = self.health();
                    let earlier = st.rejected.take();
                    st.rejected = Some(RejectedFile::after(earlier, current.clone(), Some(&good)));
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
    pub(super) async fn operator_parts(
        &self,
    ) -> Result<Option<super::region::OperatorParts>, OpenSmError> {
        let Some(op) = self.config.operator_file.clone() else {
            return Ok(None);
        };
        let loaded = crate::sm::blocking::unblock(move || super::operator::load_operator_file(&op))
            .await
            .map_err(|e| task_failed("operator file", e))?;
        let mut st = self.health();
        match loaded {
            Ok((parts, _)) => {
                st.operator_file_refused = None;
                Ok(Some(parts))
            }
            Err(e) => {
                let why = format!("{e}; the live partitions file keeps the previous operator part");
                if st.operator_file_refused.as_deref() != Some(&why) {
                    tracing::warn!(detail = %why, "operator file refused");
                }
                st.operator_file_refused = Some(why);
                Ok(None)
            }
        }
    }

    /// Puts the last accepted file back when the file in place holds bytes OpenSM rejected (a
    /// restore that failed earlier, or in an earlier run).
    async fn retry_restore(&self) -> Result<(), OpenSmError> {
        let Some(rejected) = self.health().rejected.as_ref().map(|r| r.bytes.clone()) else {
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
    pub(super) async fn needs_repair(&self) -> bool {
        let (pending, rejected_bytes, restored_part) = {
            let st = self.health();
            let c = &st.commit;
            (
                c.unconfirmed.is_some() && (c.rejected.is_some() || c.operator_rejected.is_some()),
                st.rejected.as_ref().map(|r| r.bytes.clone()),
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
    /// durable and OpenSM was seen re-reading the file without error. Returns, besides, the
    /// sets that could not be stored (they stay unsaved for the next commit).
    pub(super) async fn commit_once(
        &self,
        nodes: &BTreeMap<NodeId, StoredNode>,
        mut unsaved: Vec<StoredNode>,
    ) -> (Result<Committed, OpenSmError>, Vec<StoredNode>) {
        let result = self.commit_steps(nodes, &mut unsaved).await;
        let result = result.map(|(detail, withheld)| Committed {
            detail,
            quarantined: self.health().quarantined.clone(),
            withheld,
        });
        (result, unsaved)
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
        let st = self.health();
        for (id, why) in &out {
            if st.quarantined.get(id) != Some(why) {
                tracing::warn!(node_id = %id, reason = %why, "node set quarantined: left out of the partitions file");
            }
        }
        for id in st.quarantined.keys() {
            if !out.contains_key(id) {
                tracing::info!(node_id = %id, "node set no longer quarantined");
            }
        }
        out
    }

    /// One commit's steps: its detail and the nodes it served only in part.
    async fn commit_steps(
        &self,
        nodes: &BTreeMap<NodeId, StoredNode>,
        unsaved: &mut Vec<StoredNode>,
    ) -> Result<(String, Withheld), OpenSmError> {
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
            let mut st = self.health();
            st.all_full = all_full_of(&self.config, &operator);
            st.quarantined = quarantined;
            st.operator = Arc::new(operator.clone());
        }
        let full = self.plan(&served, &operator);
        check_operator_keys(&operator, full.tenants.keys())?;
        let accepted_members = accepted.as_deref().and_then(region_members);
        self.note_or_lift_refusal(nodes);
        // What a rejection holds back (another node's addition) is left out of the file; the
        // nodes that leaves unserved are answered with the hold, never OK.
        let (mut plan, mut withheld) = {
            let st = self.health();
            let holding = st.rejected.as_ref().and_then(RejectedFile::held_additions);
            match (holding, &accepted_members) {
                (Some((held, left)), Some(acc)) => {
                    let plan = isolation::without_held(&full, acc, held);
                    let error = still_held(&st.commit, st.rejected.as_ref(), left);
                    let withheld = held_back_with(&full, &plan, &served, &error);
                    (plan, withheld)
                }
                _ => (full.clone(), Withheld::new()),
            }
        };
        let mut current = current;
        let mut retried = false;
        loop {
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
                let st = self.health();
                (
                    st.commit.unconfirmed.is_none(),
                    st.rejected
                        .as_ref()
                        .and_then(|r| r.holds(&bytes, accepted.as_deref())),
                )
            };
            if bytes == current && confirmed && accepted.as_deref() == Some(&current[..]) {
                self.save_group(unsaved, None::<fn(&mut CommitState)>)
                    .await?;
                return Ok((
                    "partitions file already up to date (OpenSM accepted it)".into(),
                    withheld,
                ));
            }
            if let Some(left) = held {
                let st = self.health();
                return Err(still_held(&st.commit, st.rejected.as_ref(), left));
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
                    let detail = self
                        .accepted_write(&bytes, &withheld, plan.tenants.len())
                        .await?;
                    return Ok((detail, withheld));
                }
                Ok(false) => {
                    let e = OpenSmError::Unconfirmed {
                        written_keys: plan.tenants.len(),
                        waited_ms: self.config.reload_check_ms,
                    };
                    let why = e.to_string();
                    self.save_commit(|c| c.unconfirmed = Some(why)).await?;
                    return Err(e);
                }
                Err(ReloadError::Unreachable(source)) => {
                    let e = OpenSmError::Unreachable {
                        written_keys: Some(plan.tenants.len()),
                        source,
                    };
                    let why = e.to_string();
                    self.save_commit(|c| c.unconfirmed = Some(why)).await?;
                    return Err(e);
                }
                Err(ReloadError::Rejected(lines)) => {
                    let (error, fallback, reread) = self
                        .rejected_write(lines, &bytes, accepted.as_deref(), &current)
                        .await?;
                    self.note_or_lift_refusal(nodes);
                    // Once the accepted file is back and re-read, the rest of the group (a
                    // release of another node) is written at once without what the rejection
                    // holds back.
                    let held = self
                        .health()
                        .rejected
                        .as_ref()
                        .and_then(|r| r.held_additions().map(|(h, _)| h.clone()));
                    let next = match (&accepted_members, held) {
                        (Some(acc), Some(held)) if reread && !retried => {
                            Some(isolation::without_held(&full, acc, &held))
                        }
                        _ => None,
                    };
                    let Some(next) = next.filter(|n| {
                        *n != plan
                            && fallback.as_deref() != Some(&compose(&parts, &render_region(n))[..])
                    }) else {
                        return Err(error);
                    };
                    tracing::warn!(
                        "writing the partitions file again without the additions OpenSM rejected"
                    );
                    withheld = held_back_with(&full, &next, &served, &error);
                    plan = next;
                    current = fallback.unwrap_or_default();
                    retried = true;
                }
            }
        }
    }

    /// The standing conditions of the partitions file and OpenSM, as the SM host sees them now:
    /// the Default entry grants `ALL=full`, OpenSM rejected a file (last accepted one restored),
    /// the last write is unconfirmed.
    pub(super) fn conditions(&self) -> Vec<Condition> {
        let h = self.health();
        let mut out = Vec::new();
        if let Some(why) = &h.all_full {
            let ack = if self.config.allow_full_default {
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

/// Where the Default entry (the operator's, or the region's when the operator has none) grants
/// every port full membership.
pub(super) fn all_full_of(config: &OpenSmConfig, operator: &PartitionsConf) -> Option<FullDefault> {
    if operator.has_explicit_default() {
        default_grants_all_full(operator)
    } else if config.default_membership == Membership::Full {
        Some(FullDefault::Configured)
    } else {
        None
    }
}

/// The answer while OpenSM's earlier rejection (as `commit` records it) holds a write back for
/// `left` more.
fn still_held(
    commit: &CommitState,
    rejected: Option<&RejectedFile>,
    left: std::time::Duration,
) -> OpenSmError {
    let earlier = commit.rejected.clone().unwrap_or_default();
    OpenSmError::Rejected(match rejected.filter(|r| r.refused()) {
        Some(r) => Rejection::Refused {
            earlier,
            times: r.times(),
        },
        None => Rejection::Repeated {
            earlier,
            wait_s: left.as_secs().max(1),
        },
    })
}

/// The nodes of `served` that `written` serves differently from `full`, each answered `error`.
fn held_back_with(
    full: &RegionPlan,
    written: &RegionPlan,
    served: &BTreeMap<NodeId, StoredNode>,
    error: &OpenSmError,
) -> Withheld {
    isolation::held_back(full, written, served.values().map(|n| &n.memberships))
        .into_iter()
        .map(|n| (n, error.clone()))
        .collect()
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, OpenSmError> {
    crate::sm::blocking::unblock(f)
        .await
        .map_err(|e| task_failed("file", e))?
        .map_err(|e| OpenSmError::Io(Arc::new(e)))
}

pub(super) fn read_optional(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
