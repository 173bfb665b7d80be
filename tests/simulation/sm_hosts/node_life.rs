//! A node agent's restarts, and its start check, in the simulation of several SM hosts.
//!
//! **Drawn** (`world`, from a stream of its own so a seed's other steps are the ones it has
//! without them): a snapshot of the node's store (`Durable`: what the real store keeps durably,
//! nothing it keeps only in memory), and a restart: clean (the store kept), after a crash (the
//! store kept, the start follows a lost life), or a restore of the last snapshot of the running
//! node (a reverted VM: the store's mirror goes back with it, so the store cannot see it; always
//! an unclean start). A new life resumes as `agent::runner::run` starts one:
//! `SmKnowledge::resume` on the ledger, `leap_past_lost_life` of the reservation after an
//! unclean stop, the remote backend's remembered host names forgotten, an apply forced, and the
//! start check's `ThisLife` (nothing sent, the reservation, whether the life follows a lost one,
//! the ledger's `sending`) as the runner builds it.
//!
//! **Real code**: `start_check::judge`, `removals_only`, `unsent`, `ThisLife` and
//! `BOUND`/`RETRY`/`RETRY_AFTER_BOUND`; the SM hosts' `GetNodeMemberships` (the real
//! `Partitions` service) read by the remote backend's `stored_set_answer`; `SmKnowledge` (`resume`,
//! `leap_past_lost_life`, `move_past`, `ledger_for_attach`).
//!
//! **Models** (runner and store rules that are not public, kept small):
//! - `ask`: a cut link is `NoAnswer` (the real reply otherwise).
//! - `start_check`: `runner::start::start_check` (an apply acknowledged in this life ends the
//!   check; at its first round `withhold_unsent`: the attachments the real `unsent` names are
//!   settled by the read; the leap or move past the highest generation; on a rollback verdict the raise and
//!   the marks, once per life, whether or not `STORE_ROLLED_BACK` stands; settled when every
//!   host answered; asked again every `RETRY`, after the bound every `RETRY_AFTER_BOUND`);
//!   `sendable` (`runner::start::sendable`).
//! - `raise_rolled_back`: the store's `mark_restored` (every live attachment that wants its key
//!   marked `AwaitingRead`) and the standing condition (durable; cleared by the first pass after
//!   an acknowledgement in a life, as `agent::conditions` does).
//! - `check_restored`: `plan::restore_checks` for the simulation's one port (confirmed when the
//!   port holds the key with the attachment's membership, else `Unconfirmed` and PENDING).
//! - `ControlPlane`: the control plane's resync (docs/INTEGRATION.md, "Follow"): after an
//!   unclean start or a rollback it sends again, a few steps later, the attach of every instance
//!   it still wants (confirming a withheld one, creating one the store lost) and the release of
//!   every instance it terminated.
//!
//! **Time**: one step of the simulation stands for one `RETRY` (2 s): a node whose check is not
//! settled runs one pass a step (asks, then sends what it may), and the bound is
//! `BOUND / RETRY` steps.

use super::hosts::{host_name, Host};
use super::node::{pkey, Node};
use fabric_agent::agent::start_check::{self, ThisLife, Verdict};
use fabric_agent::agent::SmKnowledge;
use fabric_agent::api::sm_v1::client::stored_set_answer;
use fabric_agent::domain::{
    ApplyLedger, Attachment, AttachmentState, Membership, NodeMemberships, Restored,
};
use fabric_agent::sm::{HostStoredSet, StoredSetAnswer};
use std::collections::BTreeMap;

/// Steps per `RETRY`, and the bound and the retry after it in steps.
const RETRY_STEPS: usize = 1;
const BOUND_STEPS: usize = (start_check::BOUND.as_secs() / start_check::RETRY.as_secs()) as usize;
const AFTER_BOUND_STEPS: usize =
    (start_check::RETRY_AFTER_BOUND.as_secs() / start_check::RETRY.as_secs()) as usize;

/// What the node's store keeps durably: a snapshot copies it, a restore puts it back.
#[derive(Clone)]
pub struct Durable {
    pub attachments: Vec<Attachment>,
    pub ledger: ApplyLedger,
    /// `STORE_ROLLED_BACK` as last committed (the log's standing conditions).
    pub rolled_back_stands: bool,
}

/// The start check while it is not settled (`runner::start::StartCheck`).
pub struct Check {
    began: usize,
    next_try: usize,
    verdict: Option<Verdict>,
    pub life: ThisLife,
    /// This check raised the rollback it found (once per life).
    raised: bool,
    /// The unsent change after a lost life was looked for (`withhold_unsent`).
    unsent_checked: bool,
}

/// How a node agent restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// A clean stop: the store kept, the same log epoch.
    Clean,
    /// A crash: the store kept, the start follows a lost life.
    Crash,
    /// The last snapshot of the running node put back (always an unclean start).
    Restore,
}

/// What the control plane was told and wants, per node (not on the node: a restore does not
/// take it back).
#[derive(Default)]
pub struct ControlPlane {
    /// Instances attached and not released (instance -> key).
    pub wanted: BTreeMap<String, u32>,
    /// Instances it released.
    pub terminated: BTreeMap<String, u32>,
    /// A resync is owed (an unclean start or `STORE_ROLLED_BACK` seen).
    pub resync_due: bool,
}

/// The node's life: the start check, what the runner keeps in memory, and the durable extras.
#[derive(Default)]
pub struct Life {
    pub check: Option<Check>,
    /// The runner's `force_apply`: the desired set is confirmed once after every start.
    pub force_apply: bool,
    pub rolled_back_stands: bool,
    pub snapshot: Option<(Durable, usize)>,
    pub cp: ControlPlane,
    /// The step of the node's last pass (one a step).
    pub last_pass: usize,
    /// The mutation: a restart starts no check (the restored set is sent at once).
    pub skip_check: bool,
    pub restarts: usize,
    pub restores: usize,
    pub rollbacks: usize,
    /// Rollbacks raised while `STORE_ROLLED_BACK` already stood (from a restored store).
    pub rollbacks_while_standing: usize,
    pub withheld: usize,
}

impl Life {
    /// Whether the start check is due to ask again (the runner wakes for it).
    pub fn check_due(&self, step: usize) -> bool {
        self.check.as_ref().is_some_and(|c| step >= c.next_try)
    }
}

fn key_of(a: &Attachment) -> u32 {
    u32::from(u16::from(a.partition.pkey))
}

impl Node {
    /// Copies the store as it is now.
    pub fn snapshot(&mut self, step: usize) {
        self.life.snapshot = Some((self.durable(), step));
    }

    fn durable(&self) -> Durable {
        Durable {
            attachments: self.attachments.clone(),
            ledger: self.ledger.clone(),
            rolled_back_stands: self.life.rolled_back_stands,
        }
    }

    /// Stops the agent and starts a new life as `runner::run` does; returns the trace line.
    pub fn restart(&mut self, kind: Restart, step: usize) -> String {
        let mut what = format!("{kind:?}").to_lowercase();
        let follows_lost_life = match kind {
            Restart::Clean => false,
            Restart::Crash => true,
            Restart::Restore => {
                let (d, at) = self.life.snapshot.clone().expect("a snapshot");
                self.attachments = d.attachments;
                self.ledger = d.ledger;
                self.life.rolled_back_stands = d.rolled_back_stands;
                // The restored ACTIVE claims were made in another history.
                self.active_since.clear();
                self.life.restores += 1;
                what = format!("restore of the snapshot of step {at}");
                true
            }
        };
        self.life.restarts += 1;
        self.knows = SmKnowledge::resume(&self.ledger);
        let reserved_at_start = self.ledger.generation_reserved;
        if follows_lost_life {
            self.knows.leap_past_lost_life(reserved_at_start);
            self.life.cp.resync_due = true;
        }
        self.remembered.clear();
        self.life.force_apply = true;
        self.life.check = (!self.life.skip_check).then(|| Check {
            began: step,
            next_try: step,
            verdict: None,
            raised: false,
            unsent_checked: false,
            life: ThisLife {
                reserved_at_start,
                follows_lost_life,
                sending_at_start: self.ledger.sending.clone(),
                ..ThisLife::default()
            },
        });
        let keys: Vec<String> = self
            .attachments
            .iter()
            .map(|a| format!("{:#06x} {:?}", key_of(a), a.state))
            .collect();
        format!(
            "{} restarts ({what}): store holds [{}], reserved {reserved_at_start}",
            self.id.as_str(),
            keys.join(", ")
        )
    }

    /// What each endpoint stores for this node (the remote backend's reading of each reply).
    async fn ask(&self, hosts: &[Host]) -> Vec<HostStoredSet> {
        let mut out = Vec::with_capacity(self.endpoints.len());
        for h in &self.endpoints {
            let answer = if self.cut.contains(h) {
                StoredSetAnswer::NoAnswer("node cut from the SM host".into())
            } else {
                stored_set_answer(hosts[*h].stored(self.id.as_str()).await, &self.id)
            };
            out.push(HostStoredSet {
                host: host_name(*h),
                answer,
            });
        }
        out
    }

    /// The start check, when it is due (model of `runner::start::start_check`, judged by the
    /// real `judge`). Returns whether the attachments changed, and the trace lines.
    pub async fn start_check(
        &mut self,
        hosts: &[Host],
        held: &BTreeMap<u32, bool>,
        step: usize,
        desired: &NodeMemberships,
    ) -> (bool, Vec<String>) {
        let mut lines = Vec::new();
        let Some(check) = &self.life.check else {
            return (false, lines);
        };
        if self.knows.ack().is_some() {
            self.life.check = None;
            return (false, lines);
        }
        let mut changed = false;
        if !check.unsent_checked {
            changed = self.withhold_unsent(held, desired, &mut lines);
        }
        let Some(check) = &self.life.check else {
            return (changed, lines);
        };
        if step < check.next_try {
            return (changed, lines);
        }
        let life = check.life.clone();
        let raised = check.raised;
        let answers = self.ask(hosts).await;
        let verdict = start_check::judge(self.ledger.acked, desired, &answers, &life);
        if life.follows_lost_life || verdict.rolled_back.is_some() {
            self.knows.leap_past_lost_life(verdict.highest);
        } else {
            self.knows.move_past(verdict.highest);
        }
        if let (Some(detail), false) = (&verdict.rolled_back, raised) {
            // Raised once per life, even when the condition already stands (a copy taken while
            // an earlier rollback was still reported).
            if self.life.rolled_back_stands {
                self.life.rollbacks_while_standing += 1;
            }
            lines.push(format!("{} STORE_ROLLED_BACK: {detail}", self.id.as_str()));
            if let Some(check) = &mut self.life.check {
                check.raised = true;
            }
            self.raise_rolled_back();
            lines.extend(self.check_restored(held));
            changed = true;
        }
        let name = self.id.as_str().to_owned();
        if verdict.unanswered.is_empty() {
            lines.push(format!(
                "{name} start check settled (highest {})",
                verdict.highest
            ));
            self.life.check = None;
        } else if let Some(check) = &mut self.life.check {
            let gave_up = step >= check.began + BOUND_STEPS;
            check.next_try = step
                + if gave_up {
                    AFTER_BOUND_STEPS
                } else {
                    RETRY_STEPS
                };
            let silent: Vec<&str> = verdict.unanswered.iter().map(|(h, _)| h.as_str()).collect();
            lines.push(format!(
                "{name} start check waits for {silent:?}{}",
                if gave_up { " (bound passed)" } else { "" }
            ));
            check.verdict = Some(verdict);
        }
        (changed, lines)
    }

    /// After a start that may follow a lost life, when the set the node would send is not the
    /// one its store recorded sending: the attachments the real `start_check::unsent` names
    /// are settled by this read, as after a rollback (model of `runner::start::withhold_unsent`
    /// around it). Returns whether the attachments changed.
    fn withhold_unsent(
        &mut self,
        held: &BTreeMap<u32, bool>,
        desired: &NodeMemberships,
        lines: &mut Vec<String>,
    ) -> bool {
        let inventory = self.inventory(held);
        let Some(check) = &mut self.life.check else {
            return false;
        };
        check.unsent_checked = true;
        let unsent = start_check::unsent(&check.life, desired, &self.attachments, Some(&inventory));
        if unsent.is_empty() {
            return false;
        }
        lines.push(format!(
            "{} follows an unclean stop that left a change unsent: {unsent:?} settled by the port read",
            self.id.as_str()
        ));
        for a in &mut self.attachments {
            if unsent.contains(&a.instance_id) {
                a.restored = Some(Restored::AwaitingRead);
            }
        }
        lines.extend(self.check_restored(held));
        true
    }

    /// What may be sent now (model of `runner::start::sendable`, with the real
    /// `removals_only`).
    pub fn sendable(&self, desired: &NodeMemberships, step: usize) -> Option<NodeMemberships> {
        let Some(check) = &self.life.check else {
            return Some(desired.clone());
        };
        if step >= check.began + BOUND_STEPS {
            return Some(desired.clone());
        }
        let held = check.verdict.as_ref().map_or(&[][..], |v| &v.held[..]);
        start_check::removals_only(desired, held)
    }

    /// `STORE_ROLLED_BACK` raised: the store's `mark_restored` (model) and the standing
    /// condition; the control plane resyncs on it.
    pub fn raise_rolled_back(&mut self) {
        self.life.rolled_back_stands = true;
        self.life.rollbacks += 1;
        self.life.cp.resync_due = true;
        self.mark_awaiting_read();
    }

    /// Every live attachment that wants its key marked `AwaitingRead` (the store's
    /// `mark_restored`, the runner's `awaiting_read`).
    fn mark_awaiting_read(&mut self) {
        for a in &mut self.attachments {
            if a.wants_key() {
                a.restored = Some(Restored::AwaitingRead);
            }
        }
    }

    /// Settles the attachments a rollback marked from the port read `held` (model of
    /// `plan::restore_checks` on the one port, and of `runner::check_restored`).
    pub fn check_restored(&mut self, held: &BTreeMap<u32, bool>) -> Vec<String> {
        let mut lines = Vec::new();
        for a in &mut self.attachments {
            if a.restored != Some(Restored::AwaitingRead) {
                continue;
            }
            let key = key_of(a);
            let full = a.membership == Membership::Full;
            if held.get(&key) == Some(&full) {
                a.restored = None;
            } else {
                a.restored = Some(Restored::Unconfirmed);
                a.state = AttachmentState::Pending;
                a.reason =
                    "restored, unconfirmed: withheld until the control plane's attach".into();
                self.life.withheld += 1;
                lines.push(format!(
                    "{} {key:#06x} of {} withheld (restored, the port lacks it)",
                    self.id.as_str(),
                    a.instance_id.as_str()
                ));
            }
        }
        lines
    }

    /// The control plane's resync: the attach of every instance it wants, the release of every
    /// one it terminated. Returns the trace line.
    pub fn resync(&mut self) -> String {
        self.life.cp.resync_due = false;
        let mut did = Vec::new();
        for (id, key) in self.life.cp.wanted.clone() {
            match self
                .attachments
                .iter_mut()
                .find(|a| a.instance_id.as_str() == id)
            {
                Some(a) if a.restored.is_some() => {
                    a.restored = None;
                    a.reason.clear();
                    did.push(format!("confirms {id}"));
                }
                Some(_) => continue,
                None => {
                    self.create(&id, key);
                    did.push(format!("attaches {id} ({key:#06x}) again"));
                }
            }
            // The key is covered in the ledger with the attach (`Agent::attach`).
            if let Some(l) = SmKnowledge::ledger_for_attach(&self.ledger, pkey(key)) {
                self.ledger = l;
            }
        }
        let terminated: Vec<String> = self.life.cp.terminated.keys().cloned().collect();
        for id in terminated {
            if self.begin_release(&id) {
                did.push(format!("releases {id} again"));
            }
        }
        format!(
            "control plane resyncs {}: {}",
            self.id.as_str(),
            if did.is_empty() {
                "nothing to send".to_owned()
            } else {
                did.join(", ")
            }
        )
    }
}
