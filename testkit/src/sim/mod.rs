//! A deterministic simulation of the agent's reconciler: the real agent (store, commands,
//! reconciler) against a model subnet manager and a model port observer, on one current-thread
//! runtime with paused time, every random choice drawn from one seed. An oracle checks the
//! agent's durable event log against the model's truth at every change of the world.
//!
//! With `GenOptions::opensm` the node applies through a model network to the real SM-host
//! backend (`OpenSmBackend`) in front of a model OpenSM process (`model_opensm`); with
//! `GenOptions::ufm` through the real UFM backend (`UfmSm`) to a model UFM (`model_ufm`).
//!
//! Pruning runs on simulated time with a seeded `released_retain` and event retention, judged
//! by the oracle and a probe (`prune_probe`); seeded WatchEvents consumers (`watcher`) follow
//! the agent's real event stream across its crashes and restarts and check every event.
//!
//! Used by `tests/simulation` (CI) and `examples/simulate.rs` (long runs, replays).
//!
//! Layers, each importing only from those below it (no module imports one above it):
//! - `core`: shared data, no behaviour of the run (the fabric's truth, keys, constants, the
//!   SM host's and the model UFM's state, the schedule's types).
//! - `oracle`: the checker, reading the fabric's truth and the agent's store.
//! - `world`: `World` (truth, RNG, trace, oracle) behind one lock, and `with`.
//! - the models and what they drive: `model_sm`, `model_ports`, `model_opensm` (with
//!   `sm_host_disk` below it and `sm_host_restart` above it), `model_ufm`, `crash`, and the
//!   schedule's features `rollback`, `concurrent`, `clock_steps`, `watcher` (with
//!   `prune_probe`).
//! - `schedule`: the generator (draws a `core::plan::Schedule`, asking the features for their
//!   parts).
//! - `run`: the driver of one seed.

pub mod clock_steps;
pub mod concurrent;
pub mod core;
pub mod crash;
pub mod model_opensm;
pub mod model_ports;
pub mod model_sm;
pub mod model_ufm;
pub mod oracle;
pub mod prune_probe;
pub mod rollback;
pub mod run;
pub mod schedule;
pub mod sm_host_disk;
pub mod sm_host_restart;
pub mod watcher;
pub mod world;

pub use self::core::plan::GenOptions;
pub use run::{run_seed, Outcome};

/// A failing seed's report: the finding, the schedule, the trace (its last `tail` lines, or
/// all) and how to replay it.
pub fn report(o: &Outcome, tail: Option<usize>) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "SIMULATION FAILURE, seed {}\nfinding: {}\n\n{}\n",
        o.schedule.seed,
        o.finding.as_deref().unwrap_or("none"),
        o.schedule
    ));
    let skip = tail.map_or(0, |n| o.trace.len().saturating_sub(n));
    s.push_str(&format!(
        "trace ({} of {} lines):\n",
        o.trace.len() - skip,
        o.trace.len()
    ));
    for line in &o.trace[skip..] {
        s.push_str("  ");
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!(
        "replay: cargo run --release --example simulate -- --seed {}\n",
        o.schedule.seed
    ));
    s
}
