//! The model observer, plugged into the agent through [`PortObserver`]: reads take random time
//! and return the snapshot taken when they started (stale by then, when faults are on), or fail;
//! `changed` sleeps the poll interval or wakes on a table change (when the seed gives the
//! observer change notifications). Ports go DOWN and UP on command.

use super::world::{with, Shared};
use async_trait::async_trait;
use fabric_agent::domain::Inventory;
use fabric_agent::observe::{ObserveError, PortObserver, ReadError};
use rand::Rng;
use std::time::Duration;

/// Slow poll interval (nothing pending).
pub const SLOW_POLL: Duration = Duration::from_secs(5);

/// The model observer.
pub struct ModelObserver {
    world: Shared,
    fast_poll: Duration,
    push_changes: bool,
}

impl ModelObserver {
    /// The observer of `world`.
    pub fn new(world: Shared, fast_poll: Duration, push_changes: bool) -> ModelObserver {
        ModelObserver {
            world,
            fast_poll,
            push_changes,
        }
    }
}

#[async_trait]
impl PortObserver for ModelObserver {
    fn kind(&self) -> &'static str {
        "model"
    }

    async fn inventory(&self) -> Result<Inventory, ObserveError> {
        let (snapshot, started_ms, delay, fail) = with(&self.world, |w| {
            w.reads += 1;
            let snapshot = w.fabric.inventory();
            let (delay, fail) = if !w.faults {
                (w.ms(0, 5), false)
            } else {
                match w.rng.random_range(0..100) {
                    0..=69 => (w.ms(0, 5), false),
                    70..=91 => (w.ms(200, 5_000), false),
                    _ => (w.ms(0, 50), true),
                }
            };
            if fail {
                w.log("observer: read fails");
            } else if delay >= Duration::from_millis(200) {
                w.log(format!(
                    "observer: slow read, returns this snapshot in {} ms",
                    delay.as_millis()
                ));
            }
            w.read_started.notify_waiters();
            (snapshot, w.now_ms(), delay, fail)
        });
        tokio::time::sleep(delay).await;
        if fail {
            return Err(ObserveError::Read(ReadError::File {
                path: "/model/ports".into(),
                source: std::sync::Arc::new(std::io::Error::other("model observer: read failed")),
            }));
        }
        with(&self.world, |w| {
            w.oracle.record_read(snapshot.clone(), started_ms)
        });
        Ok(snapshot)
    }

    async fn changed(&self, pending: bool) {
        let poll = if pending { self.fast_poll } else { SLOW_POLL };
        if self.push_changes {
            let changes = self.world.lock().expect("world lock").changes.clone();
            tokio::select! {
                biased;
                _ = changes.notified() => {}
                _ = tokio::time::sleep(poll) => {}
            }
        } else {
            tokio::time::sleep(poll).await;
        }
    }
}

/// Port `i` goes DOWN: its table is gone.
pub fn port_down(world: &Shared, i: usize) {
    with(world, |w| {
        let p = &mut w.fabric.ports[i];
        if !p.up {
            return;
        }
        p.up = false;
        p.table.iter_mut().for_each(|e| *e = 0);
        w.log(format!("port {i} DOWN"));
        w.changes.notify_waiters();
    });
}

/// Port `i` comes UP: the SM programs it from its config before it turns ACTIVE.
pub fn port_up(world: &Shared, i: usize) {
    with(world, |w| {
        if w.fabric.ports[i].up {
            return;
        }
        w.fabric.ports[i].up = true;
        w.log(format!("port {i} UP"));
        w.program_port(i);
        w.changes.notify_waiters();
    });
}
