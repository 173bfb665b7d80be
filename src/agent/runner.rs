//! The reconciler loop: apply the desired set through the subnet manager (with capped, jittered
//! backoff while it is unreachable), read the ports, commit what `plan` decides, report port
//! changes and standing conditions, then sleep until something happens. Idle costs nothing: it
//! waits on a wake-up, the observer's change signal, a retry or resync deadline, or shutdown.
//!
//! Write-ahead: before an apply is sent, the apply ledger (src/domain/ledger.rs) durably covers
//! its generation and every key it carries. An apply that gets no positive answer leaves those
//! keys in doubt, and the loop keeps sending the current desired set until one is acknowledged,
//! even when the desired set went back to the last acknowledged one: the failed apply may have
//! reached the subnet manager.

use super::metrics::Timed;
use super::plan::{self, Ack, Observed};
use super::{changed_event, now_unix_ns, ports, Agent, ApplyInFlight};
use crate::domain::{
    Attachment, AttachmentState, Carried, ConditionKind, EventKind, Guid, Inventory,
    NodeMemberships, PKey, PKeyValue, SmState,
};
use crate::sm::{SmError, SmFailure};
use crate::store::Batch;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Longest a single apply may take before it counts as unavailable (its keys stay in doubt).
pub(super) const APPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// The loop goes round at least this often even when nothing happens.
const HEARTBEAT: Duration = Duration::from_secs(60);
/// Released attachments are pruned at most this often.
const PRUNE_EVERY: Duration = Duration::from_secs(1);
/// Stale-generation answers retried at once before backing off.
const STALE_RETRIES: u32 = 3;

/// The subnet manager's last positive answer.
struct AckRecord {
    generation: u64,
    set: NodeMemberships,
    at: Instant,
    unix_ns: i64,
}

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
    ack: Option<AckRecord>,
    /// (Port, key) -> generation of the last apply attempt that carried it.
    carried: Carried,
    next_generation: u64,
    /// An apply since the last acknowledgement got no positive answer.
    unacked: bool,
    force_apply: bool,
    retry_at: Option<Instant>,
    backoff: Duration,
    failures: u64,
    stale_retries: u32,
    resync_at: Instant,
    /// Resyncs scheduled so far (draws each one's jitter).
    resync_round: u64,
    sm_error: Option<String>,
    /// What the subnet manager did with the last finished apply.
    sm_state: SmState,
    /// The set the last failed apply carried: a different desired set (a new request) is
    /// sent at once instead of waiting out that failure's backoff.
    failed_set: Option<NodeMemberships>,
    /// The last inventory read successfully: port-table and port-state events compare
    /// against it, so a change across a failed read is still reported.
    prev_inventory: Option<Inventory>,
    foreign_reported: BTreeSet<(Guid, PKeyValue)>,
    conditions: BTreeMap<ConditionKind, String>,
    /// No prune before this (one attempt a second at most, whether it succeeded or not).
    prune_not_before: Instant,
}

pub(super) async fn run(agent: Agent, mut shutdown: watch::Receiver<bool>) {
    let cfg = agent.shared.parts.reconciler.clone();
    let prev_inventory = agent.status().inventory.clone();
    let ledger = agent.ledger();
    // Keys from before this start may have been sent with any generation up to the reserved
    // one; this process's generations all lie above it.
    let before = ledger.generation_reserved;
    let agent_node_id = agent.shared.parts.node_id.clone();
    let conditions = agent.reported_conditions();
    let mut l = Loop {
        agent,
        ack: None,
        carried: Carried::from_ledger(&ledger, before),
        next_generation: before.saturating_add(1),
        unacked: false,
        // Confirm the desired set with the SM once after every start.
        force_apply: true,
        retry_at: None,
        backoff: Duration::from_millis(cfg.backoff_initial_ms),
        failures: 0,
        stale_retries: 0,
        resync_at: Instant::now() + resync_delay(agent_node_id.as_str(), 0, &cfg),
        resync_round: 0,
        sm_error: None,
        sm_state: SmState::Unknown,
        failed_set: None,
        prev_inventory,
        foreign_reported: BTreeSet::new(),
        conditions,
        prune_not_before: Instant::now(),
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
        // A retry deadline already past (the ports were unreadable, so no apply happened)
        // must not wake the loop at once, again and again: the observer's poll wakes it.
        let retry = l.retry_at.filter(|t| *t > Instant::now());
        let prune_at = l.prune_at();
        let deadline = [
            retry,
            Some(l.resync_at),
            prune_at,
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
                l.retry_now();
            }
            _ = tokio::time::sleep_until(deadline) => {}
        }
        if Instant::now() >= l.resync_at {
            l.resync_round += 1;
            l.resync_at = Instant::now()
                + resync_delay(l.agent.shared.parts.node_id.as_str(), l.resync_round, &cfg);
            l.force_apply = true;
            l.prune_released().await;
        } else if prune_at.is_some_and(|t| Instant::now() >= t) {
            l.prune_released().await;
        }
    }
    tracing::info!("reconciler stopped");
}

/// A retry delay's jitter factor in [0.8, 1.2): spread across a fleet (it depends on the node
/// id) yet reproducible (no process-global randomness), so a run can be replayed exactly.
fn jitter(node_id: &str, attempt: u64) -> f64 {
    let mut h = std::hash::DefaultHasher::new();
    (node_id, attempt).hash(&mut h);
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    0.8 + 0.4 * unit
}

/// The wait before resync `round`: `resync_secs` times a factor uniform in
/// [1 - pct/100, 1 + pct/100], drawn from the node id and the round (spread across a fleet,
/// reproducible per node).
fn resync_delay(node_id: &str, round: u64, cfg: &crate::config::ReconcilerConfig) -> Duration {
    let mut h = std::hash::DefaultHasher::new();
    (node_id, "resync", round).hash(&mut h);
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    let spread = f64::from(cfg.resync_jitter_pct.min(50)) / 100.0;
    Duration::from_secs(cfg.resync_secs).mul_f64(1.0 + spread * (2.0 * unit - 1.0))
}

impl Loop {
    fn beat(&self) {
        self.agent.shared.beats.send_modify(|b| *b += 1);
    }

    /// Drops the failure's backoff: the next pass applies at once.
    fn retry_now(&mut self) {
        self.retry_at = None;
        self.backoff = Duration::from_millis(self.agent.shared.parts.reconciler.backoff_initial_ms);
    }

    fn pending(&self) -> bool {
        self.unacked
            || self
                .agent
                .store()
                .live_attachments()
                .map(|all| all.iter().any(|a| is_waiting(a.state)))
                .unwrap_or(true)
    }

    /// One pass. Returns true when another pass should follow at once.
    async fn pass(&mut self) -> Result<bool, super::AgentError> {
        let mut reading = self.read_ports().await;
        // RELEASED attachments play no part in a pass: only the live ones are read, so a pass
        // costs the same after a million releases as after one.
        let attachments = self.agent.store().live_attachments()?;
        let guids: Vec<Guid> = reading
            .inventory
            .as_ref()
            .map(|i| i.fabric_ports().map(|p| p.port_guid).collect())
            .unwrap_or_default();
        let desired = plan::desired(
            &self.agent.shared.parts.node_id,
            guids,
            reading.inventory.as_ref(),
            &attachments,
        );
        let mut again = false;
        let needed =
            self.force_apply || self.unacked || self.ack.as_ref().map(|a| &a.set) != Some(&desired);
        // (Only with ports read: a set built without them is no request.)
        if reading.inventory.is_some()
            && self.retry_at.is_some()
            && self.failed_set.as_ref().is_some_and(|f| *f != desired)
        {
            // A new request since the failure: it is not the set that failed, so it goes now.
            tracing::debug!("the desired set changed since the failed apply; retrying now");
            self.retry_now();
        }
        let due = self.retry_at.is_none_or(|t| Instant::now() >= t);
        if needed && due && reading.inventory.is_some() {
            // The grants come from the same snapshot as the set: never one for a key it lacks.
            let grants = plan::grants(&desired, &attachments);
            match self.apply(desired, grants).await? {
                Applied::Acknowledged => {
                    // The evidence for ACTIVE and RELEASED must come from a read that started
                    // after the acknowledgement.
                    reading = self.read_ports().await;
                }
                Applied::RetryNow => again = true,
                Applied::Failed => {}
            }
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
            self.foreign(inv, &attachments, &mut batch.events);
        }
        let mut conditions = self.conditions(full_default, allow_full_default);
        if let Some(error) = &reading.error {
            conditions.insert(
                ConditionKind::PortsUnreadable,
                format!("the last port read failed: {error}; no attachment changes state until the ports are read"),
            );
        }
        batch.events.extend(self.condition_events(conditions));
        let gone = match inventory {
            Some(inv) => {
                ports::gone_from_fabric(&*self.agent.shared.parts.observer, inv, &attachments).await
            }
            None => Default::default(),
        };
        let observed = Observed {
            ack: self.ack.as_ref().map(|a| Ack {
                generation: a.generation,
                set: &a.set,
                unix_ns: a.unix_ns,
            }),
            carried: &self.carried,
            inventory,
            read_after_ack: self.ack.as_ref().is_some_and(|a| reading.started > a.at),
            read_unix_ns: reading.started_unix_ns,
            posture_ok,
            gone: &gone,
        };
        let transitions = plan::plan(&attachments, observed);
        if transitions.iter().any(|t| t.to == AttachmentState::Drifted) {
            self.force_apply = true;
            again = true;
        }
        self.commit(&attachments, transitions, observed, batch)
            .await?;
        self.forget_released_keys();
        // A failed read keeps the last good inventory: the next good one is compared with it.
        if reading.inventory.is_some() {
            self.prev_inventory = reading.inventory;
        }
        Ok(again)
    }

    async fn read_ports(&mut self) -> Reading {
        let started = Instant::now();
        let started_unix_ns = now_unix_ns();
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
        let generation = self.next_generation;
        self.next_generation = generation.saturating_add(1);
        {
            let _guard = self.agent.shared.write.lock().await;
            if let Some(ledger) = self
                .agent
                .ledger()
                .covering(generation, desired.keys.keys())
            {
                self.agent.commit(Batch {
                    ledger: Some(ledger),
                    ..Default::default()
                })?;
            }
        }
        self.carried.record(&desired, generation);
        // Until a positive answer, everything this apply carried is in doubt.
        self.unacked = true;
        self.agent.status().sm.in_doubt = self.in_doubt();
        let sm = self.agent.shared.parts.sm.clone();
        let sent = Instant::now();
        self.agent.set_in_flight(Some(ApplyInFlight {
            since: sent.into_std(),
            since_unix_ns: now_unix_ns(),
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
        let cfg = &self.agent.shared.parts.reconciler;
        let was = self.sm_state;
        let applied = match result {
            Ok(outcome) => {
                tracing::debug!(keys = desired.keys.len(), generation, detail = %outcome.detail, "applied");
                self.ack = Some(AckRecord {
                    generation,
                    set: desired,
                    at: Instant::now(),
                    unix_ns: now_unix_ns(),
                });
                self.unacked = false;
                self.force_apply = false;
                self.retry_at = None;
                self.backoff = Duration::from_millis(cfg.backoff_initial_ms);
                self.failures = 0;
                self.stale_retries = 0;
                self.sm_error = None;
                self.sm_state = SmState::Reachable;
                self.failed_set = None;
                Applied::Acknowledged
            }
            Err(SmError::StaleGeneration { sent, stored })
                if self.stale_retries < STALE_RETRIES =>
            {
                // Another of our sets, newer by its generation, is stored there (e.g. sent by an
                // earlier life whose ledger was lost): move past it and send the current set.
                tracing::info!(
                    sent,
                    stored,
                    "subnet manager holds a newer generation; moving past it"
                );
                self.stale_retries += 1;
                self.next_generation = self.next_generation.max(stored.saturating_add(1));
                self.retry_at = None;
                // Before this process's first acknowledgement, a newer set on the fabric side is
                // proof that the store lost writes (restored with its mirror, or replaced):
                // raise it, never move on silently.
                let kind = ConditionKind::StoreRolledBack;
                if self.ack.is_none() && !self.conditions.contains_key(&kind) {
                    let detail = format!("the subnet manager holds generation {stored} of this node, newer than any the store sent ({sent}): the store lost writes (restored or replaced), or another agent uses this node id");
                    let _guard = self.agent.shared.write.lock().await;
                    self.agent.commit(Batch {
                        events: vec![EventKind::ConditionChanged {
                            condition: kind,
                            active: true,
                            detail: detail.clone(),
                        }],
                        // The log went back with the store: a new epoch, no seq reused.
                        restart_log: true,
                        ..Default::default()
                    })?;
                    self.conditions.insert(kind, detail);
                }
                Applied::RetryNow
            }
            Err(e) => {
                if let SmError::StaleGeneration { stored, .. } = &e {
                    self.next_generation = self.next_generation.max(stored.saturating_add(1));
                }
                // Permanent refusals are retried too (an operator may fix them), just slowly.
                let delay = if e.is_transient() {
                    self.backoff
                } else {
                    Duration::from_millis(cfg.backoff_max_ms)
                };
                self.failures += 1;
                let jitter = jitter(self.agent.shared.parts.node_id.as_str(), self.failures);
                self.retry_at = Some(Instant::now() + delay.mul_f64(jitter));
                self.backoff = (self.backoff * 2).min(Duration::from_millis(cfg.backoff_max_ms));
                tracing::warn!(error = %e, sm_state = %e.state(), generation, retry_in = ?delay, "apply failed");
                self.sm_error = Some(e.to_string());
                self.sm_state = e.state();
                self.failed_set = Some(desired);
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
            if matches!(applied, Applied::Acknowledged) {
                status.sm.last_apply_unix_ns = now_unix_ns();
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

    /// Keys in doubt: carried by an attempt with no acknowledgement since.
    fn in_doubt(&self) -> Vec<PKey> {
        let acked = self.ack.as_ref().map_or(0, |a| a.generation);
        self.carried.in_doubt(acked)
    }

    /// Drops keys an acknowledged apply removed from the in-memory record (the durable ledger
    /// drops them in `commit`).
    fn forget_released_keys(&mut self) {
        if let Some(ack) = &self.ack {
            self.carried.forget_settled(&ack.set, ack.generation);
        }
        self.agent.status().sm.in_doubt = self.in_doubt();
    }

    /// The standing conditions now: the backend's and the node's own posture. Without a port
    /// read the posture stays as last seen.
    fn conditions(
        &self,
        full_default: Option<Vec<String>>,
        allow_full_default: bool,
    ) -> BTreeMap<ConditionKind, String> {
        let mut now: BTreeMap<ConditionKind, String> = self
            .agent
            .shared
            .parts
            .sm
            .conditions()
            .into_iter()
            .map(|c| (c.kind, c.detail))
            .collect();
        let kind = ConditionKind::FullDefaultMembership;
        match full_default {
            Some(ports) if !ports.is_empty() => {
                let accepted = if allow_full_default {
                    "; accepted by allow_full_default"
                } else {
                    "; tenant keys are not reported ACTIVE until allow_full_default = true"
                };
                now.insert(
                    kind,
                    format!(
                        "{} full member of the default partition (0xffff): every tenant can reach this node{accepted}",
                        ports.join(", ")
                    ),
                );
            }
            Some(_) => {}
            None => {
                if let Some(d) = self.conditions.get(&kind) {
                    now.insert(kind, d.clone());
                }
            }
        }
        // A store rollback stands until this process's first acknowledged apply: its
        // generations lie above the restored ledger's floor, so the fabric side then holds the
        // node's current set again.
        let rolled_back = ConditionKind::StoreRolledBack;
        if let (None, Some(d)) = (&self.ack, self.conditions.get(&rolled_back)) {
            now.insert(rolled_back, d.clone());
        }
        now
    }

    /// Events for conditions raised, changed or cleared; records the new set.
    fn condition_events(&mut self, now: BTreeMap<ConditionKind, String>) -> Vec<EventKind> {
        let mut events = Vec::new();
        for (kind, detail) in &now {
            // Logged once, when the event commits (`Agent::log_event`).
            if self.conditions.get(kind) != Some(detail) {
                events.push(EventKind::ConditionChanged {
                    condition: *kind,
                    active: true,
                    detail: detail.clone(),
                });
            }
        }
        for (kind, detail) in &self.conditions {
            if !now.contains_key(kind) {
                events.push(EventKind::ConditionChanged {
                    condition: *kind,
                    active: false,
                    detail: detail.clone(),
                });
            }
        }
        self.agent.status().conditions = now
            .iter()
            .map(|(kind, detail)| crate::domain::Condition {
                kind: *kind,
                detail: detail.clone(),
            })
            .collect();
        self.conditions = now;
        events
    }

    fn foreign(
        &mut self,
        inv: &Inventory,
        attachments: &[Attachment],
        events: &mut Vec<EventKind>,
    ) {
        let known: BTreeSet<u16> = attachments
            .iter()
            .filter(|a| a.state != AttachmentState::Released)
            .map(|a| a.partition.pkey.base())
            .collect();
        let mut seen = BTreeSet::new();
        for (port, key) in ports::foreign_keys(inv, &known) {
            seen.insert((port.port_guid, key));
            if !self.foreign_reported.contains(&(port.port_guid, key)) {
                tracing::warn!(device = %port.device, port = port.port_number, pkey = %key, "foreign P_Key on a fabric port");
                events.push(EventKind::ForeignPKey {
                    device: port.device.clone(),
                    port_number: port.port_number,
                    port_guid: port.port_guid,
                    pkey_value: key,
                });
            }
        }
        self.foreign_reported = seen;
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
        let now = now_unix_ns();
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
            let mut event = changed_event(current, Some(t.from), &t.reason);
            if let EventKind::AttachmentChanged { evidence, .. } = &mut event {
                *evidence = t.evidence;
            }
            batch.events.push(event);
        }
        // Show why every attachment still waiting has not moved: another instance holding its
        // key, the subnet manager's error, or the node's own reason (a key in doubt, the
        // posture).
        for a in snapshot.iter().filter(|a| is_waiting(a.state)) {
            if touched.iter().any(|t| t.instance_id == a.instance_id) {
                continue;
            }
            let reason = plan::held_by_partition_mate(a, snapshot, observed)
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
        let ledger = self.agent.ledger();
        let mut kept = ledger.clone();
        kept.keys.retain(|k| !observed.acked_without(*k));
        if kept != ledger {
            batch.ledger = Some(kept);
        }
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
        let due_in = oldest.saturating_add(retain).saturating_sub(now_unix_ns());
        // An absolute time, so a busy loop that recomputes it still reaches it; pruning is
        // housekeeping, so at most one attempt a second (what fell due meanwhile goes too).
        let due = Instant::now() + Duration::from_nanos(u64::try_from(due_in).unwrap_or(0));
        Some(due.max(self.prune_not_before))
    }

    async fn prune_released(&mut self) {
        self.prune_not_before = Instant::now() + PRUNE_EVERY;
        let _guard = self.agent.shared.write.lock().await;
        let retain = self.agent.shared.parts.released_retain;
        let cutoff = now_unix_ns() - i64::try_from(retain.as_nanos()).unwrap_or(i64::MAX);
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

fn is_waiting(s: AttachmentState) -> bool {
    matches!(
        s,
        AttachmentState::Pending
            | AttachmentState::Programming
            | AttachmentState::Drifted
            | AttachmentState::Releasing
    )
}

#[cfg(test)]
mod tests {
    use super::{jitter, resync_delay};
    use crate::config::ReconcilerConfig;

    #[test]
    fn resync_jitter_spreads_a_fleet_restarted_at_once() {
        let cfg = ReconcilerConfig {
            resync_secs: 300,
            resync_jitter_pct: 10,
            ..ReconcilerConfig::default()
        };
        // 2,000 nodes started together: their first resyncs, by 6-second bucket.
        let delays: Vec<f64> = (0..2000)
            .map(|n| resync_delay(&format!("node-{n}"), 0, &cfg).as_secs_f64())
            .collect();
        assert!(delays.iter().all(|d| (270.0..=330.0).contains(d)));
        let mut buckets = [0usize; 10];
        for d in &delays {
            let bucket = (1..10u32)
                .take_while(|b| *d >= 270.0 + 6.0 * f64::from(*b))
                .count();
            buckets[bucket] += 1;
        }
        // Uniform: about 200 per bucket; none empty, none holding a crowd.
        assert!(
            buckets.iter().all(|b| (120..=280).contains(b)),
            "{buckets:?}"
        );
        // Each round draws again; the same node and round give the same wait.
        assert_ne!(
            resync_delay("node-1", 1, &cfg),
            resync_delay("node-1", 2, &cfg)
        );
        assert_eq!(
            resync_delay("node-1", 1, &cfg),
            resync_delay("node-1", 1, &cfg)
        );
        let none = ReconcilerConfig {
            resync_jitter_pct: 0,
            ..cfg
        };
        assert_eq!(resync_delay("node-1", 3, &none).as_secs(), 300);
    }

    #[test]
    fn jitter_is_reproducible_and_bounded() {
        for attempt in 0..1000 {
            let j = jitter("gpu-node-17", attempt);
            assert!((0.8..1.2).contains(&j), "{j}");
            assert_eq!(j, jitter("gpu-node-17", attempt));
        }
        assert_ne!(jitter("gpu-node-17", 1), jitter("gpu-node-18", 1));
    }
}
