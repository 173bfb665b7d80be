//! The seam between the UFM backend and UFM: one attempt of one HTTP request, the clock the
//! late-write window is measured on (steady, see [`system_unix_ms`]), and the retry backoff's
//! jitter. The backend sends through reqwest and reads the process's steady clock unless
//! [`UfmSm::with_link`](super::UfmSm::with_link) gives it another link (a model UFM on a
//! simulated clock: reqwest does not run on a paused tokio clock). Authentication, timeouts and
//! TLS belong to the reqwest link; retries, the request budget and every rule of the backend
//! stay above the seam.

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// An answer from UFM, body read.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// Why one attempt got no answer.
#[derive(Debug)]
pub enum LinkError {
    /// Worth another attempt: a timeout, a connection error, an answer cut short. UFM may
    /// still have executed the request.
    Transient(Box<dyn std::error::Error + Send + Sync>),
    /// The answer is larger than `cap` bytes (asking again fetches the same answer).
    TooLarge {
        /// The announced length, if the answer announced one.
        announced: Option<u64>,
        /// The cap.
        cap: usize,
    },
}

/// How the backend reaches UFM.
#[async_trait]
pub trait UfmLink: Send + Sync {
    /// Sends one attempt of `method url` (with `body` as JSON) and reads the answer, refusing
    /// one larger than `cap` bytes.
    async fn send(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
        cap: usize,
    ) -> Result<Answer, LinkError>;

    /// Now, in unix milliseconds: when an add was sent and when a read started (the
    /// late-write window is measured on it).
    fn unix_ms(&self) -> i64 {
        system_unix_ms()
    }

    /// A uniformly drawn whole number in `0..=max` (the retry backoff's jitter).
    fn jitter_ms(&self, max: u64) -> u64 {
        rand::random_range(0..=max)
    }
}

/// Unix milliseconds on the process's steady clock: the wall clock read once, then advanced by
/// the monotonic clock, so a step of the wall clock (forward or back) neither ends a late-write
/// watch early nor stretches it within one process. Across restarts a process trusts no stored
/// deadline: it re-arms every watch it loads to one whole window from its own start
/// (`ledger_io.rs`, "Watches across restarts").
pub(crate) fn system_unix_ms() -> i64 {
    static STEADY: std::sync::OnceLock<SteadyUnixMs> = std::sync::OnceLock::new();
    STEADY
        .get_or_init(|| SteadyUnixMs::anchored(wall_unix_ms()))
        .unix_ms()
}

/// The wall clock in unix milliseconds.
fn wall_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Unix milliseconds that advance with the monotonic clock (the runtime's: paused time in
/// tests) from one reading of the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SteadyUnixMs {
    anchor_unix_ms: i64,
    anchor: tokio::time::Instant,
}

impl SteadyUnixMs {
    /// A clock reading `unix_ms` now.
    pub(crate) fn anchored(unix_ms: i64) -> SteadyUnixMs {
        SteadyUnixMs {
            anchor_unix_ms: unix_ms,
            anchor: tokio::time::Instant::now(),
        }
    }

    /// Now, in unix milliseconds.
    pub(crate) fn unix_ms(&self) -> i64 {
        let since = tokio::time::Instant::now().saturating_duration_since(self.anchor);
        self.anchor_unix_ms
            .saturating_add(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A late-write watch armed at `sent` for `window` ends at the window's real length, however
    /// the wall clock steps meanwhile: the steady clock reads it only once.
    #[tokio::test(start_paused = true)]
    async fn a_forward_wall_clock_step_does_not_end_a_watch_early() {
        const WINDOW_MS: i64 = 120_000;
        let wall_at_start = 1_800_000_000_000;
        let clock = SteadyUnixMs::anchored(wall_at_start);
        let sent = clock.unix_ms();
        let until = sent + WINDOW_MS;
        // An hour's forward step of the wall clock: what the old clock read, and would have
        // ended the watch with.
        let stepped_wall = wall_at_start + 3_600_000;
        assert!(stepped_wall >= until, "the step alone would end the watch");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(clock.unix_ms(), sent + 60_000);
        assert!(
            clock.unix_ms() < until,
            "still watched after half the window"
        );
        tokio::time::sleep(Duration::from_millis(59_999)).await;
        assert!(
            clock.unix_ms() < until,
            "watched until the window's real length"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(clock.unix_ms() >= until, "and no longer");
    }

    #[test]
    fn the_process_clock_starts_at_the_wall_clock_and_never_goes_back() {
        let wall = wall_unix_ms();
        let a = system_unix_ms();
        let b = system_unix_ms();
        assert!((a - wall).abs() < 60_000, "{a} vs {wall}");
        assert!(b >= a);
    }
}
