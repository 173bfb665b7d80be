//! The oracle: reads the agent's durable event log as it grows and judges it against the model's
//! truth at that instant.
//!
//! 1. Never RELEASED while a model fabric port holds the key's base, while the model SM's config
//!    for the node contains it, or while a request carrying it may still be taken; and once a
//!    key was reported RELEASED and no attachment asked for it since, it never reaches the SM's
//!    config or a port again.
//! 2. Never ACTIVE unless every fabric port held the exact entry in the read the agent used.
//! 3. Every acknowledged command is durable (an attach that returned Ok is stored; a release
//!    that returned Ok is RELEASING or RELEASED), across crashes.
//! 4. Events are gap-free from seq 1; an attachment's changes chain (`from` is the previous
//!    `to`), RELEASED is final, and the stored state is the last reported one.
//! 5. The node's generations strictly increase over its life, across crashes (checked by the
//!    model SM).
//! 6. Liveness (checked by the driver with [`Oracle::unconverged`]): with faults healed,
//!    attached instances go ACTIVE and released ones RELEASED (a released instance whose key
//!    another instance on the node still wants stays RELEASING).
//! 7. Admission: an attachment is never admitted on a port that a live (not RELEASED)
//!    attachment of another partition covers.
//! 8. No model port ever holds the keys of two partitions unless both are granted to it at once
//!    (live attachments covering it).
//!
//! 9. Pruning: only a RELEASED attachment ever leaves the store, and only once its RELEASED
//!    event is `released_retain` old in simulated time (a probe looks just before each one's
//!    retain is over); an instance id attached again after that is a new attachment. Events the
//!    log's retention pruned before the oracle read them are the oracle's own hole, reported as
//!    such.
//!
//! Checks 1, 2 and 6 are read per covered port: an attachment is judged on the ports its events
//! list.

use super::core::constants::{PORTS, PORT_GUID_BASE};
use super::core::fabric::Fabric;
use super::core::wall::{Wall, SIM_EPOCH_UNIX_NS};
use fabric_agent::domain::{Attachment, AttachmentState, Event, EventKind, Inventory, PKeyValue};
use fabric_agent::store::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

mod restore;

#[derive(Debug, Clone)]
struct Known {
    value: u16,
    state: AttachmentState,
    /// The covered ports' GUIDs.
    ports: Vec<u64>,
    /// When its RELEASED event was committed (agent clock, Unix ns).
    released_ns: Option<i64>,
}

/// The agent's retention of RELEASED attachments and its clock, as the oracle judges pruning:
/// on the node's wall clock, steps included (retention is housekeeping on the agent's wall
/// clock, which production reads at every call).
#[derive(Debug, Clone)]
struct Pruning {
    retain_ns: i64,
    /// The agent's clock.
    wall: Wall,
}

impl Pruning {
    fn now_ns(&self) -> i64 {
        self.wall.now_ns()
    }

    /// Wall-clock ms since the epoch of an agent-clock reading (the simulated time when the
    /// clock was never stepped).
    fn sim_ms(&self, unix_ns: i64) -> i64 {
        (unix_ns - SIM_EPOCH_UNIX_NS) / 1_000_000
    }

    /// Why an attachment RELEASED at `released_ns` may not be gone at `at_ns` (None: it may).
    fn too_early(&self, released_ns: i64, at_ns: i64) -> Option<String> {
        let age = at_ns.saturating_sub(released_ns);
        (age < self.retain_ns).then(|| {
            format!(
                "RELEASED at t={} ms, only {} ms before t={} ms (released_retain {} ms)",
                self.sim_ms(released_ns),
                age / 1_000_000,
                self.sim_ms(at_ns),
                self.retain_ns / 1_000_000
            )
        })
    }
}

fn overlap(a: &[u64], b: &[u64]) -> bool {
    a.iter().any(|g| b.contains(g))
}

/// The checker's state.
pub struct Oracle {
    store: Arc<Store>,
    /// The log's epoch as last seen: a new one (the store went back in time, shown by the
    /// fabric side's newer generation) restarts the log above every seq handed out.
    epoch: fabric_agent::store::LogEpoch,
    /// After such a restart: instances whose next event may start from any state (the events
    /// between their last seen one and the restart went with the old log; a control plane
    /// resynchronises with ListAttachments). Only a restart of the log (its seqs jump) does
    /// this: a new epoch at an unclean stop keeps the log, and every chain goes on.
    rebased: Option<BTreeSet<String>>,
    /// The store was just reopened from a database file put back, which its open saw: the log
    /// restarted above every seq the mirror saw, and the attachments were read again from the
    /// store, so the next event may jump and no chain is rebased.
    reopened_above: bool,
    last_seq: u64,
    instances: BTreeMap<String, Known>,
    /// Bases reported RELEASED that nobody asked for since -> who reported it, on which ports.
    guard: BTreeMap<u16, (String, Vec<u64>)>,
    last_read: Option<(u64, Inventory)>,
    /// Instances whose attach returned Ok.
    pub acked_attach: BTreeSet<String>,
    /// Instances whose release returned Ok.
    pub acked_release: BTreeSet<String>,
    /// The first violation found.
    pub finding: Option<String>,
    /// How pruning is judged (None: nothing may ever leave the store).
    pruning: Option<Pruning>,
    /// Every event read from the log, by seq: what a WatchEvents stream must deliver.
    logged: BTreeMap<u64, Event>,
    /// Every event read from the log, by the (epoch, seq) it was handed out under: none may be
    /// handed out again with another event (a whole state directory put back continues the
    /// log below seqs the lost writes handed out, which only a new epoch makes new).
    handed: BTreeMap<(String, u64), Event>,
    /// RELEASED attachments not yet probed: (when their retain is over, Unix ns; instance).
    prune_due: BTreeSet<(i64, String)>,
    /// Signalled when a RELEASED attachment joins `prune_due`.
    pub released_seen: Arc<tokio::sync::Notify>,
    /// RELEASED attachments seen pruned.
    pub pruned: u64,
    /// Events WatchEvents streams delivered (each checked).
    pub streamed: u64,
    /// Streams that ended or were refused with OUT_OF_RANGE (their consumer resynchronised).
    pub out_of_range: u64,
    /// RELEASED events seen.
    pub released: u64,
    /// ACTIVE events seen.
    pub active: u64,
    /// State changes seen since the world last took them for its trace.
    pub notes: Vec<String>,
}

impl Oracle {
    /// A checker of `store`'s log.
    pub fn new(store: Arc<Store>) -> Oracle {
        Oracle {
            epoch: store.epoch(),
            store,
            rebased: None,
            reopened_above: false,
            last_seq: 0,
            instances: BTreeMap::new(),
            guard: BTreeMap::new(),
            last_read: None,
            acked_attach: BTreeSet::new(),
            acked_release: BTreeSet::new(),
            finding: None,
            pruning: None,
            logged: BTreeMap::new(),
            handed: BTreeMap::new(),
            prune_due: BTreeSet::new(),
            released_seen: Arc::new(tokio::sync::Notify::new()),
            pruned: 0,
            streamed: 0,
            out_of_range: 0,
            released: 0,
            active: 0,
            notes: Vec::new(),
        }
    }

    /// Records the first violation. `now_ms` is when the oracle saw it: the first change of
    /// the world after the event (the truth it is judged against is the same as at the event).
    fn fail(&mut self, now_ms: u64, what: String) {
        if self.finding.is_none() {
            self.finding = Some(format!("seen at t={now_ms} ms: {what}"));
        }
    }

    /// Judges pruning against the agent's `released_retain` and its clock `wall`.
    pub fn judge_pruning(&mut self, released_retain: Duration, wall: Wall) {
        self.pruning = Some(Pruning {
            retain_ns: i64::try_from(released_retain.as_nanos()).unwrap_or(i64::MAX),
            wall,
        });
    }

    /// Why an attachment RELEASED at `released_ns` may not be gone at `at_ns`.
    fn too_early(&self, released_ns: Option<i64>, at_ns: i64) -> Option<String> {
        match (&self.pruning, released_ns) {
            (Some(p), Some(r)) => p.too_early(r, at_ns),
            (None, _) => Some("nothing is pruned in this run".into()),
            (_, None) => Some("it was never reported RELEASED".into()),
        }
    }

    fn now_ns(&self) -> i64 {
        self.pruning.as_ref().map_or(0, |p| p.now_ns())
    }

    /// Forgets a pruned attachment (its id may be attached again, as a new attachment).
    fn forget_pruned(&mut self, id: &str) {
        self.instances.remove(id);
        self.prune_due.retain(|(_, i)| i != id);
        self.acked_attach.remove(id);
        self.acked_release.remove(id);
        self.pruned += 1;
    }

    /// Check 9 on the store as it is: every instance the log reported is still stored, unless
    /// it was RELEASED at least `released_retain` ago.
    fn check_vanished(&mut self, stored: &[Attachment], now_ms: u64) {
        let now_ns = self.now_ns();
        let ids: BTreeSet<&str> = stored.iter().map(|a| a.instance_id.as_str()).collect();
        let gone: Vec<String> = self
            .instances
            .keys()
            .filter(|id| !ids.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            let k = &self.instances[&id];
            if let Some(why) = self.too_early(k.released_ns, now_ns) {
                let what = format!("{id} ({:?}) left the store: {why}", k.state);
                return self.fail(now_ms, what);
            }
            self.notes.push(format!("{id} pruned from the store"));
            self.forget_pruned(&id);
        }
    }

    /// When the last RELEASED attachment the oracle knows of is due to be pruned (its retain
    /// over), if that is within `horizon` of now: the instant the driver waits for before
    /// [`Oracle::check_pruned`]. None when nothing is due within it.
    pub fn last_prune_due(&self, horizon: Duration) -> Option<Instant> {
        let p = self.pruning.as_ref()?;
        let limit = p.now_ns().saturating_add(horizon.as_nanos() as i64);
        let due = self
            .instances
            .values()
            .filter(|k| k.state == AttachmentState::Released)
            .filter_map(|k| k.released_ns.map(|r| r.saturating_add(p.retain_ns)))
            .filter(|due| *due <= limit)
            .max()?;
        Some(p.wall.instant_of(due))
    }

    /// Liveness of check 9: every RELEASED attachment whose retain was over more than `slack`
    /// ago is gone from the store (the agent prunes on its own clock, not only at start).
    pub fn check_pruned(&mut self, slack: Duration, now_ms: u64) {
        let Some(p) = self.pruning.clone() else {
            return;
        };
        let now_ns = p.now_ns();
        let slack_ns = slack.as_nanos() as i64;
        let stored = match self.store.attachments() {
            Ok(a) => a,
            Err(e) => return self.fail(now_ms, format!("reading attachments failed: {e}")),
        };
        let overdue = stored.iter().find(|a| {
            a.state == AttachmentState::Released
                && a.updated_unix_ns
                    .saturating_add(p.retain_ns)
                    .saturating_add(slack_ns)
                    < now_ns
        });
        if let Some(a) = overdue {
            let what = format!(
                "liveness: {} RELEASED at t={} ms is still stored at t={} ms, more than {} ms \
                 after its released_retain ({} ms) was over",
                a.instance_id,
                p.sim_ms(a.updated_unix_ns),
                p.sim_ms(now_ns),
                slack.as_millis(),
                p.retain_ns / 1_000_000
            );
            self.fail(now_ms, what);
        }
    }

    /// When the prune probe next looks (1 ms before the oldest unprobed RELEASED attachment's
    /// retain is over), None when there is none.
    pub fn next_prune_probe(&self) -> Option<Instant> {
        let p = self.pruning.as_ref()?;
        let (due, _) = self.prune_due.first()?;
        Some(p.wall.instant_of(due - 1_000_000))
    }

    /// The prune probe: every RELEASED attachment whose retain is over within 1 ms is still
    /// stored, unchanged (its retain is not over yet, so nothing may have pruned it).
    pub fn probe_prunes(&mut self, now_ms: u64) {
        let Some(p) = self.pruning.clone() else {
            return;
        };
        let now_ns = p.now_ns();
        while let Some((due, id)) = self.prune_due.first().cloned() {
            if due - 1_000_000 > now_ns || self.finding.is_some() {
                return;
            }
            self.prune_due.pop_first();
            let released_ns = self.instances.get(&id).and_then(|k| k.released_ns);
            let stored = match self.store.attachment(&id) {
                Ok(a) => a,
                Err(e) => return self.fail(now_ms, format!("reading {id} failed: {e}")),
            };
            let held = stored.as_ref().is_some_and(|a| {
                a.state == AttachmentState::Released && Some(a.updated_unix_ns) == released_ns
            });
            // A forward step of the agent's clock may have carried the retain past its end
            // before the probe woke: then it may be gone (`check_vanished` forgets it).
            let why = released_ns.map(|r| p.too_early(r, now_ns));
            if !held && why.as_ref().is_none_or(Option::is_some) {
                let what = format!(
                    "{id}'s RELEASED attachment is gone from the store (now {:?}) before its \
                     retain is over: {}",
                    stored.map(|a| a.state),
                    why.flatten().unwrap_or_default()
                );
                return self.fail(now_ms, what);
            }
        }
    }

    /// Checks an event a WatchEvents stream (`who`) delivered: the log held exactly this event
    /// under its seq.
    pub fn check_streamed(&mut self, who: &str, e: &Event, now_ms: u64) {
        let what = match self.logged.get(&e.seq) {
            Some(logged) if logged == e => {
                self.streamed += 1;
                return;
            }
            Some(logged) => format!(
                "{who} was streamed event {} as {e:?} but the log held {logged:?}",
                e.seq
            ),
            None => format!(
                "{who} was streamed event {} ({e:?}) which the oracle never read from the log",
                e.seq
            ),
        };
        self.fail(now_ms, what);
    }

    /// Records the inventory a read returned (it showed the truth at `started_ms`).
    pub fn record_read(&mut self, inventory: Inventory, started_ms: u64) {
        self.last_read = Some((started_ms, inventory));
    }

    /// Reads the new events and checks 1, 2 and 4 against the truth now (the truth has not
    /// changed since they were committed: every change of the world calls this first).
    pub fn sync(&mut self, fabric: &Fabric, now_ms: u64) {
        if self.finding.is_some() {
            return;
        }
        let events = match self.store.events_after(self.last_seq, usize::MAX) {
            Ok(e) => e,
            Err(e) => return self.fail(now_ms, format!("reading the event log failed: {e}")),
        };
        let mut restarted = false;
        if self.store.epoch() != self.epoch {
            self.epoch = self.store.epoch();
            restarted = true;
            self.notes.push(format!(
                "the log restarted under a new epoch {}",
                self.epoch
            ));
        }
        for e in events {
            // Gap-free, except at a restart of the log, which must leave every seq handed out
            // before behind (no seq reused under any epoch).
            let new_epoch = std::mem::take(&mut restarted);
            let reopened = std::mem::take(&mut self.reopened_above);
            let jump = (new_epoch || reopened) && e.seq > self.last_seq + 1;
            if jump && new_epoch {
                self.rebased = Some(self.instances.keys().cloned().collect());
            }
            if e.seq != self.last_seq + 1 && !jump {
                let first = self.store.event_bounds().map_or(0, |b| b.0);
                let what = if e.seq == first && self.last_seq < first {
                    format!(
                        "the oracle's own hole: events {}..={} were pruned by the log's event \
                         retention before the oracle read them",
                        self.last_seq + 1,
                        first - 1
                    )
                } else {
                    format!("event log gap: after seq {} came {}", self.last_seq, e.seq)
                };
                return self.fail(now_ms, what);
            }
            self.last_seq = e.seq;
            self.logged.insert(e.seq, e.clone());
            let epoch = self.epoch.to_string();
            match self.handed.get(&(epoch.clone(), e.seq)) {
                Some(before) if *before != e => {
                    let what = format!(
                        "(epoch {epoch}, seq {}) handed out twice: first {before:?}, now {e:?}",
                        e.seq
                    );
                    return self.fail(now_ms, what);
                }
                Some(_) => {}
                None => {
                    self.handed.insert((epoch, e.seq), e.clone());
                }
            }
            let time_ns = e.time_unix_ns;
            let EventKind::AttachmentChanged {
                instance_id,
                pkey_value,
                from,
                to,
                reason,
                ports,
                ..
            } = e.kind
            else {
                continue;
            };
            let covered: Vec<u64> = if ports.is_empty() {
                (0..PORTS).map(|i| PORT_GUID_BASE + i as u64).collect()
            } else {
                ports.iter().map(|p| p.port_guid.0).collect()
            };
            self.notes.push(format!(
                "agent event {}: {instance_id} {} -> {to:?} ({reason})",
                e.seq,
                from.map_or("new".to_owned(), |f| format!("{f:?}"))
            ));
            let mut prev = self.instances.get(&instance_id).map(|k| k.state);
            if from.is_none() && prev == Some(AttachmentState::Released) {
                // A new attachment under a RELEASED one's id: the store no longer had the old
                // one, which it may have pruned only once its retain was over.
                let released_ns = self.instances.get(&instance_id).and_then(|k| k.released_ns);
                if let Some(why) = self.too_early(released_ns, time_ns) {
                    return self.fail(
                        now_ms,
                        format!(
                            "event {}: {instance_id} was created again, so its RELEASED \
                             attachment was gone: {why}",
                            e.seq
                        ),
                    );
                }
                self.forget_pruned(&instance_id);
                self.notes.push(format!(
                    "{instance_id} attached again after its RELEASED attachment was pruned"
                ));
                prev = None;
            }
            let rebased = self.rebased.as_mut().is_some_and(|r| {
                r.remove(instance_id.as_str()) || !self.instances.contains_key(&instance_id)
            });
            if from != prev && !rebased {
                return self.fail(
                    now_ms,
                    format!(
                        "event {} of {instance_id} goes {from:?} -> {to:?} but its last state was {prev:?}",
                        e.seq
                    ),
                );
            }
            if prev == Some(AttachmentState::Released) {
                return self.fail(
                    now_ms,
                    format!("event {}: {instance_id} left RELEASED for {to:?}", e.seq),
                );
            }
            let base = pkey_value.base();
            if from.is_none() {
                // A new attachment asks for the key again.
                self.guard.remove(&base);
                // Check 7: no live attachment of another partition on these ports.
                let clash = self.instances.iter().find(|(_, k)| {
                    k.value & 0x7FFF != base
                        && k.state != AttachmentState::Released
                        && overlap(&k.ports, &covered)
                });
                if let Some((other, k)) = clash {
                    return self.fail(
                        now_ms,
                        format!(
                            "{instance_id} ({pkey_value}) was admitted on ports {covered:x?} that \
                             {other} ({:#06x}, {:?}) still covers",
                            k.value, k.state
                        ),
                    );
                }
            }
            self.instances.insert(
                instance_id.clone(),
                Known {
                    value: pkey_value.0,
                    state: to,
                    ports: covered.clone(),
                    released_ns: (to == AttachmentState::Released).then_some(time_ns),
                },
            );
            if let (AttachmentState::Released, Some(p)) = (to, &self.pruning) {
                let due = time_ns.saturating_add(p.retain_ns);
                self.prune_due.insert((due, instance_id.clone()));
                self.released_seen.notify_one();
            }
            match to {
                AttachmentState::Active => {
                    self.active += 1;
                    if let Some(why) = self.not_active_proof(pkey_value, &covered) {
                        return self.fail(
                            now_ms,
                            format!(
                                "{instance_id} reported ACTIVE ({pkey_value}, event {}: {reason:?}) but {why}",
                                e.seq
                            ),
                        );
                    }
                }
                AttachmentState::Released => {
                    self.released += 1;
                    let others_want = self.instances.iter().any(|(id, k)| {
                        *id != instance_id
                            && k.value & 0x7FFF == base
                            && k.state.wants_key()
                            && overlap(&k.ports, &covered)
                    });
                    if others_want {
                        continue;
                    }
                    if let Some(why) = fabric.holds_or_may_program(base, &covered) {
                        return self.fail(
                            now_ms,
                            format!(
                                "{instance_id} reported RELEASED ({pkey_value}, event {}: {reason:?}) while {why}",
                                e.seq
                            ),
                        );
                    }
                    // Ports another instance of the key still wants are not guarded.
                    let guarded: Vec<u64> = covered
                        .iter()
                        .copied()
                        .filter(|g| {
                            !self.instances.iter().any(|(id, k)| {
                                *id != instance_id
                                    && k.value & 0x7FFF == base
                                    && k.state.wants_key()
                                    && k.ports.contains(g)
                            })
                        })
                        .collect();
                    let entry = self
                        .guard
                        .entry(base)
                        .or_insert_with(|| (String::new(), Vec::new()));
                    entry.0 = format!("{instance_id}, event {}", e.seq);
                    entry.1.extend(guarded);
                    entry.1.sort_unstable();
                    entry.1.dedup();
                }
                _ => {}
            }
        }
        let mut broken = None;
        for (base, (who, ports)) in &self.guard {
            if let Some(why) = fabric.holds_or_may_program(*base, ports) {
                broken = Some(format!(
                    "{base:#06x} was reported RELEASED ({who}) and no attachment asked for it since, yet {why}"
                ));
                break;
            }
        }
        if let Some(b) = broken {
            return self.fail(now_ms, b);
        }
        if let Some(b) = self.two_partitions_on_a_port(fabric) {
            self.fail(now_ms, b);
        }
    }

    /// Check 8: a port holding two partitions' keys, not both granted to it now.
    fn two_partitions_on_a_port(&self, fabric: &Fabric) -> Option<String> {
        for (i, p) in fabric.ports.iter().enumerate() {
            let bases: BTreeSet<u16> = p
                .table
                .iter()
                .map(|e| e & 0x7FFF)
                .filter(|b| *b != 0 && *b != 0x7FFF && p.up)
                .collect();
            if bases.len() < 2 {
                continue;
            }
            let granted = |b: u16| {
                self.instances.values().any(|k| {
                    k.value & 0x7FFF == b
                        && k.state != AttachmentState::Released
                        && k.ports.contains(&p.guid)
                })
            };
            if !bases.iter().all(|b| granted(*b)) {
                return Some(format!(
                    "model port {i} holds the keys of partitions {bases:04x?} at once, not all \
                     granted to it (table {:04x?})",
                    p.table
                ));
            }
        }
        None
    }

    /// Why the last read does not prove ACTIVE for `value` on the ports `covered` (None: it
    /// does).
    fn not_active_proof(&self, value: PKeyValue, covered: &[u64]) -> Option<String> {
        let Some((started, inv)) = &self.last_read else {
            return Some("no port read was returned before".into());
        };
        if covered.is_empty() {
            return Some("the attachment covers no port".into());
        }
        for g in covered {
            let Some(p) = inv.ports.iter().find(|p| p.port_guid.0 == *g) else {
                return Some(format!(
                    "the read it used (started at t={started} ms) did not show covered port {g:#x}"
                ));
            };
            if !(p.state.is_up() && p.holds(value)) {
                return Some(format!(
                    "in the read it used (started at t={started} ms) port {} was {:?} with table {:04x?}",
                    p.device,
                    p.state,
                    p.pkeys.iter().map(|k| k.0).collect::<Vec<_>>()
                ));
            }
        }
        None
    }

    /// Check 3, the store/log agreement of 4 and check 9 (called between steps).
    pub fn check_durable(&mut self, now_ms: u64) {
        if self.finding.is_some() {
            return;
        }
        let stored = match self.store.attachments() {
            Ok(a) => a,
            Err(e) => return self.fail(now_ms, format!("reading attachments failed: {e}")),
        };
        self.check_vanished(&stored, now_ms);
        if self.finding.is_some() {
            return;
        }
        let by_id: BTreeMap<&str, AttachmentState> = stored
            .iter()
            .map(|a| (a.instance_id.as_str(), a.state))
            .collect();
        for id in &self.acked_attach {
            if !by_id.contains_key(id.as_str()) {
                let what = format!("attach of {id} was acknowledged but it is not in the store");
                return self.fail(now_ms, what);
            }
        }
        for id in &self.acked_release {
            if !by_id
                .get(id.as_str())
                .is_some_and(|s| s.is_released_or_releasing())
            {
                let what = format!(
                    "release of {id} was acknowledged but the store has it {:?}",
                    by_id.get(id.as_str())
                );
                return self.fail(now_ms, what);
            }
        }
        for (id, state) in &by_id {
            let logged = self.instances.get(*id).map(|k| k.state);
            if logged != Some(*state) {
                let what = format!("{id} is stored {state:?} but its last event says {logged:?}");
                return self.fail(now_ms, what);
            }
        }
    }

    /// Hands over the store the oracle reads (the node's store is reopened after a rollback)
    /// and returns the old one.
    pub fn swap_store(&mut self, store: Arc<Store>) -> Arc<Store> {
        std::mem::replace(&mut self.store, store)
    }

    /// What has not converged yet (None: every attachment is ACTIVE or RELEASED as asked).
    pub fn unconverged(&self) -> Option<String> {
        let stored = match self.store.attachments() {
            Ok(a) => a,
            Err(e) => return Some(format!("reading attachments failed: {e}")),
        };
        // A released instance whose key another instance on the node still wants on one of
        // its ports stays RELEASING until that one is released too: its key cannot leave the
        // shared port before.
        let guids = |a: &fabric_agent::domain::Attachment| -> Vec<u64> {
            a.ports.iter().map(|p| p.port_guid.0).collect()
        };
        let lagging: Vec<String> = stored
            .iter()
            .filter(|a| {
                if a.state.wants_key() {
                    a.state != AttachmentState::Active
                } else if a.state == AttachmentState::Releasing {
                    !stored.iter().any(|b| {
                        b.state.wants_key()
                            && b.partition.pkey == a.partition.pkey
                            && overlap(&guids(a), &guids(b))
                    })
                } else {
                    a.state != AttachmentState::Released
                }
            })
            .map(|a| {
                format!(
                    "{} ({} {}) is {:?} (reason {:?})",
                    a.instance_id, a.partition.pkey, a.membership, a.state, a.reason
                )
            })
            .collect();
        (!lagging.is_empty()).then(|| lagging.join("; "))
    }
}
