//! The campaign's faults and their seeded schedule: which fault comes next, against what, for
//! how long, and after what pause, all drawn from one seeded generator (a failing run can be
//! replayed as far as real processes allow). Every fault applied is logged with a timestamp
//! ([`FaultLog`]).

use super::history::{now_ms, Ms};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Duration;

/// A process of the campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// Node agent `i` (0-based).
    Node(usize),
    /// SM-host agent `i` (0: beside the master-by-priority OpenSM, 1: the standby's).
    SmAgent(usize),
    /// OpenSM `i` (0: priority 15, the rig's own; 1: priority 10).
    OpenSm(usize),
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL (`hard`) or SIGTERM the process, start it again after `down`.
    Kill {
        /// Whom.
        target: Target,
        /// SIGKILL rather than SIGTERM.
        hard: bool,
        /// How long it stays down.
        down: Duration,
    },
    /// SIGSTOP the process, SIGCONT it after `pause`.
    Pause {
        /// Whom.
        target: Target,
        /// How long it stays stopped.
        pause: Duration,
    },
    /// Cut the connection between node `node` and SM host `host` for `cut`.
    CutNode {
        /// The node.
        node: usize,
        /// The SM host.
        host: usize,
        /// For how long.
        cut: Duration,
    },
    /// Cut the SM hosts' agents from each other for `cut`.
    CutPeers {
        /// For how long.
        cut: Duration,
    },
    /// Drop node `node`'s link at ibsim's console (`Unlink`), restore it (`ReLink`) after `down`.
    Flap {
        /// The node.
        node: usize,
        /// How long the link stays down.
        down: Duration,
    },
    /// Copy node `node`'s state directory while it runs (frozen by SIGSTOP for the copy: a
    /// crash image); a later [`Fault::Restore`] puts it back.
    Snapshot {
        /// The node.
        node: usize,
    },
    /// Stop node `node`, put its last snapshot back, start it again.
    Restore {
        /// The node.
        node: usize,
    },
}

impl Fault {
    /// The fault's kind, for counts.
    pub fn kind(&self) -> String {
        let who = |t: &Target| match t {
            Target::Node(_) => "node-agent",
            Target::SmAgent(_) => "sm-agent",
            Target::OpenSm(_) => "opensm",
        };
        match self {
            Fault::Kill { target, hard, .. } => {
                format!(
                    "{}-{}",
                    if *hard { "sigkill" } else { "sigterm" },
                    who(target)
                )
            }
            Fault::Pause { target, .. } => format!("sigstop-{}", who(target)),
            Fault::CutNode { .. } => "cut-node-sm".into(),
            Fault::CutPeers { .. } => "cut-sm-peers".into(),
            Fault::Flap { .. } => "link-flap".into(),
            Fault::Snapshot { .. } => "state-snapshot".into(),
            Fault::Restore { .. } => "state-restore".into(),
        }
    }
}

/// The seeded schedule.
pub struct Schedule {
    rng: StdRng,
    nodes: usize,
}

impl Schedule {
    /// A schedule over `nodes` node agents, two SM hosts and two OpenSMs, from `seed`.
    pub fn new(seed: u64, nodes: usize) -> Schedule {
        Schedule {
            rng: StdRng::seed_from_u64(seed),
            nodes,
        }
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rng.random_range(lo..=hi))
    }

    /// The pause before the next fault.
    pub fn gap(&mut self) -> Duration {
        self.ms(500, 4000)
    }

    /// The next fault; `snapshot_held(node)` says whether a snapshot of that node waits to be
    /// put back.
    pub fn next(&mut self, snapshot_held: impl Fn(usize) -> bool) -> Fault {
        let node = self.rng.random_range(0..self.nodes);
        let host = self.rng.random_range(0..2);
        let target = match self.rng.random_range(0..10) {
            0..=5 => Target::Node(node),
            6..=7 => Target::SmAgent(host),
            _ => Target::OpenSm(host),
        };
        match self.rng.random_range(0..100) {
            0..=17 => {
                let hard = self.rng.random_bool(0.5);
                let down = self.ms(200, 5000);
                Fault::Kill { target, hard, down }
            }
            18..=31 => {
                let pause = self.ms(300, 4000);
                Fault::Pause { target, pause }
            }
            32..=49 => {
                let cut = self.ms(500, 8000);
                Fault::CutNode { node, host, cut }
            }
            50..=57 => {
                let cut = self.ms(500, 8000);
                Fault::CutPeers { cut }
            }
            58..=79 => {
                let down = self.ms(100, 3000);
                Fault::Flap { node, down }
            }
            _ if snapshot_held(node) => Fault::Restore { node },
            _ => Fault::Snapshot { node },
        }
    }
}

/// Every fault applied, with its time, and their counts by kind.
#[derive(Debug, Default, Clone)]
pub struct FaultLog {
    /// (time, what) lines in order.
    pub lines: Vec<(Ms, String)>,
    /// Faults by kind.
    pub counts: BTreeMap<String, u64>,
}

impl FaultLog {
    /// Logs `fault` (as applied, with `note`: e.g. a SIGKILL turned into a SIGTERM) now.
    pub fn applied(&mut self, fault: &Fault, kind: &str, note: &str) {
        let line = format!("{fault:?}{note}");
        eprintln!("chaos: {} fault {kind}: {line}", now_ms());
        self.lines.push((now_ms(), line));
        *self.counts.entry(kind.to_owned()).or_default() += 1;
    }

    /// Logs a line that is not a fault (a recovery, the end of a fault) now.
    pub fn note(&mut self, line: &str) {
        eprintln!("chaos: {} {line}", now_ms());
        self.lines.push((now_ms(), line.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_schedule() {
        let draw = |seed| {
            let mut s = Schedule::new(seed, 6);
            (0..200)
                .map(|_| (s.next(|n| n % 2 == 0), s.gap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let kinds: std::collections::BTreeSet<String> =
            draw(7).iter().map(|(f, _)| f.kind()).collect();
        // 200 draws reach every kind.
        for k in [
            "sigkill-node-agent",
            "sigterm-sm-agent",
            "sigstop-opensm",
            "cut-node-sm",
            "cut-sm-peers",
            "link-flap",
            "state-snapshot",
            "state-restore",
        ] {
            assert!(kinds.contains(k), "{k} missing from {kinds:?}");
        }
    }
}
