//! The reconciler loop's side of the start check (`agent::start_check` decides): asking the SM
//! hosts what they store for this node at start, raising a rollback it finds, and what may be
//! sent meanwhile (removals only) with the reason an attachment waits.

use super::super::start_check::{self, Verdict};
use super::Loop;
use crate::domain::ConditionKind;
use crate::domain::{Attachment, EventKind, Inventory, NodeMemberships, Restored};
use crate::store::Batch;
use tokio::time::Instant;

/// The start check in progress.
pub(super) struct StartCheck {
    pub(super) began: Instant,
    /// When to ask the hosts (again).
    pub(super) next_try: Instant,
    /// The last answers judged (None before the first).
    pub(super) verdict: Option<Verdict>,
    /// What this life wrote while the check ran, and the reservation it found.
    pub(super) life: start_check::ThisLife,
    /// Whether this check already raised the rollback it found (once per life: a round that
    /// asks again finds the same evidence).
    pub(super) raised: bool,
    /// Whether the unsent change after a lost life was looked for (once, at the first round
    /// of asking, before any add: [`Loop::withhold_unsent`]).
    pub(super) unsent_checked: bool,
}

impl StartCheck {
    /// Whether the bound passed with some host silent: the sets go out again, with the
    /// `START_CHECK_INCOMPLETE` condition naming the hosts.
    fn gave_up(&self, now: Instant) -> bool {
        now >= self.began + start_check::BOUND
    }

    /// The next instant the loop must wake for the check (to ask again, or at its bound); only
    /// instants still ahead: a check that could not run (its ports unread) waits for the next
    /// pass like everything else instead of spinning.
    pub(super) fn due_at(&self, now: Instant) -> Option<Instant> {
        [self.next_try, self.began + start_check::BOUND]
            .into_iter()
            .filter(|at| *at > now)
            .min()
    }

    /// `START_CHECK_INCOMPLETE`'s detail once the bound passed with a host still silent.
    pub(super) fn incomplete(&self) -> Option<String> {
        let silent = &self.verdict.as_ref()?.unanswered;
        self.gave_up(Instant::now())
            .then(|| start_check::incomplete_detail(silent))
    }
}

impl Loop {
    /// The start check, when it is due: asks the backend what each SM host stores for this
    /// node and judges it against the last acknowledged set and `desired`. On proof of a
    /// rollback: a new log epoch (no seq reused), `STORE_ROLLED_BACK`, the live attachments
    /// marked and settled from this pass's read (taken before any apply of this life), so their
    /// keys are withheld until a port read or the control plane confirms them. Always: the next
    /// generation goes above every host's, and after a lost life (or on proof of a rollback)
    /// `ApplyLedger::LOST_LIFE_MARGIN` above it. Returns whether the attachments changed (re-read
    /// into `attachments`).
    pub(super) async fn start_check(
        &mut self,
        attachments: &mut Vec<Attachment>,
        inventory: &Inventory,
        desired: &NodeMemberships,
    ) -> Result<bool, super::super::AgentError> {
        let Some(check) = &self.start else {
            return Ok(false);
        };
        let life = check.life.clone();
        if self.knows.ack().is_some() {
            // Every SM host holds this life's set: any evidence there is gone, and with it the
            // need to ask.
            self.start = None;
            return Ok(false);
        }
        let now = Instant::now();
        if now < check.next_try {
            return Ok(false);
        }
        let unsent_checked = check.unsent_checked;
        let sm = self.agent.shared.parts.sm.clone();
        let node = self.agent.shared.parts.node_id.clone();
        let asked = tokio::time::timeout(start_check::ASK_TIMEOUT, sm.stored_sets(&node)).await;
        let answers = match asked {
            Ok(Some(answers)) => answers,
            Ok(None) => {
                // The backend keeps no per-node sets: nothing to check against.
                self.start = None;
                return Ok(false);
            }
            Err(_) => Vec::new(),
        };
        // The fabric side keeps the node's sets (answering or not): before any add goes out.
        let mut changed = false;
        if !unsent_checked {
            changed = self
                .withhold_unsent(attachments, inventory, desired)
                .await?;
        }
        let mut verdict = start_check::judge(self.agent.ledger().acked, desired, &answers, &life);
        if answers.is_empty() {
            verdict.unanswered.push((
                "every SM host".to_owned(),
                format!("no answer within {}s", start_check::ASK_TIMEOUT.as_secs()),
            ));
        }
        if life.follows_lost_life || verdict.rolled_back.is_some() {
            self.knows.leap_past_lost_life(verdict.highest);
        } else {
            self.knows.move_past(verdict.highest);
        }
        let raised = self.start.as_ref().is_some_and(|c| c.raised);
        if let (Some(detail), false) = (&verdict.rolled_back, raised) {
            tracing::error!(%detail, "start check: the store went back in time");
            // Raised even when the condition already stands: a copy taken while an earlier
            // rollback was still reported holds attachments confirmed or attached since that
            // one, which this rollback may have released.
            if let Some(check) = &mut self.start {
                check.raised = true;
            }
            self.raise_rolled_back(detail.clone()).await?;
            self.settle_marked(attachments, inventory).await?;
            changed = true;
        }
        for (host, why) in &verdict.refused {
            tracing::warn!(%host, %why, "start check: the SM host refused to tell what it stores for this node (it refuses this node's sets by the same rule)");
        }
        let settled = verdict.unanswered.is_empty();
        if settled {
            tracing::info!(
                hosts = answers.len(),
                highest = verdict.highest,
                "start check: every SM host answered"
            );
            self.start = None;
        } else if let Some(check) = &mut self.start {
            tracing::warn!(silent = ?verdict.unanswered, "start check: not every SM host answered; sending only removals meanwhile");
            check.next_try = now
                + if check.gave_up(now) {
                    start_check::RETRY_AFTER_BOUND
                } else {
                    start_check::RETRY
                };
            check.verdict = Some(verdict);
        }
        Ok(changed)
    }

    /// With a backend whose SM hosts keep the node's sets (the start check runs), after a start
    /// that may follow a lost life, when the set the node would send now is not
    /// the one its store recorded sending (an attach or a release committed, the crash or the
    /// copy before the send was recorded): a lost life may have released an attachment the
    /// recorded set does not carry and told the control plane RELEASED without any write the
    /// SM hosts could show (its key was never sent), so the start check cannot see it. Each
    /// such attachment that wants its key is then settled by this pass's port read, as after a
    /// rollback: a key every covered port holds is confirmed, any other is withheld until the
    /// control plane sends its attach again (the resync every new epoch asks for). A plain
    /// crash in that window costs the attachments it caught one resync of the control plane;
    /// a key never sent consumed no grant. An attachment the recorded set carries is left
    /// alone: releasing it took a send of another set at or above the record's generation,
    /// which the start check sees.
    /// Returns whether the attachments changed (re-read into `attachments`).
    async fn withhold_unsent(
        &mut self,
        attachments: &mut Vec<Attachment>,
        inventory: &Inventory,
        desired: &NodeMemberships,
    ) -> Result<bool, super::super::AgentError> {
        let Some(check) = &mut self.start else {
            return Ok(false);
        };
        check.unsent_checked = true;
        let unsent = start_check::unsent(&check.life, desired, attachments, Some(inventory));
        if unsent.is_empty() {
            return Ok(false);
        }
        tracing::warn!(
            ?unsent,
            "this start follows an unclean stop that left a change unsent: the attachments the recorded set did not carry wait for the control plane unless the ports hold their keys"
        );
        {
            // Read under the lock: a command that settled one meanwhile wins.
            let _guard = self.agent.shared.write.lock().await;
            let mut upserts = awaiting_read(self.agent.store().live_attachments()?);
            // An attach of this life (the control plane's resync, or a new one) is newer than
            // any copy: it confirms the attachment.
            let attached = self
                .agent
                .shared
                .attached_this_life
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            upserts
                .retain(|a| unsent.contains(&a.instance_id) && !attached.contains(&a.instance_id));
            drop(attached);
            self.agent.commit(Batch {
                upserts,
                ..Default::default()
            })?;
        }
        self.settle_marked(attachments, inventory).await?;
        Ok(true)
    }

    /// After attachments were marked [`Restored::AwaitingRead`]: settles them from this pass's
    /// port read (taken before any apply of this life), re-reading `attachments` around it.
    async fn settle_marked(
        &self,
        attachments: &mut Vec<Attachment>,
        inventory: &Inventory,
    ) -> Result<(), super::super::AgentError> {
        *attachments = self.agent.store().live_attachments()?;
        self.check_restored(attachments, inventory).await?;
        *attachments = self.agent.store().live_attachments()?;
        Ok(())
    }

    /// What may be sent now: `desired`, or while the start check waits for an SM host (within
    /// its bound) only the keys every answering host already holds (None: no host answered yet,
    /// nothing may be sent).
    pub(super) fn sendable(&self, desired: &NodeMemberships) -> Option<NodeMemberships> {
        let Some(check) = &self.start else {
            return Some(desired.clone());
        };
        if check.gave_up(Instant::now()) {
            return Some(desired.clone());
        }
        let held = check.verdict.as_ref().map_or(&[][..], |v| &v.held[..]);
        start_check::removals_only(desired, held)
    }

    /// Why `a`'s key is not sent yet, while the start check holds every add back (None: it
    /// does not, or `a` adds no key).
    pub(super) fn held_back(&self, a: &Attachment) -> Option<String> {
        let check = self.start.as_ref()?;
        if !a.wants_key() || check.gave_up(Instant::now()) {
            return None;
        }
        let silent = check.verdict.as_ref().map_or_else(
            || "every SM host".to_owned(),
            |v| {
                let hosts: Vec<String> = v
                    .unanswered
                    .iter()
                    .map(|(h, why)| format!("{h} ({why})"))
                    .collect();
                hosts.join("; ")
            },
        );
        Some(format!(
            "no key is added until every SM host said what it stores for this node (the start check; at most {}s after the start): waiting for {silent}",
            start_check::BOUND.as_secs()
        ))
    }

    /// Raises `STORE_ROLLED_BACK` with `detail` in one commit that marks the live attachments
    /// that want their key restored and, unless this life's log was already restarted (at the
    /// store's open, or by an earlier raise), restarts the log: a new epoch whose seqs continue
    /// above the restored log's, so no seq a control plane saw is handed out again under any
    /// epoch. A second restart would drop the events this life committed since the first,
    /// which a watcher may not have read yet.
    pub(super) async fn raise_rolled_back(
        &mut self,
        detail: String,
    ) -> Result<(), super::super::AgentError> {
        let kind = ConditionKind::StoreRolledBack;
        {
            let _guard = self.agent.shared.write.lock().await;
            let restart_log = !self.log_restarted;
            let upserts = if restart_log {
                Vec::new()
            } else {
                awaiting_read(self.agent.store().live_attachments()?)
            };
            self.agent.commit(Batch {
                upserts,
                events: vec![EventKind::ConditionChanged {
                    condition: kind,
                    active: true,
                    detail: detail.clone(),
                }],
                restart_log,
                ..Default::default()
            })?;
        }
        self.log_restarted = true;
        self.conditions.raised(kind, detail);
        Ok(())
    }
}

/// `attachments` that want their key, marked [`Restored::AwaitingRead`]: the next port read
/// decides whether each is kept or withheld (`plan::restore_checks`).
fn awaiting_read(attachments: Vec<Attachment>) -> Vec<Attachment> {
    attachments
        .into_iter()
        .filter(|a| a.wants_key())
        .map(|a| Attachment {
            restored: Some(Restored::AwaitingRead),
            ..a
        })
        .collect()
}
