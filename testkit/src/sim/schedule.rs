//! The schedule generator: the commands a run issues and when, drawn up front from the seed
//! (the types are in `core::command` and `core::plan`; the rollbacks, concurrent groups and
//! watchers draw their own parts, each from a stream of its own).

use super::core::command::{Command, CrashPoint, Step};
use super::core::constants::{PARTITIONS, PORTS};
use super::core::plan::{GenOptions, Retention, Schedule, LONG_RELEASED_RETAIN_MS};
use fabric_agent::domain::Membership;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    super::clock_steps::draw(seed, options, &mut steps);
    Schedule {
        seed,
        steps,
        opensm: options.opensm,
        ufm: options.ufm,
        ufm_late_window_ms: options.ufm_late_window_ms,
        ufm_unsteady_clock: options.ufm_unsteady_clock,
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
