//! A seeded schedule ([`Schedule`]): its steps, the observer's settings, the backend it applies
//! through, what it prunes and who follows the event log; and the generator's options.
//! `sim::schedule` draws one.

use super::command::Step;
use super::watcher_plan::WatcherPlan;
use std::fmt;

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
    /// The model UFM link reads the stepped wall clock at every call (a rule switched off:
    /// `GenOptions::ufm_unsteady_clock`).
    pub ufm_unsteady_clock: bool,
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
    pub watchers: Vec<WatcherPlan>,
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
    /// Switches a rule off to show the clock steps catch it: the model UFM link reads the
    /// node's stepped wall clock at every call instead of modelling the production steady
    /// clock (also set by `FABRIC_SIM_UFM_UNSTEADY_CLOCK`, `model_ufm`).
    pub ufm_unsteady_clock: bool,
    /// Every schedule puts the node's whole state directory back (database and side file)
    /// from a snapshot of the running node (not with `ufm`: nothing there could show it).
    pub whole_dir: bool,
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
