//! The agent's wall clock: attachment and event timestamps, and when a RELEASED attachment has
//! been kept long enough to be pruned. Injected through [`super::AgentParts`], so a simulation
//! on paused time (testkit::sim) reads reproducible times and reaches the retention.

use std::time::{SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Unix time in nanoseconds.
pub trait Clock: Send + Sync {
    /// Now, Unix nanoseconds.
    fn now_unix_ns(&self) -> i64;
}

/// The system's wall clock (what the daemon uses).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ns(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// Unix time that advances with the tokio runtime's clock: `unix_ns` at the runtime instant
/// `at`. On a runtime with paused time every reading is reproducible.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeClock {
    unix_ns: i64,
    at: Instant,
}

impl RuntimeClock {
    /// A clock reading `unix_ns` at `at`.
    pub fn new(unix_ns: i64, at: Instant) -> RuntimeClock {
        RuntimeClock { unix_ns, at }
    }
}

impl Clock for RuntimeClock {
    fn now_unix_ns(&self) -> i64 {
        let since = Instant::now().saturating_duration_since(self.at);
        self.unix_ns
            .saturating_add(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_runtime_clock_follows_paused_time() {
        let c = RuntimeClock::new(1_000, Instant::now());
        assert_eq!(c.now_unix_ns(), 1_000);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(c.now_unix_ns(), 2_000_001_000);
        assert!(SystemClock.now_unix_ns() > 1_700_000_000_000_000_000);
    }
}
