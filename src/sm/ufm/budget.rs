//! The per-agent request budget: a token bucket of `burst` requests refilled at `rate` per
//! second. A request beyond it waits for its token; it is never dropped nor failed, so a
//! budget can slow an apply down but cannot change what the apply reports.

use std::sync::Mutex;
use tokio::time::{Duration, Instant};

/// A token bucket shared by every request of one backend.
#[derive(Debug)]
pub(crate) struct Budget {
    rate: f64,
    burst: f64,
    /// Tokens available at `.1` (may be negative: tokens promised to waiting requests).
    bucket: Mutex<(f64, Instant)>,
}

impl Budget {
    /// A full bucket of `burst` tokens refilled at `rate` per second (both > 0).
    pub(crate) fn new(rate: u32, burst: u32) -> Budget {
        Budget {
            rate: f64::from(rate.max(1)),
            burst: f64::from(burst.max(1)),
            bucket: Mutex::new((f64::from(burst.max(1)), Instant::now())),
        }
    }

    /// Takes one token, waiting until it is due. Requests are served in the order they ask.
    pub(crate) async fn take(&self) {
        let wait = {
            let mut bucket = self.bucket.lock().expect("budget lock");
            let now = Instant::now();
            let (tokens, at) = *bucket;
            let refilled = (tokens + now.saturating_duration_since(at).as_secs_f64() * self.rate)
                .min(self.burst);
            let left = refilled - 1.0;
            *bucket = (left, now);
            if left >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-left / self.rate)
            }
        };
        if !wait.is_zero() {
            tracing::debug!(?wait, "UFM request budget spent; waiting");
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_requests_wait_for_the_rate() {
        let budget = Budget::new(10, 5);
        let start = Instant::now();
        for _ in 0..5 {
            budget.take().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst does not wait");
        for _ in 0..20 {
            budget.take().await;
        }
        let took = start.elapsed().as_secs_f64();
        assert!(
            (1.99..2.01).contains(&took),
            "20 requests beyond the burst at 10/s took {took}s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_queue_rather_than_overdraw() {
        let budget = std::sync::Arc::new(Budget::new(4, 1));
        let start = Instant::now();
        let tasks: Vec<_> = (0..9)
            .map(|_| {
                let b = budget.clone();
                tokio::spawn(async move {
                    b.take().await;
                    Instant::now()
                })
            })
            .collect();
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap().duration_since(start).as_secs_f64());
        }
        done.sort_by(f64::total_cmp);
        assert!(
            done[8] >= 1.99,
            "9 requests at 4/s with a burst of 1: last at {}",
            done[8]
        );
        // No one-second window holds more than burst + rate requests.
        for (i, t) in done.iter().enumerate() {
            let in_window = done[i..].iter().filter(|u| **u < t + 1.0 - 1e-9).count();
            assert!(in_window <= 5, "{in_window} requests within 1 s of {t}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_spell_refills_only_up_to_the_burst() {
        let budget = Budget::new(10, 3);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        for _ in 0..4 {
            budget.take().await;
        }
        let took = start.elapsed().as_secs_f64();
        assert!(
            (0.09..0.11).contains(&took),
            "4th request after a full burst of 3: {took}s"
        );
    }
}
