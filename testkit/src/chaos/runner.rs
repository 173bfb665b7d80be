//! The campaign runner on the ibsim + real OpenSM rig: two SM hosts (two OpenSMs, priorities 15
//! and 10, an SM-host agent beside each, peers of each other through a link the faults cut),
//! `nodes` node agents (real `fabric-agent serve` processes under the shim, SMP observers,
//! remote backend to both SM hosts, each through a link of its own the faults cut; grants
//! required everywhere), the control-plane driver, the checker's recorders, and the seeded
//! fault loop. After `duration` the faults stop and everything is healed; the campaign then
//! waits (at most `converge_bound`) until every wanted key is ACTIVE and on its port, every
//! released instance RELEASED and off its port, and both SM hosts' regions equal.
//!
//! ibsim serves at most 10 clients: two OpenSMs, the node agents and the checker's one
//! `smpquery` at a time. A client killed by a signal would keep its slot for good; the rig's
//! guards free it ([`crate::rig::ibsim_slots`]), and before every restart of a process under the
//! shim the campaign frees any slot a dead client still holds (counted: leaks the guards
//! missed), so SIGKILLs are never downgraded. A restarted OpenSM that announces no state in time
//! is a counted rig recovery ([`crate::rig::restarts`]).

use super::checker::{self, Violation};
use super::driver::{mode, Driver, Plan};
use super::faults::{Fault, FaultLog, Schedule, Target};
use super::history::{now_ms, History, SharedHistory};
use super::observe::{
    conditions as conditions_of, watch_node, AgentApi, PortReader, Resyncs, StateView,
};
pub use super::report::Report;
use super::start::start_agents;
use crate::common::copy_tree;
use crate::common::grants::GrantSigner;
use crate::common::net::free_port;
use crate::rig::agents::Agent;
use crate::rig::first_read;
use crate::rig::ha::{region_of, start_two_sms, SecondSm, SmHostAgent, TwoSmFiles};
use crate::rig::ibsim_slots::alive;
use crate::rig::link::CuttableLink;
use crate::rig::restarts;
use crate::rig::{Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// ibsim's most clients at once.
const IBSIM_CLIENTS: usize = 10;
/// How long a master may take to answer a SIGHUP with a `SUBNET UP` after the faults.
const SWEEP_LIMIT: Duration = Duration::from_secs(20);
/// How long a restarted node agent may take to log `ready` (its first port read done).
const FIRST_READ_LIMIT: Duration = Duration::from_secs(10);

/// NodeDescriptions that read like OpenSM's verdicts (OpenSM logs them verbatim when a link
/// changes), given to the first nodes in turn.
pub const VERDICT_DESCRIPTIONS: [&str; 4] = [
    "chaos mlx5_0 -> SUBNET UP",
    "chaos mlx5_0 PARSE ERROR",
    "chaos Entering STANDBY state",
    "chaos Partition configuration in error",
];

/// A campaign's parameters.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Seeds the fault schedule and the driver's choices.
    pub seed: u64,
    /// How long faults run.
    pub duration: Duration,
    /// Node agents (at most 7: ibsim's client limit).
    pub nodes: usize,
    /// Whether faults run at all (false: the driver alone).
    pub faults: bool,
    /// The stated bound on convergence after the faults stop.
    pub converge_bound: Duration,
    /// When set: this long into the run, a partitions line written behind the agents' back
    /// gives node `rogue_node`'s port a key never granted (for the test that shows the checker
    /// is real); removed 10 s later.
    pub rogue_after: Option<Duration>,
    /// Whether state snapshots are taken and put back (see the notes: a restored store whose
    /// set carries a grant consumed since is refused before its rollback is seen).
    pub restores: bool,
    /// When set: the node agents run with `FABRIC_AGENT_TEST_MUTATION` set to this name (one
    /// truth rule switched off in the debug build, `fabric_agent::test_mutation`), for the
    /// test that shows a broken rule fails the campaign. The SM-host agents never get it.
    pub mutation: Option<String>,
    /// Whether every gRPC link runs over mTLS ([`super::tls`]): on unless `CHAOS_TLS=0`.
    pub tls: bool,
}

impl Settings {
    /// `seed`, `duration`, 6 nodes, faults on, a 120 s convergence bound, no rogue line,
    /// mTLS unless the environment says `CHAOS_TLS=0` (plaintext, for comparison).
    pub fn new(seed: u64, duration: Duration) -> Settings {
        Settings {
            seed,
            duration,
            nodes: 6,
            faults: true,
            converge_bound: Duration::from_secs(120),
            rogue_after: None,
            restores: true,
            mutation: None,
            tls: std::env::var("CHAOS_TLS").map_or(true, |v| v != "0"),
        }
    }
}

/// The key the rogue line gives (never granted by the driver: its keys start at 0x1001).
pub const ROGUE_KEY: u16 = 0x0bad;
/// The node whose port the rogue line names.
pub const ROGUE_NODE: &str = "node3";

/// What undoes a fault when its time comes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    Restart(Target),
    Cont(Target),
    HealNode(usize, usize),
    HealPeers,
    ReLink(usize),
}

/// Everything running.
struct World {
    // Drop order: node agents, SM-host agents, links, the second OpenSM, the fabric.
    agents: Vec<Agent>,
    sm_agents: Vec<SmHostAgent>,
    node_links: Vec<[CuttableLink; 2]>,
    peer_links: [CuttableLink; 2],
    standby: SecondSm,
    fabric: Fabric,
    files: TwoSmFiles,
    names: Vec<String>,
    /// Processes down (killed, waiting for their restart).
    down: BTreeSet<Target>,
    /// Processes stopped (SIGSTOP).
    paused: BTreeSet<Target>,
    cut: BTreeSet<(usize, usize)>,
    peers_cut: bool,
    unlinked: BTreeSet<usize>,
    snapshots: BTreeSet<usize>,
    /// Dead clients' ibsim slots freed by the sweeps before restarts (leaks the guards missed).
    slots_swept: u64,
    log: FaultLog,
    rig_recoveries: u64,
    history: SharedHistory,
    /// The driver's plan (told which nodes were restored).
    plan: Arc<Mutex<Plan>>,
}

impl World {
    fn pid(&self, t: Target) -> Option<u32> {
        match t {
            Target::Node(i) => Some(self.agents[i].pid()),
            Target::SmAgent(h) => Some(self.sm_agents[h].pid()),
            Target::OpenSm(0) => Some(self.fabric.opensm_pid()),
            Target::OpenSm(_) => self.standby.pid(),
        }
    }

    fn state_dir(&self, node: usize) -> PathBuf {
        self.fabric
            .dir()
            .join(format!("{}-state", self.names[node]))
    }

    fn snapshot_dir(&self, node: usize) -> PathBuf {
        self.fabric
            .dir()
            .join(format!("{}-state-snapshot", self.names[node]))
    }

    fn busy(&self, t: Target) -> bool {
        self.down.contains(&t) || self.paused.contains(&t)
    }

    /// Applies `fault`, scheduling its undo in `pending`; a fault whose target is busy is
    /// skipped (not counted).
    fn apply(&mut self, fault: &Fault, pending: &mut Vec<(Instant, Undo)>) {
        let now = Instant::now();
        match fault {
            Fault::Kill { target, hard, down } => {
                if self.busy(*target) {
                    return;
                }
                let hard = *hard;
                self.log.applied(fault, &fault.kind(), "");
                match *target {
                    Target::Node(i) if hard => self.agents[i].crash(),
                    Target::Node(i) => {
                        let _ = self.agents[i].stop();
                    }
                    Target::SmAgent(h) if hard => self.sm_agents[h].crash(),
                    Target::SmAgent(h) => {
                        let _ = self.sm_agents[h].stop();
                    }
                    Target::OpenSm(0) => self.fabric.stop_opensm(hard),
                    Target::OpenSm(_) => self.standby.stop(hard),
                }
                self.down.insert(*target);
                pending.push((now + *down, Undo::Restart(*target)));
            }
            Fault::Pause { target, pause } => {
                if self.busy(*target) {
                    return;
                }
                let Some(pid) = self.pid(*target) else { return };
                self.log.applied(fault, &fault.kind(), "");
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
                self.paused.insert(*target);
                pending.push((now + *pause, Undo::Cont(*target)));
            }
            Fault::CutNode { node, host, cut } => {
                if !self.cut.insert((*node, *host)) {
                    return;
                }
                self.log.applied(fault, &fault.kind(), "");
                self.node_links[*node][*host].cut();
                pending.push((now + *cut, Undo::HealNode(*node, *host)));
            }
            Fault::CutPeers { cut } => {
                if self.peers_cut {
                    return;
                }
                self.peers_cut = true;
                self.log.applied(fault, &fault.kind(), "");
                for l in &self.peer_links {
                    l.cut();
                }
                pending.push((now + *cut, Undo::HealPeers));
            }
            Fault::Flap { node, down } => {
                if !self.unlinked.insert(*node) {
                    return;
                }
                self.log.applied(fault, &fault.kind(), "");
                let cmd = format!("Unlink \"{}\"", self.names[*node]);
                let _ = self.fabric.ibsim_console(&cmd);
                super::history::record(
                    &self.history,
                    super::history::Entry::Link {
                        node: self.names[*node].clone(),
                        up: false,
                        at: now_ms(),
                    },
                );
                pending.push((now + *down, Undo::ReLink(*node)));
            }
            Fault::Snapshot { node } => {
                let t = Target::Node(*node);
                if self.busy(t) {
                    return;
                }
                self.log.applied(fault, &fault.kind(), "");
                let pid = Pid::from_raw(self.agents[*node].pid() as i32);
                let _ = kill(pid, Signal::SIGSTOP);
                let snap = self.snapshot_dir(*node);
                let _ = std::fs::remove_dir_all(&snap);
                copy_tree(&self.state_dir(*node), &snap);
                let _ = kill(pid, Signal::SIGCONT);
                self.snapshots.insert(*node);
            }
            Fault::Restore { node } => {
                let t = Target::Node(*node);
                if self.busy(t) || !self.snapshots.remove(node) {
                    return;
                }
                self.log.applied(fault, &fault.kind(), "");
                let _ = self.agents[*node].stop();
                let dir = self.state_dir(*node);
                std::fs::remove_dir_all(&dir).expect("remove the state dir");
                copy_tree(&self.snapshot_dir(*node), &dir);
                let _ = std::fs::remove_dir_all(self.snapshot_dir(*node));
                self.plan
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .restored
                    .insert(*node);
                self.agents[*node].spawn(&self.fabric);
            }
        }
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Restart(t) => {
                if !matches!(t, Target::SmAgent(_)) {
                    self.sweep_slots();
                }
                match t {
                    Target::Node(i) => self.restart_node(i),
                    Target::SmAgent(h) => self.sm_agents[h].spawn(),
                    Target::OpenSm(_) => self.restart_opensm(t),
                }
                self.down.remove(&t);
                self.log.note(&format!("restarted {t:?}"));
            }
            Undo::Cont(t) => {
                if let Some(pid) = self.pid(t) {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                }
                self.paused.remove(&t);
            }
            Undo::HealNode(n, h) => {
                self.node_links[n][h].heal();
                self.cut.remove(&(n, h));
            }
            Undo::HealPeers => {
                for l in &self.peer_links {
                    l.heal();
                }
                self.peers_cut = false;
            }
            Undo::ReLink(n) => {
                let cmd = format!("ReLink \"{}\"", self.names[n]);
                let _ = self.fabric.ibsim_console(&cmd);
                super::history::record(
                    &self.history,
                    super::history::Entry::Link {
                        node: self.names[n].clone(),
                        up: true,
                        at: now_ms(),
                    },
                );
                self.unlinked.remove(&n);
            }
        }
    }

    /// Starts node agent `i` again. A start whose first port read fails with a umad EPERM (its
    /// ibsim slot lost to another client, finding F5: [`crate::rig::first_read`]) is stopped by
    /// SIGKILL, the dead clients' slots are freed, and it is started again: a counted rig recovery,
    /// logged `RIG ...` (at most [`restarts::TRIES`] starts; the last one stands as it is).
    fn restart_node(&mut self, i: usize) {
        for attempt in 1..=restarts::TRIES {
            let from = std::fs::metadata(&self.agents[i].log).map_or(0, |m| m.len() as usize);
            self.agents[i].spawn(&self.fabric);
            if attempt == restarts::TRIES {
                return;
            }
            let log = self.agents[i].log.clone();
            if first_read::wait_first_read(&log, from, FIRST_READ_LIMIT) != Some(true) {
                return;
            }
            let pid = self.agents[i].pid();
            let clients = match self.fabric.ibsim_slots().attached() {
                Ok(c) => format!("{} attached {c:?}", c.len()),
                Err(e) => e,
            };
            self.log.note(&format!(
                "RIG (attempt {attempt}): the restarted {} agent (pid {pid}) failed its first \
                 port read with `umad write failed: EPERM` (its ibsim slot answers another \
                 client); ibsim: {clients}; stopping it by pid and starting it again",
                self.names[i]
            ));
            self.rig_recoveries += 1;
            // SIGKILL: a clean exit would send ibsim a disconnect for the slot id it was given,
            // which is the other client's slot now.
            self.agents[i].crash();
            self.sweep_slots();
        }
    }

    /// Frees the slots dead clients still hold (a death the guards did not see), counted.
    fn sweep_slots(&mut self) {
        match self.fabric.ibsim_slots().free_dead() {
            Ok(freed) if !freed.is_empty() => {
                self.slots_swept += freed.len() as u64;
                self.log
                    .note(&format!("RIG: freed leaked ibsim slots {freed:?}"));
            }
            Ok(_) => {}
            Err(e) => self.log.note(&format!("RIG: ibsim slots not listed: {e}")),
        }
    }

    /// Starts OpenSM `t` again: a start that announces no state in time is stopped by pid and
    /// made again (a counted rig recovery, logged `RIG ...`).
    fn restart_opensm(&mut self, t: Target) {
        let mut notes = Vec::new();
        let recoveries = match t {
            Target::OpenSm(0) => restarts::rig_opensm(&mut self.fabric, &mut notes),
            _ => restarts::standby(&mut self.standby, self.fabric.ibsim_slots(), &mut notes),
        };
        for n in notes {
            self.log.note(&n);
        }
        self.rig_recoveries += recoveries;
    }

    /// After the faults: a master that sweeps. OpenSM 3.3.23 under ibsim sometimes stops
    /// sweeping for good after a handover; such a stall is logged (with the logs' tails) and
    /// both OpenSMs are restarted, at most three times.
    fn ensure_sweeping(&mut self) {
        for attempt in 1..=3 {
            let pids = [self.pid(Target::OpenSm(0)), self.pid(Target::OpenSm(1))];
            if restarts::some_master_sweeps(&self.fabric, &self.standby, pids, SWEEP_LIMIT) {
                return;
            }
            let tail = restarts::log_tail;
            self.log.note(&format!(
                "RIG STALL (attempt {attempt}): no OpenSM answered a SIGHUP with SUBNET UP in 20 s; restarting both\n--- opensm (priority 15) ---\n{}\n--- opensm (priority 10) ---\n{}",
                tail(self.fabric.opensm_log_path()),
                tail(self.standby.log_path())
            ));
            self.rig_recoveries += 1;
            self.fabric.stop_opensm(false);
            self.standby.stop(false);
            self.sweep_slots();
            self.restart_opensm(Target::OpenSm(0));
            self.restart_opensm(Target::OpenSm(1));
        }
    }
}

/// Writes (or, with `None`, removes) the rogue line in both partitions files where it is not
/// already as wanted, and SIGHUPs both OpenSMs after a change. Called on every turn of the
/// campaign loop while the line should stand: the SM-host agents rewrite their files at every
/// commit, so a line written once can be gone before OpenSM's next read.
fn rogue_line(world: &World, guid: Option<u64>) {
    let mut changed = false;
    for path in [&world.files.a.0, &world.files.b.0] {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let kept: String = text
            .lines()
            .filter(|l| !l.starts_with("chaos_rogue="))
            .map(|l| format!("{l}\n"))
            .collect();
        let new = match guid {
            Some(g) => format!("{kept}chaos_rogue={ROGUE_KEY:#06x} : {g:#018x}=full ;\n"),
            None => kept,
        };
        if new == text {
            continue;
        }
        let tmp = path.with_extension("chaos-tmp");
        std::fs::write(&tmp, new).expect("write partitions");
        std::fs::rename(&tmp, path).expect("rename partitions");
        changed = true;
    }
    if !changed {
        return;
    }
    for t in [Target::OpenSm(0), Target::OpenSm(1)] {
        if let Some(pid) = world.pid(t) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGHUP);
        }
    }
}

/// Runs one campaign; `None` when ibsim/OpenSM are not installed.
pub fn run(settings: &Settings) -> Option<Report> {
    let nodes = settings.nodes;
    assert!(
        nodes + 3 <= IBSIM_CLIENTS,
        "at most {} nodes",
        IBSIM_CLIENTS - 3
    );
    let mut spec = FabricSpec::new(2, nodes + 1);
    for (i, d) in VERDICT_DESCRIPTIONS.iter().enumerate().take(nodes) {
        spec.descriptions
            .insert(format!("node{}", i + 1), (*d).into());
    }
    let standby_node = format!("node{}", nodes + 1);
    let (fabric, standby) = start_two_sms(&spec, LIMITED_DEFAULT_PARTITIONS, &standby_node)?;
    let names: Vec<String> = (1..=nodes).map(|i| format!("node{i}")).collect();
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let signer = Arc::new(GrantSigner::new("cp-chaos"));
    let grants = format!("[grants]\nrequire = true\n{}", signer.config_entry(""));
    let mutation_env: Vec<(String, String)> = settings
        .mutation
        .iter()
        .map(|m| (fabric_agent::test_mutation::ENV.to_owned(), m.clone()))
        .collect();
    let started = start_agents(
        &fabric,
        &files,
        &names,
        &grants,
        &mutation_env,
        settings.tls,
    );
    let (node_apis, sm_apis) = (started.node_apis, started.sm_apis);
    let history: SharedHistory = Arc::new(Mutex::new(History::default()));
    let rogue_guid = settings
        .rogue_after
        .map(|_| fabric.node_info(ROGUE_NODE).port_guid);
    let mut world = World {
        agents: started.agents,
        sm_agents: started.sm_agents,
        node_links: started.node_links,
        peer_links: started.peer_links,
        standby,
        files,
        names: names.clone(),
        down: BTreeSet::new(),
        paused: BTreeSet::new(),
        cut: BTreeSet::new(),
        peers_cut: false,
        unlinked: BTreeSet::new(),
        snapshots: BTreeSet::new(),
        slots_swept: 0,
        log: FaultLog::default(),
        rig_recoveries: 0,
        history: history.clone(),
        plan: Arc::new(Mutex::new(Plan::default())),
        fabric,
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let view: StateView = Arc::new(Mutex::new(Default::default()));
    let resyncs: Resyncs = Arc::new(Mutex::new(Default::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let watchers: Vec<_> = names
        .iter()
        .zip(&node_apis)
        .map(|(n, api)| {
            rt.spawn(watch_node(
                n.clone(),
                api.clone(),
                history.clone(),
                view.clone(),
                resyncs.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let mut reader = PortReader::start(
        world.fabric.sock_name(),
        world.fabric.dir(),
        names.clone(),
        Duration::from_millis(20),
        history.clone(),
    );
    let driver = Arc::new(Driver {
        nodes: names.iter().cloned().zip(node_apis.clone()).collect(),
        sm_hosts: sm_apis,
        signer,
        history: history.clone(),
        view: view.clone(),
        plan: world.plan.clone(),
        mode: Arc::new(AtomicU8::new(mode::RUN)),
        resyncs,
    });
    let driving = rt.spawn(driver.clone().run(settings.seed ^ 0x5eed));

    // The faults.
    let mut schedule = Schedule::new(settings.seed, nodes);
    let mut pending: Vec<(Instant, Undo)> = Vec::new();
    let start = Instant::now();
    let started_at = now_ms();
    let end = start + settings.duration;
    let mut next_fault = start + Duration::from_secs(5);
    let mut rogue_state = 0;
    world.log.note(&format!(
        "campaign: seed {}, {} s, {nodes} nodes, faults {}, test mutation {:?}",
        settings.seed,
        settings.duration.as_secs(),
        settings.faults,
        settings.mutation
    ));
    while Instant::now() < end {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(t, _)| *t <= now);
        pending = later;
        for (_, u) in due {
            world.undo(u);
        }
        if let (Some(after), Some(guid)) = (settings.rogue_after, rogue_guid) {
            if rogue_state == 0 && now >= start + after {
                world
                    .log
                    .note("rogue: a partitions line gives node3 a key never granted");
                rogue_line(&world, Some(guid));
                rogue_state = 1;
            } else if rogue_state == 1 && now >= start + after + Duration::from_secs(10) {
                world.log.note("rogue: the line removed");
                rogue_line(&world, None);
                rogue_state = 2;
            } else if rogue_state == 1 {
                rogue_line(&world, Some(guid));
            } else if rogue_state == 2 {
                // An SM-host commit that read the file before the removal writes the line back
                // (it keeps lines outside its region as the operator's).
                rogue_line(&world, None);
            }
        }
        if settings.faults && now >= next_fault {
            let snapshots = world.snapshots.clone();
            let fault = schedule.next(|n| snapshots.contains(&n));
            let skip = !settings.restores
                && matches!(fault, Fault::Snapshot { .. } | Fault::Restore { .. });
            if !skip {
                world.apply(&fault, &mut pending);
            }
            next_fault = Instant::now() + schedule.gap();
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // Heal: every pending undo now, then a master that sweeps.
    world.log.note("faults stop; healing");
    let faults_stopped = Instant::now();
    for (_, u) in std::mem::take(&mut pending) {
        world.undo(u);
    }
    if rogue_state == 1 {
        rogue_line(&world, None);
    }
    driver.mode.store(mode::SETTLE, Ordering::SeqCst);
    world.ensure_sweeping();

    // Convergence.
    let mut convergence = None;
    let mut last_problem = String::new();
    while faults_stopped.elapsed() < settings.converge_bound {
        let checked_from = now_ms();
        std::thread::sleep(Duration::from_secs(1));
        // A round of port reads can take several seconds on a loaded machine: wait (within the
        // bound) until every node's port was read by a query that started after `checked_from`.
        while !read_every_node_since(&world, &history, checked_from)
            && faults_stopped.elapsed() < settings.converge_bound
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        if settings.rogue_after.is_some() {
            // An SM-host commit that read the file before the line was removed writes it back.
            rogue_line(&world, None);
        }
        match converged(&world, &driver, &history, checked_from) {
            Ok(()) => {
                convergence = Some(faults_stopped.elapsed());
                break;
            }
            Err(p) => last_problem = p,
        }
    }
    if convergence.is_none() {
        // With FABRIC_RIG_KEEP set: every agent's and OpenSM's log, for the diagnosis.
        crate::rig::stall::keep_for_diagnosis(world.fabric.dir(), None, "chaos-not-converged");
    } else if settings.mutation.is_some() {
        // With FABRIC_RIG_KEEP set: the logs of a run with a rule switched off (they say so).
        crate::rig::stall::keep_for_diagnosis(world.fabric.dir(), None, "chaos-mutation");
    }
    // Every standing condition a node or SM host reports at convergence (GetNode), listed.
    let mut conditions = Vec::new();
    if convergence.is_some() {
        let sm = world
            .sm_agents
            .iter()
            .map(|a| (&a.name, AgentApi::Unix(a.socket.clone())));
        for (who, api) in driver.nodes.iter().map(|(n, a)| (n, a.clone())).chain(sm) {
            match rt.block_on(conditions_of(&api)) {
                Ok(list) => conditions.extend(list.into_iter().map(|(k, d)| (who.clone(), k, d))),
                Err(e) => conditions.push((who.clone(), "(GetNode failed)".into(), e)),
            }
        }
    }
    // The guard is not blind: ListPartitionMembers at both SM hosts lists each wanted key's
    // node.
    let mut guard_view = (0, 0, String::new());
    if convergence.is_some() {
        if let Ok(wanted) = driver.settled() {
            for (node, _, k) in wanted {
                guard_view.1 += 1;
                let listed = rt.block_on(driver.members(k)).unwrap_or_default();
                let hosts: BTreeSet<usize> = listed
                    .iter()
                    .filter(|(_, n, _)| *n == node)
                    .map(|(h, _, _)| *h)
                    .collect();
                if hosts.len() == 2 {
                    guard_view.0 += 1;
                } else if guard_view.2.is_empty() {
                    guard_view.2 = format!("(first miss: {k:#06x} of {node}: {listed:?})");
                }
            }
        }
    }
    driver.mode.store(mode::STOP, Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    reader.stop();
    let port_reads = reader.counts();
    rt.block_on(async {
        let _ = driving.await;
        for w in watchers {
            let _ = w.await;
        }
    });
    let history = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut verdict = checker::check(&history);
    if convergence.is_none() {
        verdict.violations.push(Violation {
            at: now_ms(),
            rule: checker::NOT_CONVERGED,
            detail: format!(
                "not converged {} s after the faults stopped: {last_problem}",
                settings.converge_bound.as_secs()
            ),
        });
    }
    verdict
        .violations
        .extend(checker::unexplained(&conditions, now_ms()));
    let resyncs = history
        .entries
        .iter()
        .filter(|e| matches!(e, super::history::Entry::Resync { .. }))
        .count();
    let mutation_events = history
        .events()
        .filter(|e| {
            e.change
                .as_ref()
                .is_some_and(|c| c.reason.contains("TEST MUTATION"))
        })
        .count();
    let attached = world.fabric.ibsim_slots().attached().unwrap_or_default();
    let slots = (
        world.fabric.ibsim_slots().freed(),
        world.slots_swept,
        attached.len(),
        attached.iter().filter(|c| !alive(c.pid)).count(),
    );
    let plan = driver.plan.lock().unwrap_or_else(|p| p.into_inner());
    let report = Report {
        seed: settings.seed,
        started_at,
        faults: world.log.clone(),
        ops: plan.ops.clone(),
        verdict,
        port_reads,
        convergence,
        resyncs,
        mutation_events,
        rig_recoveries: world.rig_recoveries,
        slots,
        partitions: (
            plan.partitions.len(),
            plan.partitions.iter().filter(|p| p.deleted).count(),
        ),
        guard_view,
        tls: settings.tls,
        conditions,
    };
    drop(plan);
    drop(rt);
    drop(world);
    Some(report)
}

/// Whether every node's port was read by a query that started at or after `from`.
fn read_every_node_since(world: &World, history: &SharedHistory, from: u64) -> bool {
    let h = history.lock().unwrap_or_else(|p| p.into_inner());
    world
        .names
        .iter()
        .all(|n| h.reads().any(|r| r.node == *n && r.started >= from))
}

/// Whether the campaign converged: the driver's wants confirmed by the nodes' streams, each
/// node's port (read by a query started after `from`) holding exactly its wanted key, both SM
/// hosts' regions equal. `Err` says what is missing.
fn converged(
    world: &World,
    driver: &Driver,
    history: &SharedHistory,
    from: u64,
) -> Result<(), String> {
    let wanted = driver.settled()?;
    let mut want: BTreeMap<&str, Vec<u16>> =
        world.names.iter().map(|n| (n.as_str(), vec![])).collect();
    for (node, _, k) in &wanted {
        want.entry(node.as_str()).or_default().push(*k);
    }
    let h = history.lock().unwrap_or_else(|p| p.into_inner());
    for (node, keys) in &want {
        let last = h
            .reads()
            .filter(|r| r.node == *node && r.started >= from)
            .last()
            .ok_or(format!("no read of {node} yet"))?;
        let mut keys = keys.clone();
        keys.sort_unstable();
        if last.bases != keys {
            return Err(format!(
                "{node}'s port holds {:04x?}, wanted {keys:04x?}",
                last.bases
            ));
        }
    }
    let (a, b) = (region_of(&world.files.a.0), region_of(&world.files.b.0));
    if a != b {
        return Err(format!("the SM hosts' regions differ:\n{a}\n---\n{b}"));
    }
    Ok(())
}
