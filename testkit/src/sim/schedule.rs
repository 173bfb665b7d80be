//! The schedule: the commands a run issues and when, drawn up front from the seed.

use fabric_agent::domain::Membership;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;

/// The partitions a run attaches to: (id, name, P_Key base).
pub const PARTITIONS: [(&str, &str, u16); 4] = [
    ("ibpart_p0", "p0", 0x0012),
    ("ibpart_p1", "p1", 0x0034),
    ("ibpart_p2", "p2", 0x0056),
    ("ibpart_p3", "p3", 0x0078),
];

/// The fabric every partition and the node are on.
pub const FABRIC: &str = "fab1";

/// Model fabric ports of the node.
pub const PORTS: usize = 2;

/// Where a crash lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// At the scheduled instant, whatever the agent is doing.
    Now,
    /// Inside the next apply (after the request left, before or after it landed).
    InApply,
    /// Inside the next port read.
    InRead,
    /// Inside the next apply, exactly at its `n`-th poll (1: before the backend ran at all;
    /// past the apply's last await: after it returned, before the reconciler saw its answer).
    ApplyPoll(u32),
    /// Inside the next attach or release command (which then waits for its outcome), at its
    /// `n`-th poll; a command done sooner is acknowledged and the crash follows at once.
    CommandPoll(u32),
}

/// One command of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Attach instance `i<instance>` to a partition.
    Attach {
        /// Instance number.
        instance: usize,
        /// Index into [`PARTITIONS`].
        partition: usize,
        /// Full or limited.
        membership: Membership,
        /// The one model port the instance names (a partial-node instance), or None for the
        /// whole node.
        port: Option<usize>,
    },
    /// Release instance `i<instance>`.
    Release {
        /// Instance number.
        instance: usize,
    },
    /// Kill the agent (drop it, abort its reconciler) and start it again from the same store.
    Crash {
        /// When within the agent's work.
        at: CrashPoint,
        /// How long the node stays down, ms.
        down_ms: u64,
    },
    /// Stop the agent cleanly (shutdown signal, wait for the reconciler) and start it again.
    Restart,
    /// Turn the model's random faults on or off.
    Faults(bool),
    /// The subnet manager restarts, keeping or forgetting this node's set.
    SmRestart {
        /// Whether the SM keeps its state.
        keep_state: bool,
    },
    /// The subnet manager's stored generation for the node jumps ahead (another writer, a
    /// restored backup): the node must move past it.
    GenerationConflict,
    /// A fabric port goes DOWN (its table counts as empty).
    PortDown(usize),
    /// A fabric port comes back UP, reprogrammed by the SM from its config.
    PortUp(usize),
    /// A backup: the node's database file is copied (and, with the SM host, its store's
    /// database file and the partitions file).
    Snapshot,
    /// The node's store is put back from the last snapshot: the agent crashes, the copied
    /// database file replaces the live one (its side file stays as the live agent left it, as
    /// a restore from a backup leaves it), and the agent starts again after `down_ms`.
    StoreRollback {
        /// How long the node stays down, ms.
        down_ms: u64,
    },
    /// The SM host's agent crashes (its backend is shut down where it stands, the requests it
    /// was handling are lost) and a new one starts after `down_ms` on the same partitions file
    /// and store, or on what `restore` put back meanwhile.
    SmHostCrash {
        /// How long the SM host's agent stays down, ms (the node's applies fail meanwhile).
        down_ms: u64,
        /// What is put back from the last snapshot while it is down.
        restore: SmHostRestore,
    },
    /// Attach and release commands in flight at once on the same agent
    /// (`super::concurrent`).
    Together {
        /// The commands (attaches and releases only).
        commands: Vec<Command>,
        /// How long each command waits for its outcome, ms (0: it answers once durable).
        wait_ms: u64,
        /// The agent crashes at this poll of the group (then stays down this long, ms), like
        /// [`CrashPoint::CommandPoll`]; commands answered by then count as acknowledged.
        crash: Option<(u32, u64)>,
        /// Seeds the order in which the group's commands are polled, at every poll.
        order: u64,
    },
}

/// What an SM host's restore from a backup puts back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmHostRestore {
    /// Nothing: a crash and a restart.
    Nothing,
    /// The store's database file (its side file stays); the partitions file stays as OpenSM
    /// last read it.
    Store,
    /// The store's database file and the partitions file (OpenSM reads the old file at its
    /// next heavy sweep).
    StoreAndFile,
}

/// A command at a simulated instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Milliseconds after the start of the run.
    pub at_ms: u64,
    /// What happens.
    pub command: Command,
}

/// A seeded schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// Steps in time order.
    pub steps: Vec<Step>,
    /// The observer's fast poll, ms.
    pub fast_poll_ms: u64,
    /// Whether the observer is woken by table changes (traps) or only polls.
    pub push_changes: bool,
    /// Applies go through the real SM-host backend and a model OpenSM.
    pub opensm: bool,
    /// Applies go through the real UFM backend to a model UFM.
    pub ufm: bool,
    /// The UFM backend's late-write window, when not the simulation's default.
    pub ufm_late_window_ms: Option<u64>,
    /// Pruning (released attachments, old events) and the WatchEvents consumers.
    pub retention: Retention,
}

/// The longest `released_retain` a run draws: nothing is pruned within a run.
pub const LONG_RELEASED_RETAIN_MS: u64 = 3650 * 86_400_000;

/// What a run prunes and who follows the event log, drawn from a stream of its own (so a
/// seed's commands and instants are those it had without them).
#[derive(Debug, Clone)]
pub struct Retention {
    /// The agent's `released_retain`, ms of simulated time.
    pub released_retain_ms: u64,
    /// The store's event retention (`u64::MAX`: every event kept).
    pub event_retain: u64,
    /// The WatchEvents consumers inside the schedule.
    pub watchers: Vec<super::watcher::WatcherPlan>,
}

/// Draws a seed's [`Retention`].
pub fn draw_retention(seed: u64) -> Retention {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9E7A_1E55_0000_0002);
    let released_retain_ms = match rng.random_range(0..20) {
        0..=9 => rng.random_range(5_000..30_000),
        10..=16 => rng.random_range(30_000..600_000),
        _ => LONG_RELEASED_RETAIN_MS,
    };
    let event_retain = match rng.random_range(0..10) {
        0..=4 => rng.random_range(20..60),
        5..=7 => rng.random_range(60..=500),
        _ => u64::MAX,
    };
    let watchers = super::watcher::draw_plans(&mut rng);
    Retention {
        released_retain_ms,
        event_retain,
        watchers,
    }
}

/// Options of the schedule generator.
#[derive(Debug, Clone, Copy, Default)]
pub struct GenOptions {
    /// Let two instances of one partition ask for different memberships.
    pub mixed_membership: bool,
    /// Apply through the real SM-host backend and a model OpenSM instead of the model SM.
    pub opensm: bool,
    /// Apply through the real UFM backend (`UfmSm`) to a model UFM instead of the model SM.
    pub ufm: bool,
    /// The UFM backend's late-write window (default `model_ufm::LATE_WINDOW_MS`); a window
    /// shorter than the model UFM's lateness shows what the watch is for.
    pub ufm_late_window_ms: Option<u64>,
}

/// Draws a schedule from `seed`.
pub fn generate(seed: u64, options: GenOptions) -> Schedule {
    let mut rng = StdRng::seed_from_u64(seed);
    let fast_poll_ms = match rng.random_range(0..10) {
        0 => 50,
        1..=5 => 200,
        _ => 1000,
    };
    let push_changes = rng.random_bool(0.5);
    let memberships: Vec<Membership> = (0..PARTITIONS.len())
        .map(|_| {
            if rng.random_bool(0.5) {
                Membership::Full
            } else {
                Membership::Limited
            }
        })
        .collect();
    // Crashes at await points are drawn from a stream of their own, so the commands and their
    // instants stay those of the same seed without them.
    let mut crash_rng = StdRng::seed_from_u64(seed ^ 0xC4A5_4A7F_0000_0001);
    let n = rng.random_range(6..=24);
    let mut t = 0u64;
    let mut steps = Vec::with_capacity(n);
    // (partition, membership, port) per instance, and which are released in the schedule.
    let mut instances: Vec<(usize, Membership, Option<usize>)> = Vec::new();
    let mut released: Vec<bool> = Vec::new();
    let mut down = [false; PORTS];
    for _ in 0..n {
        t += match rng.random_range(0..20) {
            0..=9 => rng.random_range(0..250),
            10..=15 => rng.random_range(250..3_000),
            16..=18 => rng.random_range(3_000..20_000),
            _ => rng.random_range(20_000..60_000),
        };
        let live: Vec<usize> = (0..instances.len()).filter(|i| !released[*i]).collect();
        let command = match rng.random_range(0..100) {
            0..=29 => {
                let partition = rng.random_range(0..PARTITIONS.len());
                let membership = if options.mixed_membership && rng.random_bool(0.5) {
                    memberships[partition].flip()
                } else {
                    memberships[partition]
                };
                // Whole node or one named port: disjoint and overlapping port sets both occur.
                let port = match rng.random_range(0..3) {
                    0 => None,
                    _ => Some(rng.random_range(0..PORTS)),
                };
                instances.push((partition, membership, port));
                released.push(false);
                Command::Attach {
                    instance: instances.len() - 1,
                    partition,
                    membership,
                    port,
                }
            }
            30..=32 if !instances.is_empty() => {
                // An idempotent re-send of an earlier attach.
                let instance = rng.random_range(0..instances.len());
                let (partition, membership, port) = instances[instance];
                Command::Attach {
                    instance,
                    partition,
                    membership,
                    port,
                }
            }
            33..=54 if !live.is_empty() => {
                let instance = live[rng.random_range(0..live.len())];
                released[instance] = true;
                Command::Release { instance }
            }
            55..=56 => Command::Release {
                // Unknown instance (NotFound) or a repeated release.
                instance: rng.random_range(0..instances.len() + 1),
            },
            57..=68 => Command::Crash {
                at: match rng.random_range(0..3) {
                    0 if crash_rng.random_bool(0.4) => {
                        CrashPoint::CommandPoll(crash_rng.random_range(1..=6))
                    }
                    0 => CrashPoint::Now,
                    1 if crash_rng.random_bool(0.6) => {
                        CrashPoint::ApplyPoll(crash_rng.random_range(1..=24))
                    }
                    1 => CrashPoint::InApply,
                    _ => CrashPoint::InRead,
                },
                down_ms: if rng.random_bool(0.5) {
                    0
                } else {
                    rng.random_range(1..3_000)
                },
            },
            69..=70 => Command::Restart,
            71..=80 => Command::Faults(rng.random_bool(0.7)),
            81..=84 => Command::SmRestart {
                keep_state: rng.random_bool(0.5),
            },
            85..=87 => Command::GenerationConflict,
            88..=93 => {
                let p = rng.random_range(0..PORTS);
                if down[p] {
                    down[p] = false;
                    Command::PortUp(p)
                } else {
                    down[p] = true;
                    Command::PortDown(p)
                }
            }
            _ => Command::Faults(true),
        };
        steps.push(Step { at_ms: t, command });
    }
    super::rollback::draw(seed, options, &mut steps);
    super::concurrent::draw(seed, &mut steps, options.mixed_membership);
    Schedule {
        seed,
        steps,
        opensm: options.opensm,
        ufm: options.ufm,
        ufm_late_window_ms: options.ufm_late_window_ms,
        fast_poll_ms,
        push_changes,
        retention: draw_retention(seed),
    }
}

trait Flip {
    fn flip(self) -> Self;
}

impl Flip for Membership {
    fn flip(self) -> Membership {
        match self {
            Membership::Full => Membership::Limited,
            Membership::Limited => Membership::Full,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Attach {
                instance,
                partition,
                membership,
                port,
            } => {
                let (id, _, base) = PARTITIONS[*partition];
                let on = port.map_or("every port".to_owned(), |p| format!("port {p}"));
                write!(
                    f,
                    "attach i{instance} -> {id} ({base:#06x} {membership}) on {on}"
                )
            }
            Command::Release { instance } => write!(f, "release i{instance}"),
            Command::Crash { at, down_ms } => {
                let at = match at {
                    CrashPoint::Now => "now".to_owned(),
                    CrashPoint::InApply => "inside the next apply".to_owned(),
                    CrashPoint::InRead => "inside the next port read".to_owned(),
                    CrashPoint::ApplyPoll(n) => format!("at poll {n} of the next apply"),
                    CrashPoint::CommandPoll(n) => format!("at poll {n} of the next command"),
                };
                write!(f, "agent crash ({at}), down {down_ms} ms, restart")
            }
            Command::Restart => write!(f, "agent clean restart"),
            Command::Faults(on) => write!(f, "faults {}", if *on { "on" } else { "off" }),
            Command::SmRestart { keep_state } => write!(
                f,
                "SM restart {}",
                if *keep_state {
                    "keeping its state"
                } else {
                    "forgetting the node"
                }
            ),
            Command::GenerationConflict => write!(f, "SM generation conflict"),
            Command::PortDown(p) => write!(f, "port {p} DOWN"),
            Command::PortUp(p) => write!(f, "port {p} UP"),
            Command::Snapshot => write!(f, "snapshot of the stores (a backup)"),
            Command::StoreRollback { down_ms } => write!(
                f,
                "node store rolled back to the snapshot (agent crash, down {down_ms} ms, restart)"
            ),
            Command::SmHostCrash { down_ms, restore } => {
                let what = match restore {
                    SmHostRestore::Nothing => "",
                    SmHostRestore::Store => ", its store put back to the snapshot",
                    SmHostRestore::StoreAndFile => {
                        ", its store and the partitions file put back to the snapshot"
                    }
                };
                write!(f, "SM-host agent crash, down {down_ms} ms{what}, restart")
            }
            Command::Together {
                commands,
                wait_ms,
                crash,
                order,
            } => {
                write!(f, "together (polled in order {order:#x}")?;
                if *wait_ms > 0 {
                    write!(f, ", each waits {wait_ms} ms for its outcome")?;
                }
                if let Some((n, down_ms)) = crash {
                    write!(f, ", agent crash at poll {n}, down {down_ms} ms, restart")?;
                }
                let list: Vec<String> = commands.iter().map(ToString::to_string).collect();
                write!(f, "): [{}]", list.join("; "))
            }
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "schedule of seed {} (observer fast poll {} ms, change push {}{}):",
            self.seed,
            self.fast_poll_ms,
            if self.push_changes { "on" } else { "off" },
            if self.opensm {
                ", the real SM-host backend and a model OpenSM"
            } else if self.ufm {
                ", the real UFM backend and a model UFM"
            } else {
                ""
            }
        )?;
        let r = &self.retention;
        writeln!(
            f,
            "  released attachments kept {}, events kept {}",
            if r.released_retain_ms == LONG_RELEASED_RETAIN_MS {
                "10 years".to_owned()
            } else {
                format!("{} ms", r.released_retain_ms)
            },
            if r.event_retain == u64::MAX {
                "all".to_owned()
            } else {
                format!("the newest {}", r.event_retain)
            }
        )?;
        for (i, w) in r.watchers.iter().enumerate() {
            writeln!(f, "  watcher w{i}: {w}")?;
        }
        for s in &self.steps {
            writeln!(f, "  t={:>7} ms  {}", s.at_ms, s.command)?;
        }
        Ok(())
    }
}
