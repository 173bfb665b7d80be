//! The driver: one seed, one current-thread runtime with paused time, the real agent built from
//! the model parts and one store, the schedule's commands at their simulated instants, crashes
//! that drop the agent wherever it is, then healing and the liveness check.

use super::concurrent::{attach_request, instance_name, release_answered, AttachCall};
use super::core::command::{Command, CrashPoint};
use super::core::constants::{FABRIC, PORTS};
use super::core::plan::{GenOptions, Schedule};
use super::model_ports::{port_down, port_up, ModelObserver};
use super::model_sm::{generation_conflict, restart as sm_restart, ModelSm};
use super::schedule::generate;
use super::world::{with, Shared, World};
use fabric_agent::agent::{Agent, AgentParts};
use fabric_agent::config::ReconcilerConfig;
use fabric_agent::domain::{FabricName, Membership, PortSelector};
use fabric_agent::store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};

/// How long, in simulated time, the agent has to converge once the faults are healed.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(20 * 60);
/// How long the converged state must hold, with nothing left in flight or to program, to count
/// (longer than the observer's slow poll, so the agent looks at least once more).
const STABLE_FOR: Duration = Duration::from_secs(6);

/// The result of one seed.
pub struct Outcome {
    /// The schedule that ran.
    pub schedule: Schedule,
    /// The oracle's first finding (None: every check held).
    pub finding: Option<String>,
    /// What happened, with simulated times.
    pub trace: Vec<String>,
    /// Simulated time the run took, ms.
    pub sim_ms: u64,
    /// Applies the agent issued.
    pub applies: u64,
    /// Port reads the agent issued.
    pub reads: u64,
    /// ACTIVE and RELEASED events seen.
    pub active: u64,
    /// RELEASED events seen.
    pub released: u64,
}

/// Runs one seed to its end.
pub fn run_seed(seed: u64, options: GenOptions) -> Outcome {
    let schedule = generate(seed, options);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    // The backends' file and store I/O inline: a blocking thread beside the paused clock would
    // let the machine's load decide where its completion lands among the instant's tasks.
    fabric_agent::sm::blocking::inline_blocking_io(|| rt.block_on(drive(schedule)))
}

/// One incarnation of the agent.
struct Node {
    agent: Agent,
    reconciler: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

struct Parts {
    /// The node's store (reopened after a rollback).
    store: std::sync::Mutex<Arc<Store>>,
    /// The node's store on disk, in schedules that roll it back.
    node_disk: Option<super::rollback::NodeDisk>,
    sm: Arc<dyn fabric_agent::sm::SubnetManager>,
    observer: Arc<ModelObserver>,
    /// The SM host of a `--opensm` run (kept for its temp directory).
    sm_host: Option<super::model_opensm::SmHost>,
    /// UFM of a `--ufm` run: each incarnation of the agent builds its own backend.
    ufm: Option<super::model_ufm::Ufm>,
    /// The schedule's `released_retain`.
    released_retain: Duration,
    /// The WatchEvents consumers, served by each incarnation of the agent.
    watchers: super::watcher::Watchers,
}

impl Parts {
    async fn start(&self, world: &Shared) -> Node {
        let sm = Arc::new(super::crash::Crashable {
            world: world.clone(),
            inner: match &self.ufm {
                Some(u) => u.backend(world, &self.store.lock().expect("store lock")),
                None => self.sm.clone(),
            },
        });
        let agent = Agent::new(AgentParts {
            node_id: fabric_agent::domain::NodeId::parse("node-a").expect("node id"),
            fabric: FabricName::parse(FABRIC).expect("fabric name"),
            grants: fabric_agent::domain::GrantPolicy::off(
                FabricName::parse(FABRIC).expect("fabric name"),
            ),
            store: self.store.lock().expect("store lock").clone(),
            sm,
            observer: self.observer.clone(),
            observer_reason: "simulation".into(),
            selector: PortSelector::default(),
            reconciler: ReconcilerConfig::default(),
            released_retain: self.released_retain,
            allow_full_default: false,
            // The production `SystemClock`: the node's stepped wall clock at every call.
            clock: Arc::new(with(world, |w| w.wall.clone())),
        })
        .expect("agent from the store");
        // Like `serve`: the first inventory before anything else, retried.
        while agent.read_ports().await.is_err() {
            sleep(Duration::from_millis(200)).await;
        }
        let (stop, stopped) = watch::channel(false);
        let reconciler = agent.reconcile(stopped);
        self.watchers.serve(&agent);
        with(world, |w| w.log("agent: started"));
        Node {
            agent,
            reconciler,
            stop,
        }
    }
}

fn failed(world: &Shared) -> bool {
    world.lock().expect("world lock").oracle.finding.is_some()
}

async fn drive(schedule: Schedule) -> Outcome {
    let retain = schedule.retention.event_retain;
    let node_disk = super::rollback::rolls_back(&schedule.steps)
        .then(|| super::rollback::NodeDisk::new().retaining(retain));
    let store = match &node_disk {
        Some(disk) => disk.open(),
        None => Arc::new(Store::in_memory(retain).expect("in-memory store")),
    };
    let world = World::new(schedule.seed, store.clone());
    let t0 = world.lock().expect("world lock").t0;
    let sm_host = schedule
        .opensm
        .then(|| super::model_opensm::start(&world, &schedule.steps));
    let ufm = schedule.ufm.then(|| {
        super::model_ufm::start(
            &world,
            schedule.ufm_late_window_ms,
            schedule.ufm_unsteady_clock,
        )
    });
    let parts = Parts {
        released_retain: Duration::from_millis(schedule.retention.released_retain_ms),
        watchers: super::watcher::Watchers::start(&world, &schedule),
        ufm,
        store: std::sync::Mutex::new(store),
        node_disk,
        sm: match &sm_host {
            Some(h) => h.link.clone(),
            None => Arc::new(ModelSm::new(world.clone())),
        },
        sm_host,
        observer: Arc::new(ModelObserver::new(
            world.clone(),
            Duration::from_millis(schedule.fast_poll_ms),
            schedule.push_changes,
        )),
    };
    let mut node = parts.start(&world).await;
    for step in &schedule.steps {
        sleep_until(t0 + Duration::from_millis(step.at_ms)).await;
        if failed(&world) {
            break;
        }
        with(&world, |w| w.log(format!("command: {}", step.command)));
        node = execute(&step.command, node, &parts, &world).await;
        with(&world, |w| {
            let now = w.now_ms();
            w.oracle.check_durable(now)
        });
        if failed(&world) {
            break;
        }
    }
    if !failed(&world) {
        heal(&world);
        converge(&world, &node.agent).await;
        prunes_happen(&world).await;
    }
    // Stop the agent before the runtime goes (its tasks are dropped with it anyway).
    parts.watchers.stop(&world);
    node.reconciler.abort();
    drop(node.stop);
    let mut w = world.lock().expect("world lock");
    w.check();
    Outcome {
        schedule,
        finding: w.oracle.finding.clone(),
        trace: std::mem::take(&mut w.trace),
        sim_ms: w.now_ms(),
        applies: w.applies,
        reads: w.reads,
        active: w.oracle.active,
        released: w.oracle.released,
    }
}

async fn execute(command: &Command, node: Node, parts: &Parts, world: &Shared) -> Node {
    match command {
        Command::Attach {
            instance,
            partition,
            membership,
            port,
        } => {
            let limit = attach(
                &node.agent,
                world,
                *instance,
                *partition,
                *membership,
                *port,
            )
            .await;
            crash_after_command(node, parts, world, limit).await
        }
        Command::Release { instance } => {
            let name = instance_name(*instance);
            let (limit, wait) = command_crash(world);
            let r = run_command(node.agent.release(&name, wait), limit).await;
            with(world, |w| release_answered(w, &name, &r));
            crash_after_command(node, parts, world, limit).await
        }
        Command::Together { .. } => {
            let limit = super::concurrent::run(&node.agent, world, command).await;
            crash_after_command(node, parts, world, limit).await
        }
        Command::Crash {
            at: CrashPoint::CommandPoll(n),
            down_ms,
        } => {
            with(world, |w| w.command_crash = Some((*n, *down_ms)));
            node
        }
        Command::Crash {
            at: CrashPoint::ApplyPoll(n),
            down_ms,
        } => {
            let crashed = Arc::new(tokio::sync::Notify::new());
            with(world, |w| w.apply_crash = Some((*n, crashed.clone())));
            let hit = tokio::time::timeout(Duration::from_secs(30), crashed.notified()).await;
            with(world, |w| {
                w.apply_crash = None;
                if hit.is_ok() {
                    w.log(format!("agent: the apply reached poll {n}"));
                }
            });
            crash(node, parts, world, *down_ms).await
        }
        Command::Crash { at, down_ms } => {
            let signal = match at {
                CrashPoint::InApply => Some(world.lock().expect("lock").apply_started.clone()),
                CrashPoint::InRead => Some(world.lock().expect("lock").read_started.clone()),
                _ => None,
            };
            if let Some(signal) = signal {
                // Wait (bounded) for the call to start, then crash somewhere inside it.
                let started = signal.notified();
                let _ = tokio::time::timeout(Duration::from_secs(30), started).await;
                let d = with(world, |w| w.ms(0, 40));
                sleep(d).await;
            }
            crash(node, parts, world, *down_ms).await
        }
        Command::Restart => {
            parts.watchers.down(&node.agent, true);
            let _ = node.stop.send(true);
            let _ = node.reconciler.await;
            drop(node.agent);
            with(world, |w| w.log("agent: stopped cleanly"));
            parts.start(world).await
        }
        Command::ClockStep { by_ms, in_apply } => {
            super::clock_steps::step(world, *by_ms, *in_apply).await;
            node
        }
        Command::Faults(on) => {
            with(world, |w| w.faults = *on);
            node
        }
        // With the SM host, OpenSM restarts (it reads the file again) and the SM host keeps
        // the node's generation (another writer of the node's id is not modelled).
        Command::SmRestart { .. } if parts.sm_host.is_some() => {
            super::model_opensm::restart(world);
            node
        }
        Command::GenerationConflict if parts.sm_host.is_some() => {
            with(world, |w| {
                w.log("sm: generation conflict skipped (SM host)")
            });
            node
        }
        // UFM keeps its partitions over a restart and has no generations.
        Command::SmRestart { .. } if parts.ufm.is_some() => {
            super::model_ufm::restart(world);
            node
        }
        Command::GenerationConflict if parts.ufm.is_some() => {
            with(world, |w| {
                w.log("ufm: generation conflict skipped (UFM has none)")
            });
            node
        }
        Command::SmRestart { keep_state } => {
            sm_restart(world, *keep_state);
            node
        }
        Command::GenerationConflict => {
            generation_conflict(world);
            node
        }
        Command::PortDown(p) => {
            port_down(world, *p);
            node
        }
        Command::PortUp(p) => {
            port_up(world, *p);
            node
        }
        Command::Snapshot { in_apply } => {
            if *in_apply {
                // Wait (bounded) for the next apply to start, then copy somewhere inside it:
                // its generation reserved and sent, its outcome not yet recorded.
                let started = world.lock().expect("lock").apply_started.clone();
                let hit = tokio::time::timeout(Duration::from_secs(30), started.notified()).await;
                let d = with(world, |w| {
                    if hit.is_ok() {
                        w.log("agent: an apply started");
                    }
                    w.ms(0, 40)
                });
                sleep(d).await;
            }
            if let Some(disk) = &parts.node_disk {
                disk.snapshot(&parts.store.lock().expect("store lock").clone(), world);
            }
            if let Some(host) = &parts.sm_host {
                host.snapshot(world);
            }
            node
        }
        Command::StoreRollback { down_ms, whole } => {
            let Some(disk) = &parts.node_disk else {
                return node;
            };
            kill(node, parts).await;
            parts.watchers.released().await;
            with(world, |w| w.log("agent: CRASHED, its store is put back"));
            let lost = disk.roll_back(&parts.store, world, *whole);
            sleep(Duration::from_millis(*down_ms)).await;
            if *whole {
                super::rollback::generations_from_here(world);
            }
            let node = parts.start(world).await;
            super::rollback::resync(&node.agent, world, lost).await;
            node
        }
        Command::SmHostCrash { down_ms, restore } => {
            if let Some(host) = &parts.sm_host {
                host.crash_and_restart(world, *down_ms, *restore).await;
            }
            node
        }
    }
}

async fn attach(
    agent: &Agent,
    world: &Shared,
    instance: usize,
    partition: usize,
    membership: Membership,
    port: Option<usize>,
) -> Option<(u32, u64)> {
    let name = instance_name(instance);
    let request = attach_request(&name, partition, membership, port);
    let call = AttachCall::start(agent, &name);
    let (limit, wait) = command_crash(world);
    let r = run_command(agent.attach(request, wait), limit).await;
    call.answered(agent, world, &r);
    limit
}

/// The crash armed for this command (its poll, how long the agent stays down), and the wait
/// the command then asks for (its outcome: more await points to crash at).
fn command_crash(world: &Shared) -> (Option<(u32, u64)>, Option<Duration>) {
    let limit = world.lock().expect("world lock").command_crash.take();
    (limit, limit.map(|_| Duration::from_secs(10)))
}

/// Runs a command, cut at its poll `limit` when a crash is armed (`None`: cut short).
async fn run_command<F: std::future::Future>(
    fut: F,
    limit: Option<(u32, u64)>,
) -> Option<F::Output> {
    match limit {
        Some((n, _)) => super::crash::poll_limited(fut, n).await,
        None => Some(fut.await),
    }
}

/// The crash armed for a command lands once it returned or was cut short.
async fn crash_after_command(
    node: Node,
    parts: &Parts,
    world: &Shared,
    limit: Option<(u32, u64)>,
) -> Node {
    match limit {
        Some((_, down_ms)) => crash(node, parts, world, down_ms).await,
        None => node,
    }
}

/// Kills the agent where it is: its streams cut, its reconciler aborted, the agent dropped.
async fn kill(node: Node, parts: &Parts) {
    parts.watchers.down(&node.agent, false);
    node.reconciler.abort();
    let _ = node.reconciler.await;
    drop((node.agent, node.stop));
}

/// Kills the agent where it is (its reconciler aborted, the agent dropped), keeps it down for
/// `down_ms` and starts it again from the same store.
async fn crash(node: Node, parts: &Parts, world: &Shared, down_ms: u64) -> Node {
    kill(node, parts).await;
    with(world, |w| w.log("agent: CRASHED"));
    sleep(Duration::from_millis(down_ms)).await;
    parts.start(world).await
}

fn heal(world: &Shared) {
    with(world, |w| {
        w.faults = false;
        w.log("heal: faults off, every port UP");
    });
    for p in 0..PORTS {
        port_up(world, p);
    }
}

/// How far past the converged state the run waits for RELEASED attachments to be pruned (a
/// retain longer than this is not waited for).
const PRUNE_HORIZON: Duration = Duration::from_secs(15 * 60);
/// How late after its retain is over a RELEASED attachment may still be stored: the
/// reconciler prunes between its steps, so an apply in flight (capped at 60 s) and a slow port
/// read may hold it up.
const PRUNE_SLACK: Duration = Duration::from_secs(70);

/// Waits until the last RELEASED attachment's retain (within [`PRUNE_HORIZON`]) is over, plus
/// [`PRUNE_SLACK`], and checks the agent pruned every one that was due.
async fn prunes_happen(world: &Shared) {
    let due = world
        .lock()
        .expect("world lock")
        .oracle
        .last_prune_due(PRUNE_HORIZON);
    if let Some(due) = due {
        sleep_until(due + PRUNE_SLACK).await;
    }
    with(world, |w| {
        let now = w.now_ms();
        w.oracle.check_pruned(PRUNE_SLACK, now)
    });
}

/// Waits until every attachment is ACTIVE or RELEASED as asked, nothing is in flight to the
/// SM, and that held for [`STABLE_FOR`]; records a liveness finding past [`LIVENESS_BOUND`].
async fn converge(world: &Shared, agent: &Agent) {
    let deadline = Instant::now() + LIVENESS_BOUND;
    let mut stable_since: Option<Instant> = None;
    loop {
        sleep(Duration::from_secs(1)).await;
        if failed(world) {
            return;
        }
        // The control plane resynchronises on a new log epoch: one restarted on the fabric
        // side's newer generation (seen at an apply, not at a command) withholds restored
        // attachments until it sends their attach again.
        super::rollback::resync(agent, world, Vec::new()).await;
        let (lagging, in_flight) = {
            let mut w = world.lock().expect("world lock");
            w.check();
            (
                w.oracle.unconverged(),
                w.fabric.in_flight.len() + w.fabric.ufm_adds.len() + w.sweeps_pending as usize,
            )
        };
        if lagging.is_none() && in_flight == 0 {
            let since = *stable_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STABLE_FOR {
                return;
            }
        } else {
            stable_since = None;
        }
        if Instant::now() >= deadline {
            with(world, |w| {
                let now = w.now_ms();
                let what = format!(
                    "liveness: {} s after the faults were healed, not converged: {}",
                    LIVENESS_BOUND.as_secs(),
                    lagging.unwrap_or_else(|| {
                        format!("{in_flight} requests or port sweeps still pending")
                    })
                );
                w.oracle
                    .finding
                    .get_or_insert(format!("at t={now} ms: {what}"));
            });
            return;
        }
    }
}
