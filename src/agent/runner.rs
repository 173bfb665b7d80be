//! The reconciler loop: apply the desired set through the subnet manager (with capped, jittered
//! backoff while it is unreachable), read the ports, commit what `plan` decides, report port
//! changes, then sleep until something happens. Idle costs nothing: it waits on a wake-up, the
//! observer's change signal, a retry or resync deadline, or shutdown.

use super::plan::{self, Observed};
use super::{changed_event, now_unix_ns, ports, Agent};
use crate::domain::{
    Attachment, AttachmentState, EventKind, Guid, Inventory, NodeMemberships, PKeyValue,
};
use crate::sm::SmError;
use crate::store::Batch;
use rand::Rng;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Longest a single apply may take before it counts as unavailable.
pub(super) const APPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// The loop goes round at least this often even when nothing happens.
const HEARTBEAT: Duration = Duration::from_secs(60);

struct Loop {
    agent: Agent,
    accepted: Option<NodeMemberships>,
    force_apply: bool,
    retry_at: Option<Instant>,
    backoff: Duration,
    resync_at: Instant,
    sm_error: Option<String>,
    prev_inventory: Option<Inventory>,
    foreign_reported: BTreeSet<(Guid, PKeyValue)>,
}

pub(super) async fn run(agent: Agent, mut shutdown: watch::Receiver<bool>) {
    let cfg = agent.shared.parts.reconciler.clone();
    let prev_inventory = agent.status().inventory.clone();
    let mut l = Loop {
        agent,
        accepted: None,
        // Confirm the desired set with the SM once after every start.
        force_apply: true,
        retry_at: None,
        backoff: Duration::from_millis(cfg.backoff_initial_ms),
        resync_at: Instant::now() + Duration::from_secs(cfg.resync_secs),
        sm_error: None,
        prev_inventory,
        foreign_reported: BTreeSet::new(),
    };
    loop {
        let again = match l.pass().await {
            Ok(again) => again,
            Err(e) => {
                tracing::error!(error = %e, "reconciler pass failed");
                false
            }
        };
        l.beat();
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
        let deadline = [retry, Some(l.resync_at), Some(Instant::now() + HEARTBEAT)]
            .into_iter()
            .flatten()
            .min()
            .expect("at least the heartbeat");
        let observer = l.agent.shared.parts.observer.clone();
        tokio::select! {
            _ = l.agent.shared.wake.notified() => {}
            _ = observer.changed(pending) => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => break,
        }
        if Instant::now() >= l.resync_at {
            l.resync_at = Instant::now() + Duration::from_secs(cfg.resync_secs);
            l.force_apply = true;
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
        self.agent
            .store()
            .attachments()
            .map(|all| {
                all.iter().any(|a| {
                    matches!(
                        a.state,
                        AttachmentState::Pending
                            | AttachmentState::Programming
                            | AttachmentState::Drifted
                            | AttachmentState::Releasing
                    )
                })
            })
            .unwrap_or(true)
    }

    /// One pass. Returns true when another pass should follow at once.
    async fn pass(&mut self) -> Result<bool, super::AgentError> {
        let inventory = self.read_ports().await;
        let attachments = self.agent.store().attachments()?;
        let guids: Vec<Guid> = inventory
            .as_ref()
            .map(|i| i.fabric_ports().map(|p| p.port_guid).collect())
            .unwrap_or_default();
        let desired = plan::desired(&self.agent.shared.parts.node_id, guids, &attachments);
        let mut again = false;
        let needed = self.force_apply || self.accepted.as_ref() != Some(&desired);
        if !needed {
            // Nothing left to retry (the failed change was withdrawn).
            self.retry_at = None;
        }
        let due = self.retry_at.is_none_or(|t| Instant::now() >= t);
        if needed && due && inventory.is_some() {
            again = self.apply(desired).await?;
        }
        let transitions = plan::plan(
            &attachments,
            Observed {
                accepted: self.accepted.as_ref(),
                inventory: inventory.as_ref(),
            },
        );
        if transitions.iter().any(|t| t.to == AttachmentState::Drifted) {
            self.force_apply = true;
            again = true;
        }
        let mut batch = Batch::default();
        if let Some(inv) = &inventory {
            batch
                .events
                .extend(ports::changes(self.prev_inventory.as_ref(), inv));
            self.foreign(inv, &attachments, &mut batch.events);
        }
        self.commit(&attachments, transitions, batch).await?;
        self.prev_inventory = inventory;
        Ok(again)
    }

    async fn read_ports(&mut self) -> Option<Inventory> {
        let parts = &self.agent.shared.parts;
        match parts.observer.inventory().await {
            Ok(mut inv) => {
                parts.selector.apply(&mut inv);
                self.agent.status().inventory = Some(inv.clone());
                Some(inv)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading ports failed; no state changes this pass");
                None
            }
        }
    }

    /// Applies the desired set; returns true when the ports should be read again at once.
    async fn apply(&mut self, desired: NodeMemberships) -> Result<bool, super::AgentError> {
        let sm = self.agent.shared.parts.sm.clone();
        let result = match tokio::time::timeout(APPLY_TIMEOUT, sm.apply(&desired, 0)).await {
            Ok(r) => r,
            Err(_) => Err(SmError::Unavailable(format!(
                "apply timed out after {APPLY_TIMEOUT:?}"
            ))),
        };
        let cfg = &self.agent.shared.parts.reconciler;
        let was = self.sm_error.clone();
        let outcome = match result {
            Ok(outcome) => {
                tracing::debug!(keys = desired.keys.len(), detail = %outcome.detail, "applied");
                self.accepted = Some(desired);
                self.force_apply = false;
                self.retry_at = None;
                self.backoff = Duration::from_millis(cfg.backoff_initial_ms);
                self.sm_error = None;
                true
            }
            Err(e) => {
                // Permanent refusals are retried too (an operator may fix them), just slowly.
                let delay = if e.is_transient() {
                    self.backoff
                } else {
                    Duration::from_millis(cfg.backoff_max_ms)
                };
                let jitter = rand::rng().random_range(0.8..1.2);
                self.retry_at = Some(Instant::now() + delay.mul_f64(jitter));
                self.backoff = (self.backoff * 2).min(Duration::from_millis(cfg.backoff_max_ms));
                tracing::warn!(error = %e, retry_in = ?delay, "apply failed");
                self.sm_error = Some(e.to_string());
                false
            }
        };
        {
            let mut status = self.agent.status();
            status.sm.applies += 1;
            status.sm.reachable = self.sm_error.is_none();
            status.sm.last_error = self.sm_error.clone().unwrap_or_default();
            if outcome {
                status.sm.last_apply_unix_ns = now_unix_ns();
            }
        }
        if was.is_some() != self.sm_error.is_some() {
            let _guard = self.agent.shared.write.lock().await;
            self.agent.commit(Batch {
                events: vec![EventKind::SubnetManagerChanged {
                    backend: self.agent.shared.parts.sm.backend().to_owned(),
                    reachable: self.sm_error.is_none(),
                    error: self.sm_error.clone().unwrap_or_default(),
                }],
                ..Default::default()
            })?;
        }
        Ok(outcome)
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
    /// command that changed an attachment meanwhile wins) plus reason updates and port events.
    async fn commit(
        &self,
        snapshot: &[Attachment],
        transitions: Vec<plan::Transition>,
        mut batch: Batch,
    ) -> Result<(), super::AgentError> {
        let _guard = self.agent.shared.write.lock().await;
        let now = now_unix_ns();
        let mut touched: Vec<Attachment> = Vec::new();
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
            current.state = t.to;
            current.updated_unix_ns = now;
            current.reason.clear();
            batch
                .events
                .push(changed_event(current, Some(t.from), &t.reason));
        }
        // Show a subnet-manager error on every attachment still waiting for it.
        let reason = self.sm_error.clone().unwrap_or_default();
        for a in snapshot.iter().filter(|a| is_waiting(a.state)) {
            if touched.iter().any(|t| t.instance_id == a.instance_id) || a.reason == reason {
                continue;
            }
            if let Some(mut current) = self.agent.store().attachment(a.instance_id.as_str())? {
                if current.state == a.state && current.reason != reason {
                    current.reason = reason.clone();
                    touched.push(current);
                }
            }
        }
        batch.upserts = touched;
        self.agent.commit(batch)?;
        Ok(())
    }

    async fn prune_released(&self) {
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

fn is_waiting(s: AttachmentState) -> bool {
    matches!(
        s,
        AttachmentState::Pending
            | AttachmentState::Programming
            | AttachmentState::Drifted
            | AttachmentState::Releasing
    )
}
