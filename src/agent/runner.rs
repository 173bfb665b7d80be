//! The reconciler loop: apply the desired set through the subnet manager (with capped, jittered
//! backoff while it is unreachable), read the ports, commit what `plan` decides, report port
//! changes and standing conditions, then sleep until something happens. Idle costs nothing: it
//! waits on a wake-up, the observer's change signal, a retry or resync deadline, or shutdown.
//!
//! What the node knows of the subnet manager (acknowledged, in doubt, the apply ledger) is
//! decided in `sm_knowledge`, the rules stated in the README's truth rules; when to send, in
//! `schedule`; the standing conditions, in `conditions`. This loop does the I/O they ask for.

use super::conditions::Conditions;
use super::metrics::Timed;
use super::plan::{self, Observed};
use super::schedule::Schedule;
use super::sm_knowledge::SmKnowledge;
use super::stall::{self, Stall};
use super::{changed_event, ports, Agent, ApplyInFlight};
use crate::domain::{
    Attachment, AttachmentState, ConditionKind, EventKind, Guid, Inventory, NodeMemberships,
    Restored, SmState,
};
use crate::sm::{SmError, SmFailure};
use crate::store::Batch;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

mod host_set;
mod start;
use start::StartCheck;

/// Longest a single apply may take before it counts as unavailable (its keys stay in doubt).
pub(super) const APPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// The loop goes round at least this often even when nothing happens.
const HEARTBEAT: Duration = Duration::from_secs(60);
/// Released attachments are pruned at most this often.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// One port read and when it started.
struct Reading {
    inventory: Option<Inventory>,
    /// Why the read failed (None when it succeeded).
    error: Option<String>,
    started: Instant,
    started_unix_ns: i64,
}

struct Loop {
    agent: Agent,
    /// What the node knows of the subnet manager.
    knows: SmKnowledge,
    /// When the last acknowledgement arrived (evidence needs a read started after it).
    acked_at: Option<Instant>,
    force_apply: bool,
    schedule: Schedule,
    sm_error: Option<String>,
    /// What the subnet manager did with the last finished apply.
    sm_state: SmState,
    /// The last inventory read successfully: port-table and port-state events compare
    /// against it, so a change across a failed read is still reported.
    prev_inventory: Option<Inventory>,
    conditions: Conditions,
    /// No prune before this (one attempt a second at most, whether it succeeded or not).
    prune_not_before: Instant,
    /// The start check while it is not settled (`start_check`): until then only removals are
    /// sent. None once every SM host answered, an apply was acknowledged, or the backend keeps
    /// no per-node sets.
    start: Option<StartCheck>,
    /// A wait without progress, re-applied at its bound (`stall`).
    stall: Stall,
    /// The backend's SM-host set as last seen (`host_set`).
    host_set_epoch: u64,
    /// This life's log was already restarted (at the store's open, or by a rollback raised):
    /// a second restart would drop events no watcher may have read yet.
    log_restarted: bool,
}

pub(super) async fn run(agent: Agent, mut shutdown: watch::Receiver<bool>) {
    let cfg = agent.shared.parts.reconciler.clone();
    let prev_inventory = agent.status().inventory.clone();
    let mut knows = SmKnowledge::resume(&agent.ledger());
    let reserved_at_start = agent.ledger().generation_reserved;
    let follows_lost_life = agent.shared.follows_lost_life;
    let log_restarted = agent.shared.log_restarted_at_open;
    let sending_at_start = agent.ledger().sending;
    if follows_lost_life {
        // A lost life may have sent generations above this store's reservation, one of them
        // perhaps still on its way to an SM host: go past any it could have used.
        knows.leap_past_lost_life(reserved_at_start);
        tracing::info!(
            reserved_at_start,
            margin = crate::domain::ApplyLedger::LOST_LIFE_MARGIN,
            "this life may follow a lost one: its generations start above any the lost life could have sent"
        );
    }
    let schedule = Schedule::new(agent.shared.parts.node_id.as_str(), cfg, Instant::now());
    let conditions = Conditions::new(agent.reported_conditions());
    let host_set_epoch = agent.shared.parts.sm.host_set_epoch();
    let mut l = Loop {
        agent,
        knows,
        acked_at: None,
        // Confirm the desired set with the SM once after every start.
        force_apply: true,
        schedule,
        sm_error: None,
        sm_state: SmState::Unknown,
        prev_inventory,
        conditions,
        prune_not_before: Instant::now(),
        stall: Stall::default(),
        host_set_epoch,
        log_restarted,
        start: Some(StartCheck {
            began: Instant::now(),
            next_try: Instant::now(),
            verdict: None,
            life: super::start_check::ThisLife {
                sent: Default::default(),
                reserved_at_start,
                follows_lost_life,
                sending_at_start,
            },
            raised: false,
            unsent_checked: false,
        }),
    };
    loop {
        let again = match l.pass().await {
            Ok(again) => {
                // Only a pass that completed (its commit included) counts as life: a store
                // that refuses writes stops the watchdog's pets.
                l.beat();
                again
            }
            Err(e) => {
                tracing::error!(error = %e, "reconciler pass failed");
                false
            }
        };
        if *shutdown.borrow() {
            break;
        }
        if again {
            continue;
        }
        let pending = l.pending();
        let retry = l.schedule.retry_ahead(Instant::now());
        let prune_at = l.prune_at();
        // The start check asks again, and its bound ends, on time.
        // (Only instants still ahead: a check that could not run, its ports unread, waits for
        // the next pass like everything else instead of spinning.)
        let start_at = l.start.as_ref().and_then(|c| c.due_at(Instant::now()));
        let deadline = [
            retry,
            Some(l.schedule.resync_at()),
            prune_at,
            start_at,
            l.stall.due_at(),
            Some(Instant::now() + HEARTBEAT),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("at least the heartbeat");
        let observer = l.agent.shared.parts.observer.clone();
        let sm = l.agent.shared.parts.sm.clone();
        let backing_off = retry.is_some();
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            _ = l.agent.shared.wake.notified() => {}
            _ = observer.changed(pending) => {}
            _ = sm.cause_changed(), if backing_off => {
                tracing::info!("the subnet manager's fault changed; retrying now");
                l.schedule.retry_now();
            }
            _ = tokio::time::sleep_until(deadline) => {}
        }
        if l.schedule.resync_due(Instant::now()) {
            l.force_apply = true;
            l.prune_released().await;
        } else if prune_at.is_some_and(|t| Instant::now() >= t) {
            l.prune_released().await;
        }
    }
    tracing::info!("reconciler stopped");
}

impl Loop {
    fn beat(&self) {
        self.agent.shared.beats.send_modify(|b| *b += 1);
    }

    fn pending(&self) -> bool {
        self.knows.unacked()
            || self
                .agent
                .store()
                .live_attachments()
                .map(|all| {
                    all.iter()
                        .any(|a| is_waiting(a.state) && a.restored.is_none())
                })
                .unwrap_or(true)
    }

    /// One pass. Returns true when another pass should follow at once.
    async fn pass(&mut self) -> Result<bool, super::AgentError> {
        let mut reading = self.read_ports().await;
        // RELEASED attachments play no part in a pass: only the live ones are read, so a pass
        // costs the same after a million releases as after one.
        let mut attachments = self.agent.store().live_attachments()?;
        if let Some(inv) = &reading.inventory {
            if self.check_restored(&attachments, inv).await? {
                attachments = self.agent.store().live_attachments()?;
            }
            // Recorded before any set that sends the key to them.
            if self.join_ports(&attachments, inv).await? {
                attachments = self.agent.store().live_attachments()?;
            }
        }
        let guids: Vec<Guid> = reading
            .inventory
            .as_ref()
            .map(|i| i.fabric_ports().map(|p| p.port_guid).collect())
            .unwrap_or_default();
        let mut desired = plan::desired(
            &self.agent.shared.parts.node_id,
            guids.clone(),
            reading.inventory.as_ref(),
            &attachments,
        );
        let mut again = false;
        self.follow_host_set();
        // Before any apply that adds a key: what the SM hosts hold may prove the store went
        // back in time (`start_check`); until every host answered, only removals go out.
        let mut sendable = Some(desired.clone());
        if let Some(inv) = &reading.inventory {
            if self.start_check(&mut attachments, inv, &desired).await? {
                desired = plan::desired(
                    &self.agent.shared.parts.node_id,
                    guids,
                    reading.inventory.as_ref(),
                    &attachments,
                );
            }
            sendable = self.sendable(&desired);
        }
        let needed = sendable.as_ref().is_some_and(|set| {
            self.force_apply
                || self.knows.unacked()
                || self.knows.ack().map(|a| &a.set) != Some(set)
        });
        // (Only with ports read: a set built without them is no request.)
        if reading.inventory.is_some()
            && sendable
                .as_ref()
                .is_some_and(|set| self.schedule.desired(set))
        {
            tracing::debug!("the desired set changed since the failed apply; retrying now");
        }
        let due = self.schedule.due(Instant::now());
        let mut acknowledged = false;
        if let (true, true, true, Some(desired)) =
            (needed, due, reading.inventory.is_some(), sendable)
        {
            // The grants come from the same snapshot as the set: never one for a key it lacks.
            let grants = plan::grants(&desired, &attachments);
            match self.apply(desired, grants).await? {
                Applied::Acknowledged => {
                    acknowledged = true;
                    // The evidence for ACTIVE and RELEASED must come from a read that started
                    // after the acknowledgement.
                    reading = self.read_ports().await;
                }
                Applied::RetryNow => again = true,
                Applied::Failed => {}
            }
        }
        // An answer judged against a host set replaced meanwhile does not count.
        if self.follow_host_set() {
            again = true;
        }
        let inventory = reading.inventory.as_ref();
        let allow_full_default = self.agent.shared.parts.allow_full_default;
        let full_default = inventory.map(plan::full_default_ports);
        let posture_ok =
            allow_full_default || full_default.as_ref().is_some_and(|ports| ports.is_empty());
        let mut batch = Batch::default();
        if let Some(inv) = inventory {
            batch
                .events
                .extend(ports::changes(self.prev_inventory.as_ref(), inv));
            batch
                .events
                .extend(self.conditions.foreign(inv, &attachments));
        }
        let mut conditions = self.conditions.now(
            self.agent.shared.parts.sm.conditions(),
            full_default,
            allow_full_default,
            self.knows.ack().is_some(),
        );
        if let Some(detail) = withheld(&attachments) {
            conditions.insert(ConditionKind::RestoredUnconfirmed, detail);
        }
        if let Some(detail) = self.start.as_ref().and_then(StartCheck::incomplete) {
            conditions.insert(ConditionKind::StartCheckIncomplete, detail);
        }
        if let Some(error) = &reading.error {
            conditions.insert(
                ConditionKind::PortsUnreadable,
                format!("the last port read failed: {error}; no attachment changes state until the ports are read"),
            );
        }
        batch.events.extend(self.conditions.changes(conditions));
        self.agent.status().conditions = self.conditions.standing();
        let gone = match inventory {
            Some(inv) => {
                ports::gone_from_fabric(&*self.agent.shared.parts.observer, inv, &attachments).await
            }
            None => Default::default(),
        };
        let observed = Observed {
            sm: &self.knows,
            inventory,
            read_after_ack: self.acked_at.is_some_and(|at| reading.started > at),
            read_unix_ns: reading.started_unix_ns,
            posture_ok,
            gone: &gone,
        };
        let transitions = plan::plan(&attachments, observed);
        if transitions.iter().any(|t| t.to == AttachmentState::Drifted) {
            self.force_apply = true;
            again = true;
        }
        // A wait the acknowledged set does not end (the key still on a covered port of a
        // RELEASING attachment, or missing from an up port of a PROGRAMMING one): the set is
        // sent again at the bound, not only at the resync.
        let stalled = inventory.is_some()
            && self.start.is_none()
            && self.sm_error.is_none()
            && self.knows.ack().is_some()
            && !self.knows.unacked()
            && posture_ok
            && attachments
                .iter()
                .any(|a| plan::re_apply_may_help(a, &attachments, observed));
        let progressed = acknowledged || !transitions.is_empty();
        if self.stall.observe(stalled, progressed, Instant::now()) {
            tracing::warn!(
                after_secs = stall::REAPPLY_AFTER.as_secs(),
                "an attachment waited without progress since the set was acknowledged; sending the set again"
            );
            self.force_apply = true;
            again = true;
        }
        self.commit(&attachments, transitions, observed, batch)
            .await?;
        self.knows.forget_released();
        self.agent.status().sm.in_doubt = self.knows.in_doubt();
        // A failed read keeps the last good inventory: the next good one is compared with it.
        if reading.inventory.is_some() {
            self.prev_inventory = reading.inventory;
        }
        Ok(again)
    }

    /// Records the fabric ports that joined a whole-node attachment wanting its key
    /// (`Attachment::join_ports`): they stay covered for its life. Returns whether anything
    /// was committed.
    async fn join_ports(
        &self,
        snapshot: &[Attachment],
        inventory: &Inventory,
    ) -> Result<bool, super::AgentError> {
        if !snapshot.iter().any(|a| a.clone().join_ports(inventory)) {
            return Ok(false);
        }
        let _guard = self.agent.shared.write.lock().await;
        let mut batch = Batch::default();
        for a in snapshot {
            // The stored record, not the snapshot: a command may have changed it meanwhile.
            let Some(mut current) = self.agent.store().attachment(a.instance_id.as_str())? else {
                continue;
            };
            if current.join_ports(inventory) {
                tracing::info!(instance = %a.instance_id, ports = current.ports.len(), "a fabric port joined a whole-node attachment");
                batch.upserts.push(current);
            }
        }
        if batch.upserts.is_empty() {
            return Ok(false);
        }
        self.agent.commit(batch)?;
        Ok(true)
    }

    /// Settles the attachments a store rollback marked, from this pass's port read (taken
    /// before any apply since the rollback was found; see `plan::restore_checks`). Returns
    /// whether anything was committed.
    async fn check_restored(
        &self,
        snapshot: &[Attachment],
        inventory: &Inventory,
    ) -> Result<bool, super::AgentError> {
        let checks = plan::restore_checks(snapshot, inventory);
        if checks.is_empty() {
            return Ok(false);
        }
        let _guard = self.agent.shared.write.lock().await;
        let now = self.agent.now_unix_ns();
        let mut batch = Batch::default();
        for check in checks {
            let id = snapshot[check.index].instance_id.as_str();
            let Some(mut a) = self.agent.store().attachment(id)? else {
                continue;
            };
            // A command settled it meanwhile (the control plane's attach or release).
            if a.restored != Some(Restored::AwaitingRead) {
                continue;
            }
            let from = a.state;
            if check.confirmed {
                tracing::info!(instance = id, reason = %check.reason, "restored attachment confirmed by the port read");
                a.restored = None;
            } else {
                tracing::warn!(instance = id, reason = %check.reason, "restored attachment withheld");
                a.restored = Some(Restored::Unconfirmed);
                a.state = check.to;
                a.reason.clone_from(&check.reason);
                if a.state != from {
                    a.evidence = None;
                    a.updated_unix_ns = now;
                    batch
                        .events
                        .push(changed_event(&a, Some(from), &check.reason));
                }
            }
            batch.upserts.push(a);
        }
        self.agent.commit(batch)?;
        Ok(true)
    }

    async fn read_ports(&mut self) -> Reading {
        let started = Instant::now();
        let started_unix_ns = self.agent.now_unix_ns();
        let parts = &self.agent.shared.parts;
        let result = parts.observer.inventory().await;
        self.agent.metrics().read(result.is_ok(), started.elapsed());
        let (inventory, error) = match result {
            Ok(mut inv) => {
                parts.selector.apply(&mut inv);
                self.agent.status().inventory = Some(inv.clone());
                (Some(inv), None)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading ports failed; no state changes this pass");
                (None, Some(e.to_string()))
            }
        };
        Reading {
            inventory,
            error,
            started,
            started_unix_ns,
        }
    }

    /// Sends the desired set with a new generation, after the ledger durably covers it.
    async fn apply(
        &mut self,
        desired: NodeMemberships,
        grants: Vec<crate::domain::SignedGrant>,
    ) -> Result<Applied, super::AgentError> {
        let generation = {
            // Write-ahead: the ledger covers the apply durably before it is sent.
            let _guard = self.agent.shared.write.lock().await;
            let (generation, ledger) = self.knows.begin_apply(&self.agent.ledger(), &desired);
            if let Some(ledger) = ledger {
                self.agent.commit(Batch {
                    ledger: Some(ledger),
                    ..Default::default()
                })?;
            }
            generation
        };
        self.knows.carrying(&desired, generation);
        if let Some(check) = &mut self.start {
            check
                .life
                .sent
                .insert((generation, crate::domain::set_digest(&desired)));
        }
        self.agent.status().sm.in_doubt = self.knows.in_doubt();
        let sm = self.agent.shared.parts.sm.clone();
        let sent = Instant::now();
        self.agent.set_in_flight(Some(ApplyInFlight {
            since: sent.into_std(),
            since_unix_ns: self.agent.now_unix_ns(),
            generation,
            keys: desired.keys.keys().copied().collect(),
        }));
        let result = match tokio::time::timeout(
            APPLY_TIMEOUT,
            sm.apply_granted(&desired, &grants, generation),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(SmError::Unreachable(SmFailure::TimedOut(APPLY_TIMEOUT))),
        };
        self.agent.set_in_flight(None);
        let outcome = match &result {
            Ok(_) => "ok",
            Err(SmError::Unreachable(_)) => "unavailable",
            Err(SmError::Refused(_)) => "refused",
            Err(SmError::StaleGeneration { .. }) => "stale_generation",
        };
        self.agent.metrics().apply(outcome, sent.elapsed());
        let was = self.sm_state;
        let applied = match result {
            Ok(outcome) => {
                tracing::debug!(keys = desired.keys.len(), generation, detail = %outcome.detail, "applied");
                self.acked_at = Some(Instant::now());
                self.knows.acknowledged_by(
                    generation,
                    desired,
                    self.agent.now_unix_ns(),
                    outcome.acknowledged_by,
                );
                self.force_apply = false;
                self.schedule.acknowledged();
                self.sm_error = None;
                self.sm_state = SmState::Reachable;
                Applied::Acknowledged
            }
            Err(SmError::StaleGeneration { sent, stored }) if self.schedule.stale_retry() => {
                // Another of our sets, newer by its generation, is stored there (e.g. sent by an
                // earlier life whose ledger was lost): move past it and send the current set.
                tracing::info!(
                    sent,
                    stored,
                    "subnet manager holds a newer generation; moving past it"
                );
                self.knows.move_past(stored);
                // Before this process's first acknowledgement, a newer set on the fabric side is
                // proof that the store lost writes (restored with its mirror, or replaced):
                // raise it, never move on silently, and go past what the lost life may still
                // have on its way.
                let detail = self
                    .knows
                    .ack()
                    .is_none()
                    .then(|| self.conditions.rolled_back(sent, stored));
                if let Some(detail) = detail.flatten() {
                    self.knows.leap_past_lost_life(stored);
                    self.raise_rolled_back(detail).await?;
                }
                Applied::RetryNow
            }
            Err(e) => {
                if let SmError::StaleGeneration { stored, .. } = &e {
                    self.knows.move_past(*stored);
                }
                let delay = self
                    .schedule
                    .failed(e.is_transient(), desired, Instant::now());
                tracing::warn!(error = %e, sm_state = %e.state(), generation, retry_in = ?delay, "apply failed");
                self.sm_error = Some(e.to_string());
                self.sm_state = e.state();
                Applied::Failed
            }
        };
        {
            let mut status = self.agent.status();
            status.sm.applies += 1;
            status.sm.reachable = self.sm_error.is_none();
            status.sm.state = self.sm_state;
            status.sm.last_error = self.sm_error.clone().unwrap_or_default();
            status.sm.generation = generation;
            status.sm.sm_hosts = self.agent.shared.parts.sm.sm_hosts();
            if matches!(applied, Applied::Acknowledged) {
                status.sm.last_apply_unix_ns = self.agent.now_unix_ns();
            }
        }
        // An event when the answer changes kind (first answer, acknowledged, refused, no
        // answer); retries that fail the same way add none.
        let state = self.sm_state;
        if was != state && !(was == SmState::Unknown && state == SmState::Reachable) {
            let _guard = self.agent.shared.write.lock().await;
            self.agent.commit(Batch {
                events: vec![EventKind::SubnetManagerChanged {
                    backend: self.agent.shared.parts.sm.backend().to_owned(),
                    reachable: self.sm_error.is_none(),
                    error: self.sm_error.clone().unwrap_or_default(),
                    state,
                }],
                ..Default::default()
            })?;
        }
        Ok(applied)
    }

    /// Commits transitions (re-checked against the current state under the write lock, so a
    /// command that changed an attachment meanwhile wins) plus reason updates, port events and
    /// the ledger without the keys an acknowledged apply removed.
    async fn commit(
        &self,
        snapshot: &[Attachment],
        transitions: Vec<plan::Transition>,
        observed: Observed<'_>,
        mut batch: Batch,
    ) -> Result<(), super::AgentError> {
        let _guard = self.agent.shared.write.lock().await;
        let now = self.agent.now_unix_ns();
        let mut touched: Vec<Attachment> = Vec::new();
        let mut latencies = Vec::new();
        for t in transitions {
            let id = snapshot[t.index].instance_id.as_str();
            let current = match touched.iter_mut().find(|a| a.instance_id.as_str() == id) {
                Some(a) => a,
                None => match self.agent.store().attachment(id)? {
                    Some(a) => {
                        touched.push(a);
                        touched.last_mut().expect("just pushed")
                    }
                    None => continue,
                },
            };
            if current.state != t.from {
                continue;
            }
            let timed = match (t.from, t.to) {
                (_, AttachmentState::Active) if t.from == AttachmentState::Drifted => {
                    Some((Timed::DriftRepaired, current.updated_unix_ns))
                }
                (_, AttachmentState::Active) => {
                    Some((Timed::AttachToActive, current.created_unix_ns))
                }
                (_, AttachmentState::Released) => {
                    Some((Timed::ReleaseToReleased, current.updated_unix_ns))
                }
                _ => None,
            };
            if let Some((which, since)) = timed {
                let ns = u64::try_from(now - since).unwrap_or(0);
                latencies.push((which, Duration::from_nanos(ns)));
            }
            current.state = t.to;
            current.updated_unix_ns = now;
            current.reason.clear();
            // The evidence of ACTIVE and RELEASED stays with the attachment; any other state
            // drops the last one.
            current.evidence.clone_from(&t.evidence);
            let mut event = changed_event(current, Some(t.from), &t.reason);
            if let EventKind::AttachmentChanged { evidence, .. } = &mut event {
                *evidence = t.evidence;
            }
            batch.events.push(event);
        }
        // Show why every attachment still waiting has not moved: another instance holding its
        // key, the subnet manager's error, or the node's own reason (a key in doubt, the
        // posture).
        // (A restored attachment keeps the reason its restore check gave it.)
        for a in snapshot
            .iter()
            .filter(|a| is_waiting(a.state) && a.restored.is_none())
        {
            if touched.iter().any(|t| t.instance_id == a.instance_id) {
                continue;
            }
            let reason = plan::held_by_partition_mate(a, snapshot, observed)
                .or_else(|| self.held_back(a))
                .or_else(|| self.sm_error.clone())
                .or_else(|| plan::waiting_reason(a, snapshot, observed))
                .unwrap_or_default();
            if a.reason == reason {
                continue;
            }
            if let Some(mut current) = self.agent.store().attachment(a.instance_id.as_str())? {
                if current.state == a.state && current.reason != reason {
                    current.reason = reason;
                    touched.push(current);
                }
            }
        }
        batch.ledger = self.knows.ledger_after_ack(&self.agent.ledger());
        batch.upserts = touched;
        self.agent.commit(batch)?;
        for (which, elapsed) in latencies {
            self.agent.metrics().transition(which, elapsed);
        }
        Ok(())
    }

    /// When the oldest RELEASED attachment falls out of `released_retain_secs` (None when
    /// there is none): released attachments are pruned on time, not only at the resync.
    fn prune_at(&self) -> Option<Instant> {
        let oldest = match self.agent.store().oldest_released() {
            Ok(o) => o?,
            Err(e) => {
                tracing::warn!(error = %e, "reading the oldest released attachment failed");
                return None;
            }
        };
        let retain =
            i64::try_from(self.agent.shared.parts.released_retain.as_nanos()).unwrap_or(i64::MAX);
        let due_in = oldest
            .saturating_add(retain)
            .saturating_sub(self.agent.now_unix_ns());
        // An absolute time, so a busy loop that recomputes it still reaches it; pruning is
        // housekeeping, so at most one attempt a second (what fell due meanwhile goes too).
        let due = Instant::now() + Duration::from_nanos(u64::try_from(due_in).unwrap_or(0));
        Some(due.max(self.prune_not_before))
    }

    async fn prune_released(&mut self) {
        self.prune_not_before = Instant::now() + PRUNE_EVERY;
        let _guard = self.agent.shared.write.lock().await;
        let retain = self.agent.shared.parts.released_retain;
        let cutoff =
            self.agent.now_unix_ns() - i64::try_from(retain.as_nanos()).unwrap_or(i64::MAX);
        match self.agent.store().expired_released(cutoff) {
            Ok(ids) if !ids.is_empty() => {
                let batch = Batch {
                    deletes: ids,
                    ..Default::default()
                };
                if let Err(e) = self.agent.commit(batch) {
                    tracing::warn!(error = %e, "pruning released attachments failed");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "listing released attachments failed"),
        }
    }
}

/// What an apply attempt came to.
enum Applied {
    /// A positive answer.
    Acknowledged,
    /// Refused for a reason the next attempt fixes at once (a stale generation).
    RetryNow,
    /// No positive answer: retry after the backoff.
    Failed,
}

/// The `RESTORED_UNCONFIRMED` detail: the restored attachments whose key is withheld (None
/// when there is none).
fn withheld(attachments: &[Attachment]) -> Option<String> {
    const NAMED: usize = 20;
    let ids: Vec<&str> = attachments
        .iter()
        .filter(|a| a.restored == Some(Restored::Unconfirmed))
        .map(|a| a.instance_id.as_str())
        .collect();
    if ids.is_empty() {
        return None;
    }
    let more = ids.len().saturating_sub(NAMED);
    let mut named = ids[..ids.len().min(NAMED)].join(", ");
    if more > 0 {
        named.push_str(&format!(" and {more} more"));
    }
    Some(format!(
        "{} restored attachment(s) withheld: the store may predate their release (restored from \
         a copy, or an unclean stop left a change unsent) and the ports did not hold their keys \
         at the first read after the start; each waits for the control plane to send its attach \
         again or to release it: {named}",
        ids.len()
    ))
}

fn is_waiting(s: AttachmentState) -> bool {
    matches!(
        s,
        AttachmentState::Pending
            | AttachmentState::Programming
            | AttachmentState::Drifted
            | AttachmentState::Releasing
    )
}
