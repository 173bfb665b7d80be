//! The seam between the UFM backend and UFM: one attempt of one HTTP request, the wall clock
//! the late-write window is measured on, and the retry backoff's jitter. The backend sends
//! through reqwest and reads the system clock unless [`UfmSm::with_link`](super::UfmSm::with_link)
//! gives it another link (a model UFM on a simulated clock: reqwest does not run on a paused
//! tokio clock). Authentication, timeouts and TLS belong to the reqwest link; retries, the
//! request budget and every rule of the backend stay above the seam.

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

/// The system clock in unix milliseconds.
pub(crate) fn system_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
