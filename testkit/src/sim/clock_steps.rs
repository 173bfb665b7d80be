//! Wall-clock steps inside a schedule ([`Command::ClockStep`]): the node's wall clock
//! (`core::wall::Wall`) jumps an hour forward or back while the runtime's monotonic clock runs
//! on, as an NTP correction or an operator's `date` does. Every wall reading of the simulated
//! node follows production: the agent's clock (production `SystemClock`) reads the stepped
//! wall at every call; the UFM backend's link models the production steady clock (the wall
//! read once per agent life, then advanced by the monotonic clock), so within one life a step
//! changes no late-write window, and across a restart the backend re-arms its watches
//! (`src/sm/ufm/ledger_io.rs`, "Watches across restarts").
//!
//! Steps are drawn where a watch may stand: inside an apply (during its retries), just before
//! an agent crash or restart (across it), and at seeded instants. They are drawn from a stream
//! of their own ([`draw`]), so the rest of a seed's schedule is the one it has without them.
//! Not with the SM host (`--opensm`): its backend's clocks are not modelled here.

use super::core::command::{Command, Step};
use super::core::plan::GenOptions;
use super::world::{with, Shared};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// How far a step goes, ms.
pub const STEP_MS: i64 = 3_600_000;

/// One seed in this many has no clock step.
const CALM_ONE_IN: u32 = 4;

/// Adds the seed's clock steps to `steps` (kept in time order).
pub fn draw(seed: u64, options: GenOptions, steps: &mut Vec<Step>) {
    if options.opensm {
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC10C_57E9_0000_0001);
    if rng.random_ratio(1, CALM_ONE_IN) {
        return;
    }
    let by = |rng: &mut StdRng| {
        if rng.random_bool(0.5) {
            STEP_MS
        } else {
            -STEP_MS
        }
    };
    let end = steps.last().map_or(0, |s| s.at_ms) + 5_000;
    let mut extra: Vec<(u64, Command)> = Vec::new();
    // Across a restart: just before a crash or a clean restart of the agent.
    for s in steps.iter() {
        let restart = matches!(
            s.command,
            Command::Crash { .. } | Command::Restart | Command::StoreRollback { .. }
        );
        if restart && rng.random_bool(0.35) {
            let by_ms = by(&mut rng);
            extra.push((
                s.at_ms,
                Command::ClockStep {
                    by_ms,
                    in_apply: false,
                },
            ));
        }
    }
    // Inside an apply, or at a seeded instant.
    for _ in 0..rng.random_range(1..=2) {
        let at = rng.random_range(0..end);
        let by_ms = by(&mut rng);
        let in_apply = rng.random_bool(0.6);
        extra.push((at, Command::ClockStep { by_ms, in_apply }));
    }
    extra.sort_by_key(|(at, _)| *at);
    for (at_ms, command) in extra {
        // Before the steps at the same instant: a step drawn for a crash lands before it.
        let i = steps.partition_point(|s| s.at_ms < at_ms);
        steps.insert(i, Step { at_ms, command });
    }
}

/// Steps the node's wall clock by `by_ms`, at once or a few seconds into the next apply
/// (waiting for one at most 30 s).
pub async fn step(world: &Shared, by_ms: i64, in_apply: bool) {
    if in_apply {
        let started = world.lock().expect("world lock").apply_started.clone();
        let hit = tokio::time::timeout(Duration::from_secs(30), started.notified()).await;
        let d = with(world, |w| {
            if hit.is_ok() {
                w.log("agent: an apply started");
            }
            w.ms(0, 20_000)
        });
        tokio::time::sleep(d).await;
    }
    with(world, |w| {
        // Check 9 judges what was pruned so far on the clock as it read until now.
        let now = w.now_ms();
        w.oracle.check_durable(now);
        w.wall.step(by_ms);
        let offset = w.wall.offset_ms();
        w.log(format!(
            "clock: the node's wall clock steps {by_ms:+} ms (now {offset:+} ms off the simulated time)"
        ));
    });
}
