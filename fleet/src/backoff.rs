//! Capped exponential backoff with jitter, so thousands of followers that lost their nodes at
//! the same moment do not reconnect in lockstep.

use rand::Rng;
use std::time::Duration;

/// One follower's reconnect delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// Starts at `initial`, doubles per failure, never above `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            failures: 0,
        }
    }

    /// The next delay: half the capped exponential plus a random part up to the other half.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self
            .initial
            .saturating_mul(1u32 << self.failures.min(20))
            .min(self.max);
        self.failures = self.failures.saturating_add(1);
        let half = exp / 2;
        half + rand::rng().random_range(Duration::ZERO..=half)
    }

    /// A success: the next failure starts from `initial` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_is_capped_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let first = b.next_delay();
        assert!((50..=100).contains(&first.as_millis()), "{first:?}");
        for _ in 0..30 {
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(1000), "{d:?}");
        }
        assert!(b.next_delay() >= Duration::from_millis(500));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
