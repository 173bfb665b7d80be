//! When the reconciler next sends: the retry after a failed apply (capped, jittered backoff;
//! refusals at the cap's pace; a stale generation retried at once a few times), the periodic
//! resync, and what cuts a wait short (a desired set other than the one that failed; the
//! subnet manager's fault changing, see `SubnetManager::cause_changed`). No I/O: the runner
//! reads the time and passes it in.

use super::ReconcilerConfig;
use crate::domain::NodeMemberships;
use std::hash::{Hash, Hasher};
use std::time::Duration;
use tokio::time::Instant;

/// Stale-generation answers retried at once before backing off.
const STALE_RETRIES: u32 = 3;

/// The retry and resync deadlines.
pub(super) struct Schedule {
    node_id: String,
    cfg: ReconcilerConfig,
    retry_at: Option<Instant>,
    backoff: Duration,
    failures: u64,
    stale_retries: u32,
    resync_at: Instant,
    /// Resyncs scheduled so far (draws each one's jitter).
    resync_round: u64,
    /// The set the last failed apply carried: a different desired set (a new request) is
    /// sent at once instead of waiting out that failure's backoff.
    failed_set: Option<NodeMemberships>,
}

impl Schedule {
    /// No retry pending; the first resync one jittered `resync_secs` after `now`.
    pub(super) fn new(node_id: &str, cfg: ReconcilerConfig, now: Instant) -> Schedule {
        Schedule {
            node_id: node_id.to_owned(),
            retry_at: None,
            backoff: Duration::from_millis(cfg.backoff_initial_ms),
            failures: 0,
            stale_retries: 0,
            resync_at: now + resync_delay(node_id, 0, &cfg),
            resync_round: 0,
            failed_set: None,
            cfg,
        }
    }

    /// Drops the failure's backoff: the next pass applies at once.
    pub(super) fn retry_now(&mut self) {
        self.retry_at = None;
        self.backoff = Duration::from_millis(self.cfg.backoff_initial_ms);
    }

    /// Sees the desired set (built from a port read): one other than the set that failed is a
    /// new request and goes at once. Returns whether that cut the backoff short.
    pub(super) fn desired(&mut self, desired: &NodeMemberships) -> bool {
        let new_request =
            self.retry_at.is_some() && self.failed_set.as_ref().is_some_and(|f| f != desired);
        if new_request {
            self.retry_now();
        }
        new_request
    }

    /// Whether an apply may be sent at `now` (no retry deadline ahead).
    pub(super) fn due(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|t| now >= t)
    }

    /// The retry deadline still ahead of `now`, if any. One already past (the ports were
    /// unreadable, so no apply happened) must not wake the loop at once, again and again: the
    /// observer's poll wakes it.
    pub(super) fn retry_ahead(&self, now: Instant) -> Option<Instant> {
        self.retry_at.filter(|t| *t > now)
    }

    /// The next resync.
    pub(super) fn resync_at(&self) -> Instant {
        self.resync_at
    }

    /// If the resync is due at `now`, schedules the next one and returns true.
    pub(super) fn resync_due(&mut self, now: Instant) -> bool {
        if now < self.resync_at {
            return false;
        }
        self.resync_round += 1;
        self.resync_at = now + resync_delay(&self.node_id, self.resync_round, &self.cfg);
        true
    }

    /// A positive answer: every failure is forgotten.
    pub(super) fn acknowledged(&mut self) {
        self.retry_now();
        self.failures = 0;
        self.stale_retries = 0;
        self.failed_set = None;
    }

    /// A stale-generation answer: true (retry at once) for the first few in a row.
    pub(super) fn stale_retry(&mut self) -> bool {
        if self.stale_retries >= STALE_RETRIES {
            return false;
        }
        self.stale_retries += 1;
        self.retry_at = None;
        true
    }

    /// Any other failure of the apply of `set` at `now`: the wait before the retry (permanent
    /// refusals are retried too, an operator may fix them, just at the cap's pace).
    pub(super) fn failed(
        &mut self,
        transient: bool,
        set: NodeMemberships,
        now: Instant,
    ) -> Duration {
        let max = Duration::from_millis(self.cfg.backoff_max_ms);
        let delay = if transient { self.backoff } else { max };
        self.failures += 1;
        let jitter = jitter(&self.node_id, self.failures);
        self.retry_at = Some(now + delay.mul_f64(jitter));
        self.backoff = (self.backoff * 2).min(max);
        self.failed_set = Some(set);
        delay
    }
}

/// A retry delay's jitter factor in [0.8, 1.2): spread across a fleet (it depends on the node
/// id) yet reproducible (no process-global randomness), so a run can be replayed exactly.
fn jitter(node_id: &str, attempt: u64) -> f64 {
    let mut h = std::hash::DefaultHasher::new();
    (node_id, attempt).hash(&mut h);
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    0.8 + 0.4 * unit
}

/// The wait before resync `round`: `resync_secs` times a factor uniform in
/// [1 - pct/100, 1 + pct/100], drawn from the node id and the round (spread across a fleet,
/// reproducible per node).
fn resync_delay(node_id: &str, round: u64, cfg: &ReconcilerConfig) -> Duration {
    let mut h = std::hash::DefaultHasher::new();
    (node_id, "resync", round).hash(&mut h);
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    let spread = f64::from(cfg.resync_jitter_pct.min(50)) / 100.0;
    Duration::from_secs(cfg.resync_secs).mul_f64(1.0 + spread * (2.0 * unit - 1.0))
}

#[cfg(test)]
mod tests {
    use super::{jitter, resync_delay};
    use crate::agent::ReconcilerConfig;

    #[test]
    fn resync_jitter_spreads_a_fleet_restarted_at_once() {
        let cfg = ReconcilerConfig {
            resync_secs: 300,
            resync_jitter_pct: 10,
            ..ReconcilerConfig::default()
        };
        // 2,000 nodes started together: their first resyncs, by 6-second bucket.
        let delays: Vec<f64> = (0..2000)
            .map(|n| resync_delay(&format!("node-{n}"), 0, &cfg).as_secs_f64())
            .collect();
        assert!(delays.iter().all(|d| (270.0..=330.0).contains(d)));
        let mut buckets = [0usize; 10];
        for d in &delays {
            let bucket = (1..10u32)
                .take_while(|b| *d >= 270.0 + 6.0 * f64::from(*b))
                .count();
            buckets[bucket] += 1;
        }
        // Uniform: about 200 per bucket; none empty, none holding a crowd.
        assert!(
            buckets.iter().all(|b| (120..=280).contains(b)),
            "{buckets:?}"
        );
        // Each round draws again; the same node and round give the same wait.
        assert_ne!(
            resync_delay("node-1", 1, &cfg),
            resync_delay("node-1", 2, &cfg)
        );
        assert_eq!(
            resync_delay("node-1", 1, &cfg),
            resync_delay("node-1", 1, &cfg)
        );
        let none = ReconcilerConfig {
            resync_jitter_pct: 0,
            ..cfg
        };
        assert_eq!(resync_delay("node-1", 3, &none).as_secs(), 300);
    }

    #[test]
    fn jitter_is_reproducible_and_bounded() {
        for attempt in 0..1000 {
            let j = jitter("gpu-node-17", attempt);
            assert!((0.8..1.2).contains(&j), "{j}");
            assert_eq!(j, jitter("gpu-node-17", attempt));
        }
        assert_ne!(jitter("gpu-node-17", 1), jitter("gpu-node-18", 1));
    }
}
