//! The prune probe: looks at every RELEASED attachment 1 ms before its `released_retain` is
//! over, where it must still be stored (the oracle's check 9; `Oracle::probe_prunes`). A
//! prune any earlier than that is caught, however long before the next step it happened.

use super::world::{with, Shared};
use tokio::time::sleep_until;

/// Runs until the run's runtime ends (or its task is aborted).
pub async fn run(world: Shared) {
    let released = world
        .lock()
        .expect("world lock")
        .oracle
        .released_seen
        .clone();
    loop {
        let next = {
            let w = world.lock().expect("world lock");
            if w.oracle.finding.is_some() {
                return;
            }
            w.oracle.next_prune_probe()
        };
        match next {
            Some(at) => sleep_until(at).await,
            None => released.notified().await,
        }
        with(&world, |w| {
            let now = w.now_ms();
            w.oracle.probe_prunes(now);
        });
    }
}
