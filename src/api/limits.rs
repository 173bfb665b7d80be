//! Resource bounds of the gRPC listeners: requests in progress per listener (a tower layer that
//! answers RESOURCE_EXHAUSTED instead of queueing), WatchEvents streams over all listeners
//! (slots held by the open streams), and the HTTP/2 settings that bound time and idleness.

use crate::config::LimitsConfig;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::Server;
use tonic::Status;

/// A server builder with the request timeout, the keepalive bounds and the HTTP/2 stream
/// bound of `limits`. Every connection announces SETTINGS_MAX_CONCURRENT_STREAMS = the stream
/// limit plus the in-flight limit: a client then knows it may multiplex that many calls (h2
/// clients otherwise assume 100 and queue the rest), and the agent's own limits, not HTTP/2,
/// decide what is refused.
pub fn builder(limits: &LimitsConfig) -> Server {
    let keepalive = (limits.keepalive_interval_secs > 0)
        .then(|| Duration::from_secs(limits.keepalive_interval_secs));
    let streams = limits
        .max_watch_streams
        .saturating_add(limits.max_in_flight_requests);
    Server::builder()
        .timeout(Duration::from_secs(limits.request_timeout_secs))
        .max_concurrent_streams(u32::try_from(streams).unwrap_or(u32::MAX))
        .http2_keepalive_interval(keepalive)
        .http2_keepalive_timeout(
            keepalive.map(|_| Duration::from_secs(limits.keepalive_timeout_secs)),
        )
}

/// Slots for concurrent WatchEvents streams, shared by every listener.
#[derive(Clone)]
pub struct StreamSlots {
    slots: Arc<Semaphore>,
    max: usize,
}

impl StreamSlots {
    /// At most `max` streams at once.
    pub fn new(max: usize) -> StreamSlots {
        StreamSlots {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Takes a slot for one stream (held until the permit drops), or RESOURCE_EXHAUSTED.
    pub fn acquire(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this agent already serves its maximum of {} WatchEvents streams ([limits] \
                 max_watch_streams); close an idle stream or retry later",
                self.max
            ))
        })
    }

    /// Streams open now.
    pub fn in_use(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// Refuses requests beyond `max` in progress on one listener with RESOURCE_EXHAUSTED. A
/// request counts until its handler has answered (for a stream: until the stream starts).
#[derive(Clone)]
pub struct InFlightLimitLayer {
    permits: Arc<Semaphore>,
    max: usize,
    listener: Arc<str>,
}

impl InFlightLimitLayer {
    /// At most `max` requests in progress on the listener named `listener`.
    pub fn new(max: usize, listener: &str) -> InFlightLimitLayer {
        InFlightLimitLayer {
            permits: Arc::new(Semaphore::new(max)),
            max,
            listener: listener.into(),
        }
    }
}

impl<S> tower::Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;

    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit {
            inner,
            limit: self.clone(),
        }
    }
}

/// The service [`InFlightLimitLayer`] makes.
#[derive(Clone)]
pub struct InFlightLimit<S> {
    inner: S,
    limit: InFlightLimitLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for InFlightLimit<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.limit.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let response = answer.await;
                    drop(permit);
                    response
                })
            }
            Err(_) => {
                let status = Status::resource_exhausted(format!(
                    "{} already has its maximum of {} requests in progress ([limits] \
                     max_in_flight_requests); retry later",
                    self.limit.listener, self.limit.max
                ));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    #[tokio::test]
    async fn requests_beyond_the_limit_are_refused_and_slots_come_back() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let inner = {
            let gate = gate.clone();
            tower::service_fn(move |_: http::Request<()>| {
                let gate = gate.clone();
                async move {
                    gate.notified().await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
                }
            })
        };
        let mut svc = tower::Layer::layer(&InFlightLimitLayer::new(1, "the unix socket"), inner);
        let first = svc.ready().await.unwrap().call(http::Request::new(()));
        let first = tokio::spawn(first);
        let refused = svc
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        let status = Status::from_header_map(refused.headers()).expect("grpc-status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("max_in_flight_requests"));
        gate.notify_one();
        let ok = first.await.unwrap().unwrap();
        assert!(Status::from_header_map(ok.headers()).is_none());
        // The slot is free again.
        let again = tokio::spawn(svc.ready().await.unwrap().call(http::Request::new(())));
        tokio::task::yield_now().await;
        gate.notify_one();
        let again = again.await.unwrap().unwrap();
        assert!(Status::from_header_map(again.headers()).is_none());
    }

    #[test]
    fn stream_slots_count_and_refuse() {
        let slots = StreamSlots::new(2);
        let a = slots.acquire().unwrap();
        let _b = slots.acquire().unwrap();
        assert_eq!(slots.in_use(), 2);
        let e = slots.acquire().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        drop(a);
        assert!(slots.acquire().is_ok());
    }
}
