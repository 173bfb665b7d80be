//! The agent: command handling (attach, release, queries), the reconciler, and event publishing.
//!
//! Commands validate, persist durably and then wake the reconciler; the reconciler
//! (`runner`) applies the node's desired set through the subnet manager, reads the ports through
//! the observer and commits the state changes that `plan` decides. What the node knows of the
//! subnet manager (acknowledged, in doubt, the apply ledger) is decided in `sm_knowledge`; the
//! rules are the README's truth rules. Every state change and its
//! event are committed together before the event is published.

mod admission;
mod clock;
mod conditions;
mod error;
pub mod metrics;
mod plan;
mod ports;
mod reconciler_config;
mod runner;
mod schedule;
mod sm_knowledge;
mod stall;
pub mod start_check;
mod status;
mod watch;

pub use admission::{AttachRequest, Covered};
pub use clock::{Clock, RuntimeClock, SystemClock};
pub use error::{AgentError, CursorError, Refusal, StreamEnd};
// The truth rules, pure, for the SM-hosts simulation (tests/simulation/sm_hosts): no behaviour.
pub use plan::{desired, plan, restore_checks, Observed, RestoreCheck, Transition};
pub use reconciler_config::ReconcilerConfig;
pub use sm_knowledge::{Ack, SmKnowledge};
pub use status::{ApplyInFlight, NodeView, SmStatus};
pub use watch::{EventStream, WatchFrom, MAX_BATCH as MAX_WATCH_BATCH};

use crate::domain::{
    ApplyLedger, Attachment, AttachmentState, Event, EventKind, FabricName, Inventory, NodeId,
    PortSelector,
};
use crate::observe::PortObserver;
use crate::sm::SubnetManager;
use crate::store::{AttachmentPage, Batch, Store};
use admission::Admission;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, Notify};

/// The longest an RPC may wait for a state.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Filters for [`Agent::list`]; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<AttachmentState>,
    /// Only this partition id.
    pub partition_id: Option<String>,
    /// Only this instance id.
    pub instance_id: Option<String>,
}

impl ListFilter {
    /// Whether an attachment passes every filter.
    pub fn matches(&self, a: &Attachment) -> bool {
        self.state.is_none_or(|s| a.state == s)
            && self
                .partition_id
                .as_deref()
                .is_none_or(|p| a.partition.id.as_str() == p)
            && self
                .instance_id
                .as_deref()
                .is_none_or(|i| a.instance_id.as_str() == i)
    }
}

/// The parts an agent is made of (the daemon's composition root, `crate::daemon`, builds them).
pub struct AgentParts {
    /// This node's id.
    pub node_id: NodeId,
    /// This node's fabric.
    pub fabric: FabricName,
    /// The durable store.
    pub store: Arc<Store>,
    /// The subnet-manager backend.
    pub sm: Arc<dyn SubnetManager>,
    /// The port observer.
    pub observer: Arc<dyn PortObserver>,
    /// Why this observer was chosen.
    pub observer_reason: String,
    /// Which ports belong to the fabric.
    pub selector: PortSelector,
    /// Reconciler timing.
    pub reconciler: ReconcilerConfig,
    /// How long RELEASED attachments stay listed.
    pub released_retain: Duration,
    /// The operator accepted fabric ports that are full members of the default partition.
    pub allow_full_default: bool,
    /// `[grants]`: whether an attach needs the control plane's grant, and its keys.
    pub grants: crate::domain::GrantPolicy,
    /// The wall clock: timestamps and the released-attachment retention.
    pub clock: Arc<dyn Clock>,
}

/// A cheap handle to the running agent.
#[derive(Clone)]
pub struct Agent {
    shared: Arc<Shared>,
}

struct Shared {
    parts: AgentParts,
    /// Serialises read-check-commit of attachments between commands and the reconciler.
    write: tokio::sync::Mutex<()>,
    events: broadcast::Sender<Arc<Event>>,
    changed: tokio::sync::watch::Sender<u64>,
    wake: Notify,
    status: Mutex<status::Status>,
    /// Counts reconciler loop turns.
    beats: tokio::sync::watch::Sender<u64>,
    /// Turns true when the daemon begins shutting down (ends WatchEvents streams).
    stopping: tokio::sync::watch::Sender<bool>,
    /// The durable apply ledger's current value (written only through [`Agent::commit`]).
    ledger: Mutex<ApplyLedger>,
    /// Prometheus metrics.
    metrics: metrics::Metrics,
    /// This life may follow a lost one: the last stop was not clean, or the store was found
    /// restored from a copy (`ApplyLedger::LOST_LIFE_MARGIN`).
    follows_lost_life: bool,
    /// The store's open found it restored from a copy and restarted its log (this life's log
    /// is already one no watcher followed before).
    log_restarted_at_open: bool,
    /// Instances the control plane attached (or attached again) in this life: newer than any
    /// copy the store may have come from, so the start check's unsent rule leaves them alone.
    attached_this_life: Mutex<std::collections::HashSet<crate::domain::InstanceId>>,
}

/// Unix time in nanoseconds, from the system clock (the agent itself reads its
/// [`AgentParts::clock`]).
pub fn now_unix_ns() -> i64 {
    SystemClock.now_unix_ns()
}

impl Agent {
    /// Creates the agent from its parts, starting its life on the store (a new log epoch when
    /// the last stop was not clean: [`Store::begin_life`](crate::store::Store::begin_life))
    /// and loading the apply ledger from it. Call [`Agent::read_ports`] before serving and
    /// [`Agent::reconcile`] to start the reconciler; [`Agent::stopped_cleanly`] after both
    /// stopped.
    pub fn new(parts: AgentParts) -> Result<Agent, AgentError> {
        let life = parts.store.begin_life(parts.clock.now_unix_ns())?;
        tracing::debug!(?life, "store life started");
        let follows_lost_life = matches!(
            life,
            crate::store::LifeStart::NewEpoch { .. } | crate::store::LifeStart::RolledBack
        );
        let log_restarted_at_open = matches!(life, crate::store::LifeStart::RolledBack);
        let mut status = status::Status::new(parts.sm.backend());
        // What the log last reported stands until the reconciler's first pass says otherwise.
        status.conditions = parts
            .store
            .conditions()?
            .into_iter()
            .map(|(kind, detail)| crate::domain::Condition { kind, detail })
            .collect();
        let ledger = parts.store.ledger()?;
        let metrics = metrics::Metrics::new(parts.sm.backend());
        Ok(Agent {
            shared: Arc::new(Shared {
                parts,
                write: tokio::sync::Mutex::new(()),
                events: broadcast::channel(4096).0,
                changed: tokio::sync::watch::channel(0).0,
                wake: Notify::new(),
                status: Mutex::new(status),
                beats: tokio::sync::watch::channel(0).0,
                stopping: tokio::sync::watch::channel(false).0,
                ledger: Mutex::new(ledger),
                metrics,
                follows_lost_life,
                log_restarted_at_open,
                attached_this_life: Mutex::default(),
            }),
        })
    }

    /// Reads the ports once (the first inventory, before READY).
    pub async fn read_ports(&self) -> Result<Inventory, AgentError> {
        let mut inv = self.shared.parts.observer.inventory().await?;
        self.shared.parts.selector.apply(&mut inv);
        self.status().inventory = Some(inv.clone());
        Ok(inv)
    }

    /// Starts the reconciler; it stops when `shutdown` turns true.
    pub fn reconcile(
        &self,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(runner::run(self.clone(), shutdown))
    }

    /// Attaches an instance to a partition (idempotent). Replies after the change is durable;
    /// with `wait`, waits up to that long for ACTIVE. Returns the attachment and whether it was
    /// created by this call.
    pub async fn attach(
        &self,
        request: AttachRequest,
        wait: Option<Duration>,
    ) -> Result<(Attachment, bool), AgentError> {
        let (attachment, created) = {
            let _guard = self.shared.write.lock().await;
            // Admission needs the live attachments, plus this instance's own if it was
            // released (a terminated instance is never attached again); not the whole history.
            let mut attachments = self.store().live_attachments()?;
            if let Some(own) = self.store().attachment(request.instance_id.as_str())? {
                if own.state == AttachmentState::Released {
                    attachments.push(own);
                }
            }
            admission::check_grant(
                &request,
                &self.shared.parts.node_id,
                &self.shared.parts.grants,
            )?;
            let inventory = self
                .status()
                .inventory
                .clone()
                .ok_or(AgentError::PortsNotRead)?;
            let admitted = match admission::admit(
                &request,
                &self.shared.parts.fabric,
                &attachments,
                &inventory,
            )? {
                Admission::Existing(a) if a.restored.is_some() => {
                    // The control plane's attach is newer than the copy the store was restored
                    // from: it confirms the attachment, whose key is sent again (covered in the
                    // ledger first, as for a new one).
                    let mut a = *a;
                    a.restored = None;
                    a.reason.clear();
                    // The control plane's current grant (checked above) replaces the copy's.
                    if let Some(grant) = &request.grant {
                        a.grant = Some(grant.clone());
                    }
                    tracing::info!(instance = %a.instance_id, "restored attachment confirmed by the control plane's attach");
                    let ledger = sm_knowledge::SmKnowledge::ledger_for_attach(
                        &self.ledger(),
                        a.partition.pkey,
                    );
                    self.commit(Batch {
                        upserts: vec![a.clone()],
                        ledger,
                        ..Default::default()
                    })?;
                    (a, false)
                }
                Admission::Existing(a) => (*a, false),
                Admission::Create(covered) => {
                    let now = self.now_unix_ns();
                    let a = Attachment {
                        instance_id: request.instance_id,
                        partition: request.partition,
                        membership: request.membership,
                        state: AttachmentState::Pending,
                        reason: String::new(),
                        created_unix_ns: now,
                        updated_unix_ns: now,
                        grant: request.grant,
                        ports: covered.ports,
                        named_ports: covered.named,
                        restored: None,
                        evidence: None,
                    };
                    let event = changed_event(&a, None, "attach requested");
                    // The key will be sent soon: cover it in the ledger now, in the same commit.
                    let ledger = sm_knowledge::SmKnowledge::ledger_for_attach(
                        &self.ledger(),
                        a.partition.pkey,
                    );
                    self.commit(Batch {
                        upserts: vec![a.clone()],
                        events: vec![event],
                        ledger,
                        ..Default::default()
                    })?;
                    (a, true)
                }
            };
            // Under the write lock: the start check's unsent rule reads it there.
            self.shared
                .attached_this_life
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(admitted.0.instance_id.clone());
            admitted
        };
        self.shared.wake.notify_one();
        let attachment = match wait {
            Some(d) => {
                self.wait_for(attachment.instance_id.as_str(), d, |s| {
                    matches!(s, AttachmentState::Active | AttachmentState::Failed)
                        || s.is_released_or_releasing()
                })
                .await?
            }
            None => attachment,
        };
        Ok((attachment, created))
    }

    /// The instance was terminated: its attachment goes RELEASING (idempotent). With `wait`,
    /// waits up to that long for RELEASED.
    pub async fn release(
        &self,
        instance_id: &str,
        wait: Option<Duration>,
    ) -> Result<Attachment, AgentError> {
        let attachment = {
            let _guard = self.shared.write.lock().await;
            let mut a = self.get(instance_id)?;
            if !a.state.is_released_or_releasing() {
                let from = a.state;
                a.state = AttachmentState::Releasing;
                a.evidence = None;
                // A restored attachment's release settles it: nothing asks for its key now.
                a.restored = None;
                a.reason.clear();
                a.updated_unix_ns = self.now_unix_ns();
                let event = changed_event(&a, Some(from), "instance terminated");
                self.commit(Batch {
                    upserts: vec![a.clone()],
                    events: vec![event],
                    ..Default::default()
                })?;
            }
            a
        };
        self.shared.wake.notify_one();
        match wait {
            Some(d) => {
                self.wait_for(instance_id, d, |s| s == AttachmentState::Released)
                    .await
            }
            None => Ok(attachment),
        }
    }

    /// One attachment by instance id.
    pub fn get(&self, instance_id: &str) -> Result<Attachment, AgentError> {
        let mut a = self
            .store()
            .attachment(instance_id)?
            .ok_or_else(|| AgentError::AttachmentNotFound(instance_id.to_owned()))?;
        self.show_in_flight(std::slice::from_mut(&mut a));
        Ok(a)
    }

    /// Attachments matching a filter.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<Attachment>, AgentError> {
        let mut all: Vec<Attachment> = self
            .store()
            .attachments()?
            .into_iter()
            .filter(|a| filter.matches(a))
            .collect();
        self.show_in_flight(&mut all);
        Ok(all)
    }

    /// While an apply is in flight, a waiting attachment whose key it carries (or whose
    /// release it carries) says so, with since when and to which backend, instead of an empty
    /// or stale reason. Shown on read only: nothing is stored.
    fn show_in_flight(&self, attachments: &mut [Attachment]) {
        let Some((in_flight, reason)) = ({
            let status = self.status();
            status
                .sm
                .in_flight
                .as_ref()
                .map(|f| (f.clone(), f.reason(&status.sm.backend)))
        }) else {
            return;
        };
        for a in attachments.iter_mut() {
            let carried = in_flight.keys.contains(&a.partition.pkey);
            let waits = match a.state {
                AttachmentState::Pending => carried,
                AttachmentState::Releasing => !carried,
                _ => false,
            };
            if waits {
                a.reason = if a.reason.is_empty() {
                    reason.clone()
                } else {
                    format!("{reason}; last: {}", a.reason)
                };
            }
        }
    }

    /// Up to `limit` attachments matching a filter whose instance id sorts after `after`,
    /// ordered by instance id (see [`Store::attachments_page`]).
    pub fn list_page(
        &self,
        filter: &ListFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AttachmentPage, AgentError> {
        let mut page = self
            .store()
            .attachments_page(after, limit, |a| filter.matches(a))?;
        self.show_in_flight(&mut page.attachments);
        Ok(page)
    }

    /// This node's view: ports, subnet manager, counts.
    pub fn node(&self) -> Result<NodeView, AgentError> {
        let attachments = self.store().attachments()?;
        let (first_seq, last_seq) = self.store().event_bounds()?;
        let status = self.status();
        let parts = &self.shared.parts;
        Ok(NodeView {
            node_id: parts.node_id.to_string(),
            fabric: parts.fabric.as_str().to_owned(),
            ports: status
                .inventory
                .as_ref()
                .map(|i| i.ports.clone())
                .unwrap_or_default(),
            pkey_capacity: status
                .inventory
                .as_ref()
                .map(Inventory::tenant_key_capacity)
                .unwrap_or(0),
            sm: SmStatus {
                in_doubt_values: status::in_doubt_values(&status.sm.in_doubt, &attachments),
                ..status.sm.clone()
            },
            observer: parts.observer.kind().to_owned(),
            observer_reason: parts.observer_reason.clone(),
            counts: state_counts(&attachments).collect(),
            first_event_seq: first_seq,
            last_event_seq: last_seq,
            log_epoch: self.store().epoch().to_string(),
            conditions: status.conditions.clone(),
        })
    }

    /// Events after `from.after`, replayed from the log and then followed live, as a stream
    /// that reads ahead at most one replay batch. OUT_OF_RANGE for a cursor of another log, beyond the newest event or
    /// before the oldest retained one.
    pub fn watch(&self, from: WatchFrom) -> Result<watch::EventStream, AgentError> {
        watch::start(self.clone(), from)
    }

    /// The standing conditions the log last reported (raised, not cleared): the reconciler
    /// starts from them, so a restart neither raises them again nor forgets to clear them.
    fn reported_conditions(
        &self,
    ) -> std::collections::BTreeMap<crate::domain::ConditionKind, String> {
        self.store().conditions().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the reported conditions failed");
            Default::default()
        })
    }

    /// The event log's epoch (32 hex digits).
    pub fn log_epoch(&self) -> String {
        self.store().epoch().to_string()
    }

    /// Wakes the reconciler for a pass now (after a SIGHUP changed the subnet manager's hosts).
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// Ends every WatchEvents stream (with UNAVAILABLE, so clients reconnect with their last
    /// seq elsewhere or after the restart): long-lived streams must not hold up a drain.
    pub fn begin_shutdown(&self) {
        self.shared.stopping.send_replace(true);
    }

    /// Records a clean stop in the store (durably), so the next start keeps the log's epoch
    /// and cursors resume. Call only once the API is drained and the reconciler has stopped:
    /// nothing may append an event after it (a commit after it removes the marker, and the
    /// next start opens a new epoch).
    pub async fn stopped_cleanly(&self) -> Result<(), AgentError> {
        let _guard = self.shared.write.lock().await;
        self.store().mark_clean_stop()?;
        tracing::info!(epoch = %self.store().epoch(), "clean stop recorded: the next start keeps the log epoch");
        Ok(())
    }

    /// Wakes the reconciler and reports whether it went round its loop within `limit`, or is
    /// inside an apply that has not yet reached its own timeout: the watchdog's proof of life.
    pub async fn probe_reconciler(&self, limit: Duration) -> bool {
        let applying = self.status().sm.in_flight.as_ref().map(|f| f.since);
        if applying.is_some_and(|t| t.elapsed() < runner::APPLY_TIMEOUT) {
            return true;
        }
        let mut beats = self.shared.beats.subscribe();
        beats.mark_unchanged();
        self.shared.wake.notify_one();
        matches!(
            tokio::time::timeout(limit, beats.changed()).await,
            Ok(Ok(()))
        )
    }

    /// The metrics as OpenMetrics text, with the state gauges refreshed now. `sweeps`: heavy
    /// sweeps requested so far, on an OpenSM SM host.
    pub fn metrics_text(&self, sweeps: Option<u64>) -> String {
        let mut snapshot = metrics::Snapshot {
            sweeps,
            ..Default::default()
        };
        if let Ok(attachments) = self.store().attachments() {
            let now = self.now_unix_ns();
            snapshot.attachments = state_counts(&attachments).collect();
            snapshot.oldest_releasing_secs = attachments
                .iter()
                .filter(|a| a.state == AttachmentState::Releasing)
                .map(|a| (now - a.updated_unix_ns).max(0) as f64 / 1e9)
                .fold(0.0, f64::max);
        }
        if let Ok(bounds) = self.store().event_bounds() {
            snapshot.events = bounds;
        }
        {
            let status = self.status();
            if let Some(inv) = &status.inventory {
                snapshot.ports = inv
                    .ports
                    .iter()
                    .map(|p| {
                        (
                            p.device.clone(),
                            p.port_number,
                            i64::from(p.state.iba_number()),
                            p.entries().count() as i64,
                            p.pkeys.len() as i64,
                        )
                    })
                    .collect();
            }
            snapshot.conditions = status.conditions.iter().map(|c| c.kind).collect();
            snapshot.sm_reachable = status.sm.reachable;
            snapshot.sm_state = status.sm.state;
            snapshot.apply_in_flight_secs = status
                .sm
                .in_flight
                .as_ref()
                .map(|f| f.since.elapsed().as_secs_f64());
            snapshot.in_doubt = status.sm.in_doubt.len();
            snapshot.generation = status.sm.generation;
        }
        self.shared.metrics.encode(snapshot)
    }

    fn metrics(&self) -> &metrics::Metrics {
        &self.shared.metrics
    }

    /// One line for systemd's STATUS=.
    pub fn status_line(&self) -> String {
        match self.node() {
            Ok(n) => {
                let count = |s| n.counts.get(&s).copied().unwrap_or(0);
                let mut line = format!(
                    "{} active, {} pending, {} releasing, {} released; SM {} {}",
                    count(AttachmentState::Active),
                    count(AttachmentState::Pending)
                        + count(AttachmentState::Programming)
                        + count(AttachmentState::Drifted),
                    count(AttachmentState::Releasing),
                    count(AttachmentState::Released),
                    n.sm.backend,
                    match n.sm.state {
                        crate::domain::SmState::Reachable => "ok",
                        crate::domain::SmState::Refused => "refused",
                        crate::domain::SmState::Unreachable => "unreachable",
                        crate::domain::SmState::Unknown => "no apply yet",
                    },
                );
                if let Some(f) = &n.sm.in_flight {
                    line.push_str(&format!(
                        "; apply in flight {}s",
                        f.since.elapsed().as_secs()
                    ));
                }
                if !n.sm.in_doubt.is_empty() {
                    line.push_str(&format!("; {} key(s) in doubt", n.sm.in_doubt.len()));
                }
                for c in &n.conditions {
                    line.push_str(&format!("; CONDITION {}", c.kind));
                }
                line
            }
            Err(e) => format!("store error: {e}"),
        }
    }

    fn store(&self) -> &Store {
        &self.shared.parts.store
    }

    /// The apply ledger as last committed.
    /// Now, by the agent's clock.
    fn now_unix_ns(&self) -> i64 {
        self.shared.parts.clock.now_unix_ns()
    }

    fn ledger(&self) -> ApplyLedger {
        self.shared.ledger.lock().expect("ledger lock").clone()
    }

    /// Marks an apply in flight (the watchdog's probe counts it as life until the apply's own
    /// timeout; `node` and the waiting attachments show it) or done.
    fn set_in_flight(&self, in_flight: Option<ApplyInFlight>) {
        self.status().sm.in_flight = in_flight;
    }

    fn status(&self) -> std::sync::MutexGuard<'_, status::Status> {
        self.shared.status.lock().expect("status lock")
    }

    /// Commits a batch and publishes its events. Callers hold the write lock.
    fn commit(&self, batch: Batch) -> Result<Vec<Event>, AgentError> {
        let ledger = batch.ledger.clone();
        let durable = !batch.is_empty();
        let started = std::time::Instant::now();
        let events = self.store().commit(batch, self.now_unix_ns())?;
        if durable {
            self.metrics().commit(started.elapsed());
        }
        for e in &events {
            self.log_event(e);
        }
        if let Some(ledger) = ledger {
            *self.shared.ledger.lock().expect("ledger lock") = ledger;
        }
        for e in &events {
            // No receiver is fine: watchers replay from the log. Shared, not copied, by every
            // open stream.
            let _ = self.shared.events.send(Arc::new(e.clone()));
        }
        self.shared.changed.send_modify(|g| *g += 1);
        Ok(events)
    }

    /// One journal record per committed state change, with fields an operator selects on
    /// (`journalctl -u fabric-agent INSTANCE_ID=vm-42`, `PKEY=0x8a12` (the value ports hold, membership bit included), `STATE=RELEASED`).
    fn log_event(&self, e: &Event) {
        let node_id = self.shared.parts.node_id.as_str();
        match &e.kind {
            EventKind::AttachmentChanged {
                instance_id,
                partition_id,
                pkey_value,
                from,
                to,
                reason,
                ..
            } => tracing::info!(
                seq = e.seq,
                node_id,
                instance_id = instance_id.as_str(),
                partition_id = partition_id.as_str(),
                pkey = %pkey_value,
                from = from.map_or("", |s| s.name()),
                state = to.name(),
                reason = reason.as_str(),
                "attachment changed"
            ),
            EventKind::ConditionChanged {
                condition,
                active,
                detail,
            } => tracing::warn!(
                seq = e.seq,
                node_id,
                condition = condition.name(),
                active,
                detail = detail.as_str(),
                "condition changed"
            ),
            _ => {}
        }
    }

    async fn wait_for(
        &self,
        instance_id: &str,
        wait: Duration,
        done: impl Fn(AttachmentState) -> bool,
    ) -> Result<Attachment, AgentError> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        let mut changes = self.shared.changed.subscribe();
        let mut stopping = self.shared.stopping.subscribe();
        loop {
            changes.mark_unchanged();
            let a = self.get(instance_id)?;
            if done(a.state) {
                return Ok(a);
            }
            if *stopping.borrow_and_update() {
                return Err(stopping_error(&a));
            }
            tokio::select! {
                r = tokio::time::timeout_at(deadline, changes.changed()) => {
                    if r.is_err() {
                        return Ok(a);
                    }
                }
                _ = stopping.changed() => {}
            }
        }
    }
}

/// The answer to a waiting call when the agent begins to stop: UNAVAILABLE at once (a drain
/// must not wait out `--wait`), with the attachment's current state; the request itself is
/// stored and carries on when the agent is back.
fn stopping_error(a: &Attachment) -> AgentError {
    AgentError::Stopping {
        instance: a.instance_id.clone(),
        state: a.state,
        reason: a.reason.clone(),
    }
}

/// How many attachments are in each state, every state listed.
fn state_counts(attachments: &[Attachment]) -> impl Iterator<Item = (AttachmentState, u64)> + '_ {
    AttachmentState::ALL.iter().map(|s| {
        (
            *s,
            attachments.iter().filter(|a| a.state == *s).count() as u64,
        )
    })
}

fn changed_event(a: &Attachment, from: Option<AttachmentState>, reason: &str) -> EventKind {
    EventKind::AttachmentChanged {
        instance_id: a.instance_id.as_str().to_owned(),
        partition_id: a.partition.id.as_str().to_owned(),
        pkey_value: a.pkey_value(),
        from,
        to: a.state,
        reason: reason.to_owned(),
        evidence: None,
        ports: a.ports.clone(),
    }
}
