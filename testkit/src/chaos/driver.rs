//! The control-plane driver: attaches, releases, revokes and deletes like a cloud would, with a
//! seeded choice of what and when. Its rules are the control plane's:
//! - a node holds one instance at a time; a new one is attached only once the previous one is
//!   RELEASED (by the node's event stream);
//! - an instance stays in its partition for life; every attach carries a signed grant (recorded
//!   in the history before it is sent);
//! - an attach or release not yet confirmed is sent again (idempotent) every few seconds;
//! - a revoked instance is then released;
//! - a partition that had its share of instances takes no new ones and is deleted (its key
//!   retired at both SM hosts) only when the delete guard says yes: every instance it had is
//!   RELEASED on its node and `ListPartitionMembers` at *every* SM host lists no port in it (a
//!   host that does not answer makes the answer "no answer", never yes). Its key is never used
//!   again.

use super::history::{now_ms, record, Entry, Granted, SharedHistory};
use super::observe::{connect, AgentApi, Resyncs, StateView};
use crate::common::grants::{grant, GrantSigner};
use crate::common::requests::{attach, partition, release_request};
use fabric_agent::domain::Membership;
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// AttachmentState ACTIVE.
pub const ACTIVE: i32 = 3;
/// AttachmentState RELEASED.
pub const RELEASED: i32 = 6;
/// Instances a partition takes before it is closed for deletion.
const PER_PARTITION: usize = 3;
/// How long an unconfirmed attach or release waits before it is sent again.
const RESEND: Duration = Duration::from_secs(5);

/// What the driver wants of one node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Attached (wanted ACTIVE).
    Wanted,
    /// Being released (wanted RELEASED).
    Releasing,
}

/// A node's current instance.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The instance.
    pub instance: String,
    /// Its partition's key.
    pub pkey: u16,
    /// What is wanted of it.
    pub phase: Phase,
    /// When the last attach/release was sent.
    pub last_sent: Instant,
    /// When the phase began.
    pub since: Instant,
}

/// A partition the driver created.
#[derive(Debug, Clone)]
pub struct Partition {
    /// Its key.
    pub pkey: u16,
    /// (node index, instance) of every instance attached to it.
    pub members: Vec<(usize, String)>,
    /// No new instances (waiting for the guard).
    pub closing: bool,
    /// Deleted (the guard said yes).
    pub deleted: bool,
}

/// Operation counts.
#[derive(Debug, Default, Clone)]
pub struct Ops {
    /// Attaches of new instances.
    pub attaches: u64,
    /// Releases requested.
    pub releases: u64,
    /// Revocations acknowledged by an SM host.
    pub revokes: u64,
    /// Partitions deleted (guard yes, key retired).
    pub deletes: u64,
    /// Guard answers "no" (a blocker) and "no answer" (an SM host did not answer).
    pub guard_no: u64,
    /// See [`Ops::guard_no`].
    pub guard_unanswered: u64,
    /// Attaches and releases sent again.
    pub resends: u64,
    /// Replies that carried ACTIVE / RELEASED.
    pub acked: u64,
    /// Calls that failed (node or SM host down, cut or paused; a deadline).
    pub rpc_errors: u64,
    /// Retirements refused or not answered by an SM host.
    pub retire_errors: u64,
    /// The last retirement error (status), if any.
    pub last_retire_error: String,
    /// Releases a restored node answered NOT_FOUND (see [`Plan::forgotten`]).
    pub forgotten: u64,
}

/// The driver's plan, shared with the runner.
#[derive(Debug, Default)]
pub struct Plan {
    /// Per node: its current instance.
    pub slots: Vec<Option<Slot>>,
    /// Every partition.
    pub partitions: Vec<Partition>,
    /// Counts.
    pub ops: Ops,
    next_key: u16,
    next_instance: u64,
    /// Nodes whose state directory was put back from a copy (a state restore).
    pub restored: BTreeSet<usize>,
    /// Instances whose release a node answered NOT_FOUND after its state directory was put
    /// back: the copy predates their attach (an acknowledged attach the operator's rollback
    /// lost, as the API allows), so the node holds nothing of them. Done like a RELEASED: the
    /// convergence check still needs every port read without their key. A NOT_FOUND from a
    /// node never restored stays unanswered (an acknowledged attach lost: not converged).
    pub forgotten: BTreeSet<String>,
    /// Per instance, how many fresh grants it was given: after a restored node resynchronises,
    /// its wanted instance's attach goes out under a new grant id, since the restored node's
    /// first set (without the key its copy did not hold) consumed the old grant at the SM hosts
    /// exactly like a release, and a consumed grant is never accepted again.
    pub regrants: BTreeMap<String, u32>,
    /// Releases owed after a resync (instance -> (node, when last sent)): sent again every
    /// `RESEND` until the node's stream shows the instance RELEASED (or the node answers
    /// NOT_FOUND after a restore). A release sent once and lost (the node down again, or the
    /// connection closed at accept) would otherwise leave a restored instance withheld for good.
    pub owed: BTreeMap<String, (usize, Instant)>,
}

/// The driver's mode.
pub mod mode {
    /// Attach, release, revoke, delete.
    pub const RUN: u8 = 0;
    /// Nothing new: only what is wanted is sent again until confirmed.
    pub const SETTLE: u8 = 1;
    /// Stop.
    pub const STOP: u8 = 2;
}

/// The driver's fixed parts.
pub struct Driver {
    /// Node names and how their agents' APIs are reached.
    pub nodes: Vec<(String, AgentApi)>,
    /// The SM-host agents' Partitions listeners (direct, never cut: the control plane's own
    /// network), as an operator (`operator_clients`) over mTLS.
    pub sm_hosts: Vec<AgentApi>,
    /// The control plane's grant key.
    pub signer: Arc<GrantSigner>,
    /// The campaign's history.
    pub history: SharedHistory,
    /// The control plane's view of instance states.
    pub view: StateView,
    /// The plan.
    pub plan: Arc<Mutex<Plan>>,
    /// [`mode`].
    pub mode: Arc<AtomicU8>,
    /// The watchers' resync counts.
    pub resyncs: Resyncs,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Driver {
    /// The state the control plane last heard for `instance`.
    fn seen(&self, instance: &str) -> Option<i32> {
        lock(&self.view).get(instance).map(|(s, _)| *s)
    }

    /// Runs until [`mode::STOP`], drawing choices from `seed`.
    pub async fn run(self: Arc<Self>, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        {
            let mut plan = lock(&self.plan);
            plan.slots = vec![None; self.nodes.len()];
            plan.next_key = 0x1001;
        }
        let mut handled: BTreeMap<String, u64> = BTreeMap::new();
        loop {
            let m = self.mode.load(Ordering::SeqCst);
            if m == mode::STOP {
                return;
            }
            let counts = lock(&self.resyncs).clone();
            for (node, n) in counts {
                if handled.get(&node) != Some(&n) {
                    handled.insert(node.clone(), n);
                    self.after_resync(&node);
                }
            }
            self.resend_and_advance();
            if m == mode::RUN {
                let node = rng.random_range(0..self.nodes.len());
                let roll: f64 = rng.random();
                self.step(node, roll, &mut rng);
                if rng.random_bool(0.1) {
                    self.clone().try_delete().await;
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// After a resync of `node` (its store may have gone back): every instance released on it is
    /// released again, and its wanted instance attached again.
    fn after_resync(self: &Arc<Self>, node: &str) {
        let Some(n) = self.nodes.iter().position(|(name, _)| name == node) else {
            return;
        };
        let mut plan = lock(&self.plan);
        let wanted = plan.slots[n]
            .as_ref()
            .filter(|s| s.phase == Phase::Wanted)
            .map(|s| (s.instance.clone(), s.pkey));
        let released: Vec<String> = plan
            .partitions
            .iter()
            .flat_map(|p| p.members.iter())
            .filter(|(m, i)| *m == n && wanted.as_ref().is_none_or(|(w, _)| w != i))
            .map(|(_, i)| i.clone())
            .collect();
        plan.ops.resends += released.len() as u64 + u64::from(wanted.is_some());
        if let Some(s) = plan.slots[n].as_mut() {
            s.last_sent = Instant::now();
        }
        for i in released {
            plan.owed.insert(i.clone(), (n, Instant::now()));
            self.clone().send_release(n, i);
        }
        let regrant = wanted.is_some() && plan.restored.contains(&n);
        if let (true, Some((i, _))) = (regrant, &wanted) {
            *plan.regrants.entry(i.clone()).or_default() += 1;
        }
        drop(plan);
        if let Some((i, k)) = wanted {
            self.clone().send_attach(n, i, k, regrant);
        }
    }

    /// Sends again what is not confirmed; frees the slots whose release is confirmed.
    fn resend_and_advance(self: &Arc<Self>) {
        let mut plan = lock(&self.plan);
        let owed: Vec<(String, usize, Instant)> = plan
            .owed
            .iter()
            .map(|(i, (n, t))| (i.clone(), *n, *t))
            .collect();
        for (instance, node, sent) in owed {
            if self.seen(&instance) == Some(RELEASED) || plan.forgotten.contains(&instance) {
                plan.owed.remove(&instance);
            } else if sent.elapsed() > RESEND {
                plan.ops.resends += 1;
                plan.owed.insert(instance.clone(), (node, Instant::now()));
                self.clone().send_release(node, instance);
            }
        }
        for node in 0..plan.slots.len() {
            let Some(slot) = plan.slots[node].clone() else {
                continue;
            };
            let seen = self.seen(&slot.instance);
            match slot.phase {
                Phase::Releasing
                    if seen == Some(RELEASED) || plan.forgotten.contains(&slot.instance) =>
                {
                    plan.slots[node] = None
                }
                Phase::Wanted if seen != Some(ACTIVE) && slot.last_sent.elapsed() > RESEND => {
                    plan.ops.resends += 1;
                    if let Some(s) = plan.slots[node].as_mut() {
                        s.last_sent = Instant::now();
                    }
                    self.clone()
                        .send_attach(node, slot.instance, slot.pkey, false);
                }
                Phase::Releasing if slot.last_sent.elapsed() > RESEND => {
                    plan.ops.resends += 1;
                    if let Some(s) = plan.slots[node].as_mut() {
                        s.last_sent = Instant::now();
                    }
                    self.clone().send_release(node, slot.instance);
                }
                _ => {}
            }
        }
    }

    /// One choice for `node`.
    fn step(self: &Arc<Self>, node: usize, roll: f64, rng: &mut StdRng) {
        let mut plan = lock(&self.plan);
        match plan.slots[node].clone() {
            None if roll < 0.6 => {
                let open: Vec<usize> = (0..plan.partitions.len())
                    .filter(|p| !plan.partitions[*p].closing && !plan.partitions[*p].deleted)
                    .collect();
                let p = if open.len() < 2 || rng.random_bool(0.1) {
                    let pkey = plan.next_key;
                    plan.next_key += 1;
                    plan.partitions.push(Partition {
                        pkey,
                        members: Vec::new(),
                        closing: false,
                        deleted: false,
                    });
                    plan.partitions.len() - 1
                } else {
                    open[rng.random_range(0..open.len())]
                };
                plan.next_instance += 1;
                let instance = format!("i-{}", plan.next_instance);
                let pkey = plan.partitions[p].pkey;
                plan.partitions[p].members.push((node, instance.clone()));
                if plan.partitions[p].members.len() >= PER_PARTITION {
                    plan.partitions[p].closing = true;
                }
                plan.slots[node] = Some(Slot {
                    instance: instance.clone(),
                    pkey,
                    phase: Phase::Wanted,
                    last_sent: Instant::now(),
                    since: Instant::now(),
                });
                plan.ops.attaches += 1;
                self.clone().send_attach(node, instance, pkey, true);
            }
            Some(slot)
                if slot.phase == Phase::Wanted
                    && self.seen(&slot.instance) == Some(ACTIVE)
                    && slot.since.elapsed() > Duration::from_secs(2)
                    && roll < 0.35 =>
            {
                let revoke = rng.random_bool(0.15);
                let host = rng.random_range(0..self.sm_hosts.len());
                if let Some(s) = plan.slots[node].as_mut() {
                    s.phase = Phase::Releasing;
                    s.since = Instant::now();
                    s.last_sent = Instant::now();
                }
                plan.ops.releases += 1;
                let me = self.clone();
                tokio::spawn(async move {
                    if revoke {
                        me.revoke(node, &slot.instance, host).await;
                    }
                    me.release(node, slot.instance).await;
                });
            }
            _ => {}
        }
    }

    fn send_attach(self: Arc<Self>, node: usize, instance: String, pkey: u16, first: bool) {
        tokio::spawn(async move {
            let (name, api) = &self.nodes[node];
            let k = u32::from(pkey);
            let mut request = attach(
                &instance,
                partition(&format!("ibpart_{k:04x}"), k),
                Some(10_000),
            );
            let id = match lock(&self.plan).regrants.get(&instance) {
                Some(n) => format!("g-{instance}-r{n}"),
                None => format!("g-{instance}"),
            };
            let g = grant(&id, "fab1", name, &instance, k, Membership::Full);
            if first {
                record(
                    &self.history,
                    Entry::Grant(Granted {
                        node: name.clone(),
                        instance: instance.clone(),
                        pkey,
                        at: g.issued_at_unix_ms,
                    }),
                );
            }
            request.grant = Some(self.signer.sign(&g));
            let reply = async {
                let mut c = connect(api).await?;
                c.attach_partition(request).await.ok()
            };
            match tokio::time::timeout(Duration::from_secs(20), reply).await {
                Ok(Some(r)) => self.acked(name, &instance, r.into_inner().attachment),
                _ => lock(&self.plan).ops.rpc_errors += 1,
            }
        });
    }

    fn send_release(self: Arc<Self>, node: usize, instance: String) {
        tokio::spawn(async move { self.release(node, instance).await });
    }

    async fn release(&self, node: usize, instance: String) {
        let (name, api) = &self.nodes[node];
        let reply = async {
            let Some(mut c) = connect(api).await else {
                return Err(tonic::Status::unavailable("not connected"));
            };
            c.release_instance(release_request(&instance, Some(10_000)))
                .await
        };
        match tokio::time::timeout(Duration::from_secs(20), reply).await {
            Ok(Ok(r)) => self.acked(name, &instance, r.into_inner().attachment),
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                let mut plan = lock(&self.plan);
                if plan.restored.contains(&node) {
                    plan.ops.forgotten += 1;
                    plan.forgotten.insert(instance);
                } else {
                    plan.ops.rpc_errors += 1;
                }
            }
            _ => lock(&self.plan).ops.rpc_errors += 1,
        }
    }

    fn acked(&self, node: &str, instance: &str, a: Option<pb::Attachment>) {
        let Some(a) = a else { return };
        if a.state == ACTIVE || a.state == RELEASED {
            lock(&self.plan).ops.acked += 1;
            record(
                &self.history,
                Entry::Ack {
                    node: node.to_owned(),
                    instance: instance.to_owned(),
                    state: a.state,
                    at: now_ms(),
                },
            );
        }
    }

    async fn sm(&self, host: usize) -> Option<PartitionsClient<tonic::transport::Channel>> {
        Some(PartitionsClient::new(self.sm_hosts[host].channel().await?))
    }

    async fn revoke(&self, node: usize, instance: &str, host: usize) {
        let call = async {
            let mut c = self.sm(host).await?;
            c.revoke_instance(smpb::RevokeInstanceRequest {
                node_id: self.nodes[node].0.clone(),
                instance_id: instance.to_owned(),
            })
            .await
            .ok()
        };
        match tokio::time::timeout(Duration::from_secs(20), call).await {
            Ok(Some(_)) => {
                lock(&self.plan).ops.revokes += 1;
                record(
                    &self.history,
                    Entry::Revoke {
                        node: self.nodes[node].0.clone(),
                        instance: instance.to_owned(),
                        at: now_ms(),
                    },
                );
            }
            _ => lock(&self.plan).ops.rpc_errors += 1,
        }
    }

    /// The fabric's view the guard reads: every member of `pkey` that any SM host lists, as
    /// (SM host index, node id, port GUID); `Err` when an SM host does not answer.
    pub async fn members(&self, pkey: u16) -> Result<Vec<(usize, String, String)>, String> {
        let mut out = Vec::new();
        for host in 0..self.sm_hosts.len() {
            let call = async {
                let mut c = self.sm(host).await?;
                c.list_partition_members(smpb::ListPartitionMembersRequest {
                    pkey: u32::from(pkey),
                })
                .await
                .ok()
            };
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Some(r)) => out.extend(
                    r.into_inner()
                        .members
                        .into_iter()
                        .map(|m| (host, m.node_id, m.port_guid)),
                ),
                _ => return Err(format!("SM host {host} did not answer")),
            }
        }
        Ok(out)
    }

    /// The delete guard for a closing partition whose instances are all RELEASED, then the
    /// deletion (key retired at every SM host) when it says yes.
    async fn try_delete(self: Arc<Self>) {
        let candidate = {
            let plan = lock(&self.plan);
            plan.partitions
                .iter()
                .find(|p| {
                    p.closing
                        && !p.deleted
                        && p.members
                            .iter()
                            .all(|(_, i)| self.seen(i) == Some(RELEASED))
                        && !plan.slots.iter().flatten().any(|s| s.pkey == p.pkey)
                })
                .map(|p| p.pkey)
        };
        let Some(pkey) = candidate else { return };
        let holders = match self.members(pkey).await {
            Ok(h) => h,
            Err(_) => {
                lock(&self.plan).ops.guard_unanswered += 1;
                return;
            }
        };
        if !holders.is_empty() {
            lock(&self.plan).ops.guard_no += 1;
            return;
        }
        let at = now_ms();
        record(&self.history, Entry::DeleteYes { pkey, at });
        {
            let mut plan = lock(&self.plan);
            plan.ops.deletes += 1;
            if let Some(p) = plan.partitions.iter_mut().find(|p| p.pkey == pkey) {
                p.deleted = true;
            }
        }
        for host in 0..self.sm_hosts.len() {
            let call = async {
                let Some(mut c) = self.sm(host).await else {
                    return Err("SM host not reachable".to_owned());
                };
                c.retire_partition_key(smpb::RetirePartitionKeyRequest {
                    pkey: u32::from(pkey),
                    retired_at_unix_ms: at,
                    partition_id: format!("ibpart_{pkey:04x}"),
                })
                .await
                .map(|_| ())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
            };
            let outcome = tokio::time::timeout(Duration::from_secs(20), call)
                .await
                .unwrap_or_else(|_| Err("deadline".to_owned()));
            if let Err(e) = outcome {
                let mut plan = lock(&self.plan);
                plan.ops.retire_errors += 1;
                plan.ops.last_retire_error = format!("host {host}: {e}");
            }
        }
    }

    /// Whether everything the driver wants is confirmed by the nodes' streams: each slot's
    /// instance ACTIVE (Wanted) and every other instance it ever attached RELEASED. Returns
    /// (node, instance, key) of the wanted ones; `Err` names the first instance that is not.
    pub fn settled(&self) -> Result<Vec<(String, String, u16)>, String> {
        let plan = lock(&self.plan);
        let mut wanted = Vec::new();
        let in_slots: BTreeMap<&str, &Slot> = plan
            .slots
            .iter()
            .flatten()
            .map(|s| (s.instance.as_str(), s))
            .collect();
        for p in &plan.partitions {
            for (node, instance) in &p.members {
                let want = match in_slots.get(instance.as_str()) {
                    Some(s) if s.phase == Phase::Wanted => ACTIVE,
                    _ => RELEASED,
                };
                if want == RELEASED && plan.forgotten.contains(instance) {
                    continue;
                }
                let seen = self.seen(instance);
                if seen != Some(want) {
                    return Err(format!(
                        "{instance} on {} in {:#06x}: wanted state {want}, last reported {seen:?}",
                        self.nodes[*node].0, p.pkey
                    ));
                }
                if want == ACTIVE {
                    wanted.push((self.nodes[*node].0.clone(), instance.clone(), p.pkey));
                }
            }
        }
        Ok(wanted)
    }
}
