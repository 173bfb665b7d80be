//! The simulated node's wall clock: the world's elapsed time from a fixed epoch plus an offset
//! that the schedule's clock steps move (`Command::ClockStep`, +1 h or -1 h). Every wall
//! reading in the simulated node goes through it, as production reads `SystemTime`: the
//! agent's [`Clock`] reads it at every call (the production `SystemClock`), the UFM link once
//! per agent life (the production steady clock, `model_ufm`), and the oracle judges pruning on
//! it. Shared without the world's lock (the agent reads it from inside its own calls).

use fabric_agent::agent::Clock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// The simulated wall clock at the world's start, unix ns (2026-01-01T00:00:00Z).
pub const SIM_EPOCH_UNIX_NS: i64 = 1_767_225_600_000_000_000;

/// The stepped wall clock (clones share the steps).
#[derive(Debug, Clone)]
pub struct Wall {
    t0: Instant,
    offset_ns: Arc<AtomicI64>,
}

impl Wall {
    /// A wall clock reading [`SIM_EPOCH_UNIX_NS`] at `t0`, not stepped.
    pub fn new(t0: Instant) -> Wall {
        Wall {
            t0,
            offset_ns: Arc::default(),
        }
    }

    /// Now, unix ns: the epoch, the time elapsed since `t0` and every step so far.
    pub fn now_ns(&self) -> i64 {
        SIM_EPOCH_UNIX_NS
            .saturating_add(self.t0.elapsed().as_nanos() as i64)
            .saturating_add(self.offset_ns.load(Ordering::SeqCst))
    }

    /// Now, unix ms.
    pub fn now_ms(&self) -> i64 {
        self.now_ns().div_euclid(1_000_000)
    }

    /// Steps the clock by `by_ms` (negative: back).
    pub fn step(&self, by_ms: i64) {
        self.offset_ns
            .fetch_add(by_ms.saturating_mul(1_000_000), Ordering::SeqCst);
    }

    /// The sum of the steps so far, ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ns.load(Ordering::SeqCst) / 1_000_000
    }

    /// The runtime instant at which this clock will read `unix_ns` if it is not stepped
    /// meanwhile (now when that reading is past).
    pub fn instant_of(&self, unix_ns: i64) -> Instant {
        let ahead = unix_ns.saturating_sub(self.now_ns()).max(0);
        Instant::now() + std::time::Duration::from_nanos(ahead as u64)
    }
}

/// The production `SystemClock`: the stepped wall at every call.
impl Clock for Wall {
    fn now_unix_ns(&self) -> i64 {
        self.now_ns()
    }
}
