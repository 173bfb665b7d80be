//! A schedule's commands ([`Command`], at a simulated instant a [`Step`]), how they print, and
//! where a crash lands.

use super::constants::PARTITIONS;
use fabric_agent::domain::Membership;
use std::fmt;

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
    /// A backup: the node's database file and its side file are copied (and, with the SM
    /// host, its store's database file and the partitions file).
    Snapshot {
        /// Taken inside the next apply of the node (a few ms after it started: after its
        /// generation was reserved and sent, before its outcome is recorded) rather than at
        /// once.
        in_apply: bool,
    },
    /// The node's store is put back from the last snapshot: the agent crashes, the copied
    /// database file replaces the live one, and the agent starts again after `down_ms`.
    StoreRollback {
        /// How long the node stays down, ms.
        down_ms: u64,
        /// The whole state directory goes back: the side file (`state.redb.mirror`) too, so
        /// the store cannot see the rollback at its open (a reverted VM). Otherwise the side
        /// file stays as the live agent left it, as a restore of the database file leaves it.
        whole: bool,
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
    /// The node's wall clock steps by `by_ms` (+1 h or -1 h: an NTP correction, an operator's
    /// `date`), `sim::clock_steps`. The runtime's monotonic clock does not move.
    ClockStep {
        /// How far, ms (negative: back).
        by_ms: i64,
        /// Inside the next apply (a few seconds after it started: during its retries) rather
        /// than at once.
        in_apply: bool,
    },
    /// Attach and release commands in flight at once on the same agent
    /// (`sim::concurrent`).
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
            Command::Snapshot { in_apply: false } => write!(f, "snapshot of the stores (a backup)"),
            Command::Snapshot { in_apply: true } => {
                write!(f, "snapshot of the stores (a backup) inside the next apply")
            }
            Command::StoreRollback {
                down_ms,
                whole: false,
            } => write!(
                f,
                "node store rolled back to the snapshot (agent crash, down {down_ms} ms, restart)"
            ),
            Command::StoreRollback {
                down_ms,
                whole: true,
            } => write!(
                f,
                "node's whole state directory (database and mirror) put back to the snapshot \
                 (agent crash, down {down_ms} ms, restart)"
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
            Command::ClockStep { by_ms, in_apply } => write!(
                f,
                "node wall clock steps {}{} ms{}",
                if *by_ms >= 0 { "+" } else { "" },
                by_ms,
                if *in_apply {
                    " inside the next apply"
                } else {
                    ""
                }
            ),
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
