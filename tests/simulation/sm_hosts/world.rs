//! The simulated fabric: SM hosts, nodes, the links between them, the model OpenSM master and
//! the ports it programs, and one step of a seeded schedule. The nodes' snapshots and restarts
//! (`node_life`) come from a stream of their own (`World::life_rng`), drawn after the step's
//! own draw, so a seed's other steps are the ones it has without them.

use super::hosts::{host_name, Host, Net, SharedNet};
use super::node::{Node, Outcome};
use super::node_life::Restart;
use super::oracle;
use fabric_agent::domain::PKey;
use fabric_agent::sm::opensm::members::members_of;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

pub const HOSTS: usize = 3;
pub const NODES: usize = 3;
pub const KEYS: [u32; 4] = [0x0a01, 0x0a02, 0x0a03, 0x0a04];

/// What a run drew and saw, for the report.
#[derive(Default, Debug, Clone)]
pub struct Stats {
    pub steps: usize,
    pub released: usize,
    pub active: usize,
    pub fences: usize,
    pub restores: usize,
    pub restarts_beside_opensm: usize,
    pub failovers: usize,
    pub host_set_incomplete: usize,
    pub node_restarts: usize,
    pub node_restores: usize,
    pub node_rollbacks: usize,
    /// Rollbacks raised while `STORE_ROLLED_BACK` already stood (from a restored store).
    pub rollbacks_while_standing: usize,
    pub withheld: usize,
}

/// Which rule a run switches off (to show the oracle fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    None,
    /// A node counts an apply complete although its endpoints miss a known SM host.
    StaleEndpointsCount,
    /// Fencing's physical evidence always says the peer's SM is silent.
    EvidenceLies,
    /// A node agent's start runs no start check: the restored set is sent at once.
    SkipStartCheck,
}

pub struct World {
    pub _dir: tempfile::TempDir,
    pub hosts: Vec<Host>,
    pub nodes: Vec<Node>,
    pub net: SharedNet,
    /// Keys on each node's port (key -> full), as the master last programmed them.
    pub ports: Vec<BTreeMap<u32, bool>>,
    pub master: Option<usize>,
    pub step: usize,
    pub log: Vec<String>,
    pub stats: Stats,
    /// Whether an OpenSM may start on a host that a peer holds fenced (see `sm_hosts` docs:
    /// the code does not prevent it today, and the oracle then fails).
    pub rejoin_while_fenced: bool,
    /// The nodes' snapshots and restarts, when drawn (None: none), and how many times the
    /// usual rate.
    pub life_rng: Option<(StdRng, u32)>,
}

impl World {
    /// A fabric of every host up; when `stale` names (node, host), that node's `endpoints`
    /// miss that host.
    pub async fn new(stale: Option<(usize, usize)>, mutation: Mutation) -> World {
        // On tmpfs when there is one: every commit fsyncs the partitions file.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let hosts = (0..HOSTS).map(|i| Host::new(i, dir.path())).collect();
        let nodes = (0..NODES)
            .map(|i| {
                let endpoints = (0..HOSTS).filter(|h| stale != Some((i, *h))).collect();
                let mut n = Node::new(i, endpoints);
                n.ignore_host_set = mutation == Mutation::StaleEndpointsCount;
                n.life.skip_check = mutation == Mutation::SkipStartCheck;
                n
            })
            .collect();
        let net = Arc::new(Mutex::new(Net {
            syncs: vec![None; HOSTS],
            opensm: vec![false; HOSTS],
            evidence_lies: mutation == Mutation::EvidenceLies,
            ..Net::default()
        }));
        let mut w = World {
            _dir: dir,
            hosts,
            nodes,
            net,
            ports: vec![BTreeMap::new(); NODES],
            master: None,
            step: 0,
            log: Vec::new(),
            stats: Stats::default(),
            rejoin_while_fenced: false,
            life_rng: None,
        };
        if let Some((n, h)) = stale {
            w.log.push(format!("node{n}'s endpoints miss smhost{h}"));
        }
        // A fabric brought up: every agent, then their pulls (until each has answered every
        // peer caught up, so nobody holds a peer fenced for having started later), then the
        // OpenSMs.
        for h in 0..HOSTS {
            w.hosts[h].start_agent(HOSTS, &w.net, 0).await;
        }
        for _ in 0..2 {
            for h in 0..HOSTS {
                w.round(h).await;
            }
        }
        w.stats.fences = 0;
        for h in 0..HOSTS {
            assert!(!w.fenced_on_some_disk(h), "smhost{h} fenced at bring-up");
            w.set_opensm(h, true);
        }
        w.sweep();
        w
    }

    fn opensm(&self, h: usize) -> bool {
        self.net.lock().unwrap().opensm[h]
    }

    fn set_opensm(&self, h: usize, runs: bool) {
        self.net.lock().unwrap().opensm[h] = runs;
    }

    /// Brings up what is down on host `h`, in the order systemd does: the agent (its catch-up
    /// first), then its OpenSM. An OpenSM restarted alone beside a running agent starts after
    /// that agent's periodic pull has run (it pulls every sync interval).
    async fn start_host(&mut self, h: usize) -> String {
        let mut what = Vec::new();
        if self.hosts[h].agent.is_none() {
            let beside = self.opensm(h);
            self.hosts[h].start_agent(HOSTS, &self.net, self.step).await;
            if beside {
                self.stats.restarts_beside_opensm += 1;
            }
            what.push(if beside {
                "agent starts beside its running OpenSM"
            } else {
                "agent starts"
            });
        } else if !self.opensm(h) {
            self.round(h).await;
            what.push("agent pulls its peers");
        }
        if !self.opensm(h) {
            if !self.rejoin_while_fenced && self.fenced_on_some_disk(h) {
                what.push("OpenSM kept stopped: a peer holds the host fenced");
            } else {
                self.set_opensm(h, true);
                what.push("OpenSM starts");
            }
        }
        format!("smhost{h}: {}", what.join(", then "))
    }

    async fn round(&mut self, h: usize) {
        if let Some(a) = &self.hosts[h].agent {
            let before = a.sync.fences().fenced().len();
            a.sync.round().await;
            self.stats.fences += a.sync.fences().fenced().len().saturating_sub(before);
        }
    }

    /// The live OpenSM of highest priority (the lowest index) programs the ports from its file.
    pub fn sweep(&mut self) -> Option<usize> {
        let old = self.master;
        let Some(m) = (0..HOSTS).find(|h| self.opensm(*h)) else {
            return old; // no SM: the ports keep their tables, and the last master is kept
        };
        self.master = Some(m);
        if old.is_some_and(|o| o != m) {
            self.stats.failovers += 1;
        }
        let bytes = std::fs::read(&self.hosts[m].file).unwrap();
        for (i, n) in self.nodes.iter().enumerate() {
            let mut held = BTreeMap::new();
            for k in KEYS {
                let members = members_of(&bytes, PKey::new(k).unwrap()).unwrap_or_default();
                if let Some(m) = members.iter().find(|m| m.guid == n.guid) {
                    held.insert(k, m.full);
                }
            }
            self.ports[i] = held;
        }
        old
    }

    /// Draws a seed's node snapshots and restarts from a stream of its own, at `times` the
    /// usual rate (at most 10).
    pub fn draw_node_life(&mut self, seed: u64, times: u32) {
        let rng = StdRng::seed_from_u64(seed ^ 0x4E0D_E11F_E000_0001);
        self.life_rng = Some((rng, times.min(10)));
    }

    async fn apply(&mut self, n: usize) -> String {
        let step = self.step;
        let mut lines = Vec::new();
        let outcome = self.nodes[n]
            .apply(&self.hosts, &self.ports[n], step, &mut lines)
            .await;
        // The check's lines came first: the apply sent what it allowed.
        let checked: String = lines.iter().map(|l| format!("{l}\n       ")).collect();
        format!("{checked}{}", self.describe(outcome))
    }

    fn describe(&mut self, outcome: Outcome) -> String {
        match outcome {
            Outcome::Acknowledged { by } => format!("acknowledged by {by:?}"),
            Outcome::NotAcknowledged(why) => {
                if why.contains("SM-host set is not covered") {
                    self.stats.host_set_incomplete += 1;
                }
                format!("not acknowledged: {why}")
            }
        }
    }

    async fn node_step(&mut self, rng: &mut StdRng, what: u32) -> String {
        let n = rng.random_range(0..NODES);
        match what {
            0..=17 => {
                let k = KEYS[rng.random_range(0..KEYS.len())];
                let node = &mut self.nodes[n];
                if node.has(k) || node.attachments.len() >= 2 {
                    return format!("node{n} busy");
                }
                node.attach(k);
                let out = self.apply(n).await;
                format!("node{n} attaches {k:#06x}: {out}")
            }
            18..=29 => {
                let k = KEYS[rng.random_range(0..KEYS.len())];
                if !self.nodes[n].release(k) {
                    return format!("node{n} holds no {k:#06x}");
                }
                let out = self.apply(n).await;
                format!("node{n} releases {k:#06x}: {out}")
            }
            _ => {
                if !self.nodes[n].owes_apply(&self.ports[n]) {
                    return format!("node{n} owes no apply");
                }
                let out = self.apply(n).await;
                format!("node{n} re-applies: {out}")
            }
        }
    }

    async fn host_step(&mut self, rng: &mut StdRng, what: u32) -> (String, Option<usize>) {
        let h = rng.random_range(0..HOSTS);
        let agent = self.hosts[h].agent.is_some();
        let opensm = self.opensm(h);
        let line = match what {
            45..=49 if agent => {
                self.hosts[h].stop_agent(&self.net);
                format!(
                    "smhost{h}'s agent dies (OpenSM {})",
                    if opensm { "runs on" } else { "down" }
                )
            }
            50..=54 if opensm => {
                self.set_opensm(h, false);
                format!(
                    "smhost{h}'s OpenSM dies (agent {})",
                    if agent { "lives" } else { "down" }
                )
            }
            55..=58 if agent || opensm => {
                self.hosts[h].stop_agent(&self.net);
                self.set_opensm(h, false);
                format!("smhost{h} dies whole")
            }
            45..=66 if !agent || !opensm => self.start_host(h).await,
            67..=69 if agent && opensm => {
                self.hosts[h].stop_agent(&self.net);
                self.hosts[h].start_agent(HOSTS, &self.net, self.step).await;
                self.stats.restarts_beside_opensm += 1;
                return (
                    format!("smhost{h}'s agent restarts beside its running OpenSM"),
                    Some(h),
                );
            }
            70..=71 if self.hosts[h].snapshot.is_some() => {
                self.hosts[h].stop_agent(&self.net);
                self.set_opensm(h, false);
                let from = self.hosts[h].restore().unwrap();
                self.stats.restores += 1;
                let up = self.start_host(h).await;
                format!("smhost{h} restored whole from the snapshot of step {from}; {up}")
            }
            72..=74 => {
                self.hosts[h].take_snapshot(self.step);
                format!("smhost{h}'s disk snapshotted")
            }
            98..=99 if agent => {
                let b = (h + 1 + rng.random_range(0..HOSTS - 1)) % HOSTS;
                let fences = self.hosts[h].agent.as_ref().unwrap().sync.fences().clone();
                match fences.fence_now(&host_name(b)).await {
                    Ok(_) => {
                        self.stats.fences += 1;
                        format!("operator on smhost{h} fences smhost{b}")
                    }
                    Err(e) => format!("operator on smhost{h} cannot fence smhost{b}: {e}"),
                }
            }
            _ => format!("smhost{h}: nothing to do"),
        };
        (line, None)
    }

    /// One drawn step, then the sweep, the nodes' port reads, and the oracle.
    pub async fn step_once(&mut self, rng: &mut StdRng) -> Result<(), String> {
        self.step += 1;
        self.stats.steps += 1;
        let before = self.ports.clone();
        let what = rng.random_range(0..100u32);
        if std::env::var_os("FABRIC_SIM_SM_HOSTS_TRACE").is_some() {
            eprintln!("step {} draws {what}", self.step);
        }
        let mut restarted_beside = None;
        let line = match what {
            0..=44 => self.node_step(rng, what).await,
            75..=81 => {
                let (a, b) = (rng.random_range(0..HOSTS), rng.random_range(0..HOSTS));
                let pair = (a.min(b), a.max(b));
                let mut net = self.net.lock().unwrap();
                if a == b {
                    "no link".into()
                } else if !net.cut.remove(&pair) {
                    net.cut.insert(pair);
                    format!("cut smhost{} - smhost{}", pair.0, pair.1)
                } else {
                    format!("heal smhost{} - smhost{}", pair.0, pair.1)
                }
            }
            82..=85 => {
                let (n, h) = (rng.random_range(0..NODES), rng.random_range(0..HOSTS));
                let cut = &mut self.nodes[n].cut;
                if !cut.remove(&h) {
                    cut.insert(h);
                    format!("node{n} loses smhost{h}")
                } else {
                    format!("node{n} reaches smhost{h} again")
                }
            }
            86..=97 => {
                let h = rng.random_range(0..HOSTS);
                self.round(h).await;
                format!("smhost{h} pulls its peers")
            }
            _ => {
                let (line, beside) = self.host_step(rng, what).await;
                restarted_beside = beside;
                line
            }
        };
        self.log.push(format!("{:>4} {line}", self.step));
        self.node_life().await;
        let master = (0..HOSTS).find(|h| self.opensm(*h));
        if master != self.master {
            self.log
                .push(format!("     master: {master:?} (was {:?})", self.master));
        }
        if std::env::var_os("FABRIC_SIM_SM_HOSTS_TRACE").is_some() {
            eprintln!("{}", self.log.last().unwrap());
        }
        let old = self.sweep();
        for n in 0..NODES {
            let lines = self.nodes[n].reconcile(&self.ports[n]);
            self.log
                .extend(lines.into_iter().map(|l| format!("     {l}")));
        }
        self.stats.released = self.nodes.iter().map(|n| n.released_count).sum();
        self.stats.node_restarts = self.nodes.iter().map(|n| n.life.restarts).sum();
        self.stats.node_restores = self.nodes.iter().map(|n| n.life.restores).sum();
        self.stats.node_rollbacks = self.nodes.iter().map(|n| n.life.rollbacks).sum();
        self.stats.withheld = self.nodes.iter().map(|n| n.life.withheld).sum();
        self.stats.rollbacks_while_standing = self
            .nodes
            .iter()
            .map(|n| n.life.rollbacks_while_standing)
            .sum();
        self.stats.active = self.nodes.iter().map(|n| n.active_count).sum();
        oracle::check(self, old, restarted_beside.map(|h| (h, &before)))
    }

    /// After the step's own event: a node snapshot or restart drawn from the node-life stream
    /// (2 % and 3 % of steps, or `times` that; a restart runs the new life's first pass at once), the control
    /// plane's resync of a node that owes one (a third of the steps after), and one pass of
    /// every node whose start check is not settled (a step stands for one `RETRY`).
    async fn node_life(&mut self) {
        let Some((rng, times)) = &mut self.life_rng else {
            return;
        };
        let times = *times;
        let what = rng.random_range(0..100u32);
        let n = rng.random_range(0..NODES);
        let kind = match rng.random_range(0..3u32) {
            0 => Restart::Clean,
            1 => Restart::Crash,
            _ => Restart::Restore,
        };
        let resyncs: Vec<bool> = (0..NODES).map(|_| rng.random_ratio(1, 3)).collect();
        let step = self.step;
        match what {
            w if w < 2 * times => {
                self.nodes[n].snapshot(step);
                self.log.push(format!("     node{n}'s store snapshotted"));
            }
            w if w < 5 * times => {
                let kind = if kind == Restart::Restore && self.nodes[n].life.snapshot.is_none() {
                    Restart::Crash
                } else {
                    kind
                };
                let line = self.nodes[n].restart(kind, step);
                self.log.push(format!("     {line}"));
                // The new life's first pass, at once.
                let out = self.apply(n).await;
                self.log.push(format!("     node{n}'s first pass: {out}"));
            }
            _ => {}
        }
        for (i, due) in resyncs.into_iter().enumerate() {
            if due && self.nodes[i].life.cp.resync_due {
                let line = self.nodes[i].resync();
                self.log.push(format!("     {line}"));
            }
        }
        for i in 0..NODES {
            let node = &self.nodes[i];
            if node.life.check_due(step) && node.life.last_pass != step {
                let out = self.apply(i).await;
                self.log.push(format!("     node{i} passes: {out}"));
            }
        }
    }

    /// Hosts that some host holds fenced (stored: a fence outlives its agent's crash).
    pub fn fenced(&self) -> BTreeSet<usize> {
        (0..HOSTS)
            .filter(|h| self.fenced_on_some_disk(*h))
            .collect()
    }

    /// Whether some host's stored fences (running or not: they are durable) name host `h`.
    pub fn fenced_on_some_disk(&self, h: usize) -> bool {
        use fabric_agent::sm::opensm::NodeMembershipStore;
        self.hosts.iter().any(|o| {
            o.store
                .load_fenced()
                .unwrap()
                .iter()
                .any(|f| f.host == host_name(h))
        })
    }

    pub fn opensm_runs(&self, h: usize) -> bool {
        self.opensm(h)
    }
}
