//! One HTTP exchange with UFM: authentication, timeouts, and retries with capped, jittered
//! backoff on timeouts, connection errors and 5xx answers. 4xx answers are returned to the
//! caller at once (never retried). Answer bodies are capped at [`MAX_BODY`]: a larger one is an
//! error (not retried), never an unbounded allocation.

use super::auth::{Credential, Loaded};
use super::budget::Budget;
use super::link::{LinkError, UfmLink};
use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION};
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest UFM answer body read (8 MiB); a larger one fails the request.
pub(crate) const MAX_BODY: usize = 8 << 20;

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
    /// then a random point between half and all of it (`jitter_ms(n)` draws from `0..=n`), so
    /// that many agents that lost UFM at the same moment do not come back in lockstep.
    pub(crate) fn delay(&self, attempt: u32, jitter_ms: impl FnOnce(u64) -> u64) -> Duration {
        let step = self
            .initial
            .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .min(self.max);
        let half = step / 2;
        // Saturates: a step beyond u64 milliseconds is not configurable.
        let jitter = jitter_ms(u64::try_from((step - half).as_millis()).unwrap_or(u64::MAX));
        half + Duration::from_millis(jitter)
    }
}

pub(crate) use super::link::Answer;

/// Why UFM gave no usable answer to a request (after every attempt it was worth).
#[derive(Debug, Clone, thiserror::Error)]
pub enum NoAnswer {
    /// Only 5xx answers.
    #[error("UFM answered {status} to {method} {url} (gave up after {attempts} attempts)")]
    ServerError {
        /// The request's method.
        method: Method,
        /// The request's URL.
        url: String,
        /// The last answer's status.
        status: StatusCode,
        /// Attempts made.
        attempts: u32,
    },
    /// Timeouts, connection errors or answers cut short.
    #[error(
        "{method} {url}: {} (gave up after {attempts} attempts)",
        describe(source)
    )]
    Transport {
        /// The request's method.
        method: Method,
        /// The request's URL.
        url: String,
        /// The last attempt's failure.
        #[source]
        source: Arc<reqwest::Error>,
        /// Attempts made.
        attempts: u32,
    },
    /// Timeouts, connection errors or answers cut short, on a link other than reqwest's.
    #[error("{method} {url}: {detail} (gave up after {attempts} attempts)")]
    Link {
        /// The request's method.
        method: Method,
        /// The request's URL.
        url: String,
        /// The last attempt's failure.
        detail: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The answer exceeded the answer cap, 8 MiB (not retried: asking again fetches the same
    /// answer).
    #[error("{method} {url}: UFM answer body of {} bytes exceeds the {cap}-byte limit; not read", match .announced { Some(n) => n.to_string(), None => format!("more than {cap}") })]
    TooLarge {
        /// The request's method.
        method: Method,
        /// The request's URL.
        url: String,
        /// The announced length, if the answer announced one.
        announced: Option<u64>,
        /// The cap.
        cap: usize,
    },
}

/// The requests of one apply, sharing a client, credentials and counters.
pub(crate) struct Exchange<'a> {
    /// How requests reach UFM.
    pub link: &'a dyn UfmLink,
    /// `https://host:port` + API path, no trailing slash.
    pub base: &'a str,
    /// Credentials for this apply.
    pub credential: &'a Loaded,
    /// Retry policy.
    pub policy: RetryPolicy,
    /// Requests sent, retries included.
    pub sent: AtomicUsize,
    /// The backend's request budget: every attempt takes a token first.
    pub budget: &'a Budget,
}

impl Exchange<'_> {
    /// Sends `method path` (path below the API path, e.g. `/resources/pkeys`), retrying
    /// transient failures. Returns the first answer below 500.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, NoAnswer> {
        let url = format!("{}{}", self.base, path);
        let mut attempt = 0u32;
        loop {
            let attempts = attempt + 1;
            let failure = match self.send_once(&method, &url, body).await {
                Ok(answer) if !answer.status.is_server_error() => return Ok(answer),
                Ok(answer) => NoAnswer::ServerError {
                    method: method.clone(),
                    url: url.clone(),
                    status: answer.status,
                    attempts,
                },
                Err(LinkError::Transient(e)) => match e.downcast::<reqwest::Error>() {
                    Ok(e) => NoAnswer::Transport {
                        method: method.clone(),
                        url: url.clone(),
                        source: Arc::new(*e),
                        attempts,
                    },
                    Err(e) => NoAnswer::Link {
                        method: method.clone(),
                        url: url.clone(),
                        detail: e.to_string(),
                        attempts,
                    },
                },
                // Asking again would fetch the same oversized answer.
                Err(LinkError::TooLarge { announced, cap }) => {
                    return Err(NoAnswer::TooLarge {
                        method,
                        url,
                        announced,
                        cap,
                    })
                }
            };
            if attempt >= self.policy.retries {
                return Err(failure);
            }
            let delay = self.policy.delay(attempt, |max| self.link.jitter_ms(max));
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
    ) -> Result<Answer, LinkError> {
        self.budget.take().await;
        self.sent.fetch_add(1, Ordering::Relaxed);
        let answer = self.link.send(method, url, body, MAX_BODY).await?;
        tracing::debug!(%method, url, status = %answer.status, "UFM answered");
        Ok(answer)
    }
}

/// The link through reqwest: the backend's HTTP client (timeouts, TLS, identity) and this
/// apply's credentials.
pub(crate) struct ReqwestLink<'a> {
    /// HTTP client.
    pub client: &'a Client,
    /// Credentials for this apply.
    pub credential: &'a Loaded,
}

#[async_trait]
impl UfmLink for ReqwestLink<'_> {
    async fn send(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
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
        let mut response = request.send().await.map_err(transient)?;
        let status = response.status();
        let body = read_capped(&mut response, cap).await?;
        Ok(Answer { status, body })
    }
}

fn transient(e: reqwest::Error) -> LinkError {
    LinkError::Transient(Box::new(e))
}

/// Reads a body of at most `cap` bytes, refusing a larger one (announced or actual) before
/// holding more than `cap` bytes of it.
async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Result<Vec<u8>, LinkError> {
    if let Some(len) = response.content_length() {
        if usize::try_from(len).map_or(true, |len| len > cap) {
            return Err(LinkError::TooLarge {
                announced: Some(len),
                cap,
            });
        }
    }
    // Only a capacity hint, already checked against `cap`.
    let hint = response
        .content_length()
        .map_or(0, |n| usize::try_from(n).unwrap_or(0));
    let mut body = Vec::with_capacity(hint);
    while let Some(chunk) = response.chunk().await.map_err(transient)? {
        if body.len() + chunk.len() > cap {
            return Err(LinkError::TooLarge {
                announced: None,
                cap,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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

    /// Serves one fixed body (chunked when `announce` is false) on loopback; returns its URL.
    async fn serve_body(len: usize, announce: bool) -> String {
        use axum::body::Body;
        let app = axum::Router::new().route(
            "/big",
            axum::routing::get(move || async move {
                let data = vec![b'x'; len];
                if announce {
                    Body::from(data)
                } else {
                    let chunks = data
                        .chunks(64 << 10)
                        .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
                        .collect::<Vec<_>>();
                    Body::from_stream(futures::stream::iter(chunks))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/big")
    }

    #[tokio::test]
    async fn bodies_beyond_the_cap_are_refused_announced_or_streamed() {
        crate::tls::install_crypto_provider();
        let client = Client::new();
        for announce in [true, false] {
            let url = serve_body(MAX_BODY + 1, announce).await;
            let mut r = client.get(&url).send().await.unwrap();
            match read_capped(&mut r, MAX_BODY).await {
                Err(LinkError::TooLarge { announced, cap }) => {
                    assert_eq!(cap, MAX_BODY);
                    assert_eq!(announced, announce.then_some((MAX_BODY + 1) as u64));
                }
                other => panic!("announce={announce}: {other:?}"),
            }
            let url = serve_body(1000, announce).await;
            let mut r = client.get(&url).send().await.unwrap();
            assert_eq!(read_capped(&mut r, 1000).await.unwrap().len(), 1000);
        }
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered() {
        let p = RetryPolicy {
            retries: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1_000),
        };
        let jitter = |max| rand::random_range(0..=max);
        for _ in 0..50 {
            let d0 = p.delay(0, jitter);
            assert!(d0 >= Duration::from_millis(50) && d0 <= Duration::from_millis(100));
            let d2 = p.delay(2, jitter);
            assert!(d2 >= Duration::from_millis(200) && d2 <= Duration::from_millis(400));
            let d9 = p.delay(40, jitter);
            assert!(d9 >= Duration::from_millis(500) && d9 <= Duration::from_millis(1_000));
        }
    }
}
