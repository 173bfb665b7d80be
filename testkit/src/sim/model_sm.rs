//! The model subnet manager, plugged into the agent through [`SubnetManager`].
//!
//! An apply is a request sent over a network: it lands on the SM after a delay (in a task of
//! its own, so it still lands when the agent gave up waiting, timed out or crashed) and the
//! reply comes back after another delay, or never. The SM takes a set unless its generation is
//! older than the one it holds (fencing), then programs the ports toward its config later, port
//! by port. What it answered and what it did are kept apart: the oracle judges what it did.

use super::core::fabric::Request;
use super::core::keys::{keys_of, show_keys};
use super::world::{with, Shared, World};
use async_trait::async_trait;
use fabric_agent::domain::{NodeId, NodeMemberships};
use fabric_agent::sm::{
    ApplyOutcome, HostStoredSet, InjectedFault, SmError, SmFailure, StoredSetAnswer, SubnetManager,
};
use rand::Rng;
use std::time::Duration;
use tokio::sync::oneshot;

/// The model SM.
pub struct ModelSm {
    world: Shared,
}

enum Fate {
    /// Fails without any effect on the SM.
    NoEffect(SmError, Duration),
    /// Reaches the SM after `deliver`; the reply takes `reply` more, or is lost.
    Deliver {
        deliver: Duration,
        reply: Duration,
        reply_lost: bool,
    },
}

impl ModelSm {
    /// The SM of `world`.
    pub fn new(world: Shared) -> ModelSm {
        ModelSm { world }
    }
}

#[async_trait]
impl SubnetManager for ModelSm {
    fn backend(&self) -> &'static str {
        "model"
    }

    /// What the model SM stores for the node: the start check runs in the simulation.
    async fn stored_sets(&self, _node: &NodeId) -> Option<Vec<HostStoredSet>> {
        let answer = with(&self.world, |w| match &w.fabric.sm.stored_set {
            Some(set) => StoredSetAnswer::Stored(w.fabric.sm.stored_generation, set.clone()),
            None => StoredSetAnswer::NotStored,
        });
        Some(vec![HostStoredSet {
            host: "model-sm".into(),
            answer,
        }])
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let keys = keys_of(desired);
        let (fate, id) = with(&self.world, |w| {
            w.note_apply(generation);
            let fate = choose_fate(w);
            let id = w.next_request;
            w.next_request += 1;
            let what = match &fate {
                Fate::NoEffect(e, _) => format!("fails without effect: {e}"),
                Fate::Deliver {
                    deliver,
                    reply_lost,
                    ..
                } => format!(
                    "lands in {} ms{}",
                    deliver.as_millis(),
                    if *reply_lost {
                        ", its reply will be lost"
                    } else {
                        ""
                    }
                ),
            };
            w.log(format!(
                "agent: apply #{id} generation {generation} keys {} -> {what}",
                show_keys(&keys)
            ));
            if let Fate::Deliver { .. } = fate {
                let r = Request {
                    generation,
                    epoch: w.fabric.sm.epoch,
                    keys: keys.clone(),
                    set: Some(desired.clone()),
                };
                w.fabric.in_flight.insert(id, r);
            }
            w.apply_started.notify_waiters();
            (fate, id)
        });
        match fate {
            Fate::NoEffect(e, after) => {
                tokio::time::sleep(after).await;
                Err(e)
            }
            Fate::Deliver {
                deliver,
                reply,
                reply_lost,
            } => {
                let (tx, rx) = oneshot::channel();
                let world = self.world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(deliver).await;
                    let (result, sweeps) = with(&world, |w| take(w, id));
                    start_sweeps(&world, sweeps);
                    let _ = tx.send(result);
                });
                let result = rx
                    .await
                    .unwrap_or_else(|_| Err(SmError::Unreachable(model(InjectedFault::Outage))));
                tokio::time::sleep(reply).await;
                if reply_lost {
                    with(&self.world, |w| {
                        w.log(format!("sm: reply to apply #{id} lost ({result:?})"))
                    });
                    return Err(SmError::Unreachable(model(InjectedFault::LostReply)));
                }
                result
            }
        }
    }
}

fn choose_fate(w: &mut World) -> Fate {
    if !w.faults {
        return Fate::Deliver {
            deliver: w.ms(1, 20),
            reply: w.ms(1, 20),
            reply_lost: false,
        };
    }
    let roll = w.rng.random_range(0..100);
    match roll {
        0..=39 => Fate::Deliver {
            deliver: w.ms(1, 50),
            reply: w.ms(1, 50),
            reply_lost: false,
        },
        40..=51 => Fate::NoEffect(
            SmError::Unreachable(model(InjectedFault::Outage)),
            w.ms(1, 50),
        ),
        52..=57 => Fate::NoEffect(
            SmError::Refused(model(InjectedFault::Refusal("refused the set".into()))),
            w.ms(1, 50),
        ),
        58..=74 => Fate::Deliver {
            deliver: w.ms(1, 50),
            reply: w.ms(1, 50),
            reply_lost: true,
        },
        75..=86 => Fate::Deliver {
            deliver: w.ms(500, 20_000),
            reply: w.ms(1, 50),
            reply_lost: false,
        },
        // Slower than the agent's apply timeout: it gives up, the request still lands later.
        _ => Fate::Deliver {
            deliver: w.ms(61_000, 120_000),
            reply: w.ms(1, 50),
            reply_lost: false,
        },
    }
}

/// The SM takes request `id` (or refuses it); returns the reply and the port sweeps to start.
fn take(w: &mut World, id: u64) -> (Result<ApplyOutcome, SmError>, Vec<(usize, Duration)>) {
    let Some(r) = w.fabric.in_flight.remove(&id) else {
        w.log(format!("sm: request #{id} was lost in an SM restart"));
        return (
            Err(SmError::Unreachable(model(InjectedFault::Outage))),
            Vec::new(),
        );
    };
    if r.epoch != w.fabric.sm.epoch {
        w.log(format!("sm: request #{id} was lost in an SM restart"));
        return (
            Err(SmError::Unreachable(model(InjectedFault::Outage))),
            Vec::new(),
        );
    }
    let stored = w.fabric.sm.stored_generation;
    if r.generation < stored {
        w.log(format!(
            "sm: refused request #{id}: generation {} older than stored {stored}",
            r.generation
        ));
        return (
            Err(SmError::StaleGeneration {
                sent: r.generation,
                stored,
            }),
            Vec::new(),
        );
    }
    w.log(format!(
        "sm: TOOK request #{id} generation {} keys {}",
        r.generation,
        show_keys(&r.keys)
    ));
    w.fabric.sm.config = Some(r.keys);
    w.fabric.sm.stored_generation = r.generation;
    w.fabric.sm.stored_set = r.set;
    let sweeps = sweep_delays(w);
    (
        Ok(ApplyOutcome {
            detail: "model SM took the set".into(),
            acknowledged_by: Vec::new(),
        }),
        sweeps,
    )
}

/// Per port, when the SM programs it: at once-ish, or (faults on) much later, port by port.
pub fn sweep_delays(w: &mut World) -> Vec<(usize, Duration)> {
    (0..w.fabric.ports.len())
        .map(|i| {
            let d = if w.faults && w.chance(0.3) {
                w.ms(1_000, 15_000)
            } else {
                w.ms(1, 30)
            };
            (i, d)
        })
        .collect()
}

/// Starts the port sweeps: each programs its port from the SM's config as it is then.
pub fn start_sweeps(world: &Shared, sweeps: Vec<(usize, Duration)>) {
    for (i, d) in sweeps {
        let world = world.clone();
        world.lock().expect("world lock").sweeps_pending += 1;
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            with(&world, |w| {
                w.sweeps_pending -= 1;
                w.program_port(i)
            });
        });
    }
}

/// The SM restarts: requests on their way are lost; with `keep_state` false it forgets the
/// node (and its generation) and programs nothing for it any more.
pub fn restart(world: &Shared, keep_state: bool) {
    let sweeps = with(world, |w| {
        w.fabric.sm.epoch += 1;
        let lost: Vec<u64> = w.fabric.in_flight.keys().copied().collect();
        w.fabric.in_flight.clear();
        if !keep_state {
            w.fabric.sm.config = None;
            w.fabric.sm.stored_generation = 0;
            w.fabric.sm.stored_set = None;
        }
        w.log(format!(
            "sm: restarted {}; requests lost: {lost:?}",
            if keep_state {
                "with its state"
            } else {
                "WITHOUT its state"
            }
        ));
        sweep_delays(w)
    });
    start_sweeps(world, sweeps);
}

/// The SM's stored generation jumps ahead (only once the node uses generations at all).
pub fn generation_conflict(world: &Shared) {
    with(world, |w| {
        if w.fabric.max_generation_seen == 0 {
            w.log("sm: generation conflict skipped (the node sends generation 0)");
            return;
        }
        let jump = w.rng.random_range(1..=3);
        w.fabric.sm.stored_generation = w
            .fabric
            .sm
            .stored_generation
            .max(w.fabric.max_generation_seen)
            + jump;
        let g = w.fabric.sm.stored_generation;
        w.log(format!("sm: stored generation jumps to {g}"));
    });
}

/// A failure of the model SM.
fn model(fault: InjectedFault) -> SmFailure {
    SmFailure::Injected {
        backend: "model SM",
        fault,
    }
}
