//! One HTTP exchange with UFM: authentication, timeouts, and retries with capped, jittered
//! backoff on timeouts, connection errors and 5xx answers. 4xx answers are returned to the
//! caller at once (never retried).

use super::auth::{Credential, Loaded};
use reqwest::header::{ACCEPT, AUTHORIZATION};
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Retry policy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Extra attempts after the first.
    pub retries: u32,
    /// First delay.
    pub initial: Duration,
    /// Cap.
    pub max: Duration,
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (0-based): the doubled step capped at `max`,
    /// then a random point between half and all of it, so that many agents that lost UFM at
    /// the same moment do not come back in lockstep.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let step = self
            .initial
            .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .min(self.max);
        let half = step / 2;
        let jitter_ms = rand::random_range(0..=(step - half).as_millis() as u64);
        half + Duration::from_millis(jitter_ms)
    }
}

/// An answer below 500 (2xx, 3xx or 4xx), body read.
#[derive(Debug)]
pub(crate) struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// Why an exchange produced no answer below 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreachable(pub String);

/// The requests of one apply, sharing a client, credentials and counters.
pub(crate) struct Exchange<'a> {
    /// HTTP client (timeouts, TLS, identity).
    pub client: &'a Client,
    /// `https://host:port` + API path, no trailing slash.
    pub base: &'a str,
    /// Credentials for this apply.
    pub credential: &'a Loaded,
    /// Retry policy.
    pub policy: RetryPolicy,
    /// Requests sent, retries included.
    pub sent: AtomicUsize,
}

impl Exchange<'_> {
    /// Sends `method path` (path below the API path, e.g. `/resources/pkeys`), retrying
    /// transient failures. Returns the first answer below 500.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Unreachable> {
        let url = format!("{}{}", self.base, path);
        let mut attempt = 0u32;
        loop {
            let failure = match self.send_once(&method, &url, body).await {
                Ok(answer) if !answer.status.is_server_error() => return Ok(answer),
                Ok(answer) => format!("UFM answered {} to {method} {url}", answer.status),
                Err(why) => format!("{method} {url}: {why}"),
            };
            if attempt >= self.policy.retries {
                return Err(Unreachable(format!(
                    "{failure} (gave up after {} attempts)",
                    attempt + 1
                )));
            }
            let delay = self.policy.delay(attempt);
            tracing::debug!(%failure, attempt, ?delay, "UFM request failed; retrying");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let mut request = self
            .client
            .request(method.clone(), url)
            .header(ACCEPT, "application/json");
        request = match &self.credential.credential {
            Credential::Basic { user, password } => {
                request.basic_auth(user, Some(password.expose()))
            }
            Credential::Header(value, _) => request.header(AUTHORIZATION, value.clone()),
            Credential::ClientCert(_) => request,
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| describe(&e))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| describe(&e))?;
        tracing::debug!(%method, url, %status, "UFM answered");
        Ok(Answer {
            status,
            body: body.to_vec(),
        })
    }
}

/// A transport error in words, without the URL (it is named by the caller) and without any
/// header (reqwest never puts headers in errors).
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    let mut root: &dyn std::error::Error = e;
    while let Some(next) = root.source() {
        root = next;
    }
    let kind = if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "answer cut short"
    } else {
        "request failed"
    };
    format!("{kind}: {root}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_and_jittered() {
        let p = RetryPolicy {
            retries: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1_000),
        };
        for _ in 0..50 {
            let d0 = p.delay(0);
            assert!(d0 >= Duration::from_millis(50) && d0 <= Duration::from_millis(100));
            let d2 = p.delay(2);
            assert!(d2 >= Duration::from_millis(200) && d2 <= Duration::from_millis(400));
            let d9 = p.delay(40);
            assert!(d9 >= Duration::from_millis(500) && d9 <= Duration::from_millis(1_000));
        }
    }
}
