//! Resource bounds of the gRPC listeners: requests in progress per listener (a tower layer that
//! answers RESOURCE_EXHAUSTED instead of queueing), open-ended streams over all listeners and per
//! certificate identity (slots held by the open streams), and the refusal of every call on a
//! connection over its identity's quota. The layer attaches each request's [`Held`] (who holds
//! what it takes) for the handlers.

use super::conn_limits::ConnLimits;
use super::quota::{Bounds, Held, Quota, QuotaSlot, Reserve};
use crate::api::settings::LimitsConfig;
use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// Slots for concurrent open-ended streams (WatchEvents, Health.Watch, reflection), shared by
/// every listener: at most `max_watch_streams` in all, `max_watch_streams_per_identity` per
/// certificate identity, and `reserved_watch_streams` kept for operators, the control plane,
/// peer SM hosts and local callers ([`super::quota`]).
#[derive(Clone, Debug)]
pub struct StreamSlots {
    quota: Quota,
}

impl StreamSlots {
    /// At most `max` streams at once, with no per-identity bound and no reserve.
    pub fn new(max: usize) -> StreamSlots {
        StreamSlots::bounded(max, max, 0)
    }

    /// The bounds `[limits]` sets.
    pub fn from_limits(limits: &LimitsConfig) -> StreamSlots {
        StreamSlots::bounded(
            limits.max_watch_streams,
            limits.max_watch_streams_per_identity(),
            limits.reserved_watch_streams(),
        )
    }

    fn bounded(max: usize, per_identity: usize, reserved: usize) -> StreamSlots {
        StreamSlots {
            quota: Quota::new(Bounds {
                total: max,
                per_holder: per_identity,
                reserved,
                what: "open-ended streams (WatchEvents, Health.Watch)",
                keys: [
                    "max_watch_streams",
                    "max_watch_streams_per_identity",
                    "reserved_watch_streams",
                ],
            }),
        }
    }

    /// Takes a slot for one stream of `held` (a local caller when `None`), held until the
    /// slot drops, or RESOURCE_EXHAUSTED naming the bound.
    pub fn acquire(&self, held: Option<&Held>) -> Result<QuotaSlot, Status> {
        self.quota.take_or_status(held.unwrap_or(&Held::local()))
    }

    /// Streams open now.
    pub fn in_use(&self) -> usize {
        self.quota.in_use()
    }
}

/// Refuses requests beyond `max` in progress on one listener with RESOURCE_EXHAUSTED. A
/// request counts from the moment its whole body has arrived until its handler has answered
/// (for a stream: until the stream starts); a body must arrive within `body_timeout`, so one
/// that trickles in holds no slot and is cut off. Health.Watch and reflection streams take a
/// [`StreamSlots`] slot instead, held for the stream's whole life.
#[derive(Clone)]
pub struct InFlightLimitLayer {
    permits: Arc<Semaphore>,
    max: usize,
    listener: Arc<str>,
    body_timeout: Duration,
    streams: StreamSlots,
    reserve: Reserve,
    connections: Option<ConnLimits>,
}

impl InFlightLimitLayer {
    /// At most `max` requests in progress on the listener named `listener`; bodies within
    /// `body_timeout`; long-lived health and reflection streams in `streams`.
    pub fn new(
        max: usize,
        listener: &str,
        body_timeout: Duration,
        streams: StreamSlots,
    ) -> InFlightLimitLayer {
        InFlightLimitLayer {
            permits: Arc::new(Semaphore::new(max)),
            max,
            listener: listener.into(),
            body_timeout,
            streams,
            reserve: Reserve::default(),
            connections: None,
        }
    }

    /// Judges who holds a stream by `reserve`, and refuses every call on a connection that
    /// `connections` found over its identity's quota.
    pub fn with_identities(self, reserve: Reserve, connections: Option<ConnLimits>) -> Self {
        InFlightLimitLayer {
            reserve,
            connections,
            ..self
        }
    }

    /// Why every call on the request's connection is refused, if it is.
    fn connection_refused<B>(&self, request: &http::Request<B>) -> Option<Status> {
        let conns = self.connections.as_ref()?;
        let tls = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()?;
        let peer = tls.get_ref().remote_addr()?;
        conns.refusal_of(&peer).map(Status::resource_exhausted)
    }
}

/// The largest request body read before a call: tonic's default decoding limit (4 MiB) plus
/// the gRPC frame header.
const MAX_BODY: usize = 4 * 1024 * 1024 + 5;

/// Methods whose responses stream for as long as the client likes and are not the agent's own
/// (WatchEvents takes its slot in its handler).
fn is_open_ended_stream(path: &str) -> bool {
    path == "/grpc.health.v1.Health/Watch"
        || path == "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        || path == "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
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

impl<S> tower::Service<http::Request<Body>> for InFlightLimit<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The readied service answers this call; a clone is left for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit.clone();
        if let Some(status) = limit.connection_refused(&request) {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let held = limit.reserve.held_by_request(&request);
        request.extensions_mut().insert(held.clone());
        if is_open_ended_stream(request.uri().path()) {
            let slot = match limit.streams.acquire(Some(&held)) {
                Ok(slot) => slot,
                Err(status) => return Box::pin(async move { Ok(status.into_http()) }),
            };
            let answer = inner.call(request);
            return Box::pin(async move {
                let response = answer.await?;
                Ok(response.map(|body| Body::new(SlotBody { body, _slot: slot })))
            });
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let limited = http_body_util::Limited::new(body, MAX_BODY);
            let bytes = match tokio::time::timeout(limit.body_timeout, limited.collect()).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(e)) => {
                    return Ok(Status::invalid_argument(format!(
                        "the request body could not be read: {e}"
                    ))
                    .into_http())
                }
                Err(_) => {
                    return Ok(Status::deadline_exceeded(format!(
                        "the request body did not arrive within {} s ([limits] \
                         request_body_secs)",
                        limit.body_timeout.as_secs()
                    ))
                    .into_http())
                }
            };
            let Ok(permit) = limit.permits.clone().try_acquire_owned() else {
                return Ok(Status::resource_exhausted(format!(
                    "{} already has its maximum of {} requests in progress ([limits] \
                     max_in_flight_requests); retry later",
                    limit.listener, limit.max
                ))
                .into_http());
            };
            let request =
                http::Request::from_parts(parts, Body::new(http_body_util::Full::new(bytes)));
            let response = inner.call(request).await;
            drop(permit);
            response
        })
    }
}

/// A response body that holds a stream slot until the stream ends or is dropped.
struct SlotBody {
    body: Body,
    _slot: QuotaSlot,
}

impl http_body::Body for SlotBody {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    fn request(path: &str) -> http::Request<Body> {
        http::Request::builder()
            .uri(path)
            .body(Body::empty())
            .unwrap()
    }

    fn layer(max: usize, streams: usize) -> InFlightLimitLayer {
        InFlightLimitLayer::new(
            max,
            "the unix socket",
            Duration::from_secs(10),
            StreamSlots::new(streams),
        )
    }

    fn code(r: &http::Response<Body>) -> Option<tonic::Code> {
        Status::from_header_map(r.headers()).map(|s| s.code())
    }

    #[tokio::test]
    async fn requests_beyond_the_limit_are_refused_and_slots_come_back() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let inner = {
            let gate = gate.clone();
            tower::service_fn(move |_: http::Request<Body>| {
                let gate = gate.clone();
                async move {
                    gate.notified().await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
                }
            })
        };
        let mut svc = tower::Layer::layer(&layer(1, 4), inner);
        let first = svc.ready().await.unwrap().call(request("/a/B"));
        let first = tokio::spawn(first);
        tokio::task::yield_now().await;
        let refused = svc
            .ready()
            .await
            .unwrap()
            .call(request("/a/B"))
            .await
            .unwrap();
        let status = Status::from_header_map(refused.headers()).expect("grpc-status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("max_in_flight_requests"));
        gate.notify_one();
        let ok = first.await.unwrap().unwrap();
        assert!(Status::from_header_map(ok.headers()).is_none());
        // The slot is free again.
        let again = tokio::spawn(svc.ready().await.unwrap().call(request("/a/B")));
        tokio::task::yield_now().await;
        gate.notify_one();
        let again = again.await.unwrap().unwrap();
        assert!(Status::from_header_map(again.headers()).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_holds_no_slot_and_is_cut_off() {
        let inner = tower::service_fn(|_: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let mut svc = tower::Layer::layer(&layer(1, 4), inner);
        // A body that never ends.
        let (_sender, body) = {
            let (tx, rx) = tokio::sync::mpsc::channel::<
                Result<http_body::Frame<<Body as http_body::Body>::Data>, Status>,
            >(1);
            (
                tx,
                http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            )
        };
        let slow = http::Request::builder()
            .uri("/a/B")
            .body(Body::new(body))
            .unwrap();
        let slow = tokio::spawn(svc.ready().await.unwrap().call(slow));
        tokio::task::yield_now().await;
        // Meanwhile a whole request is served: the trickling one holds no slot.
        let ok = svc
            .ready()
            .await
            .unwrap()
            .call(request("/a/B"))
            .await
            .unwrap();
        assert_eq!(code(&ok), None);
        let cut = slow.await.unwrap().unwrap();
        assert_eq!(code(&cut), Some(tonic::Code::DeadlineExceeded));
    }

    type Frames = tokio::sync::mpsc::Sender<
        Result<http_body::Frame<<Body as http_body::Body>::Data>, Status>,
    >;

    /// A body that stays open while its sender lives.
    fn open_body() -> (Frames, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        (tx, Body::new(body))
    }

    #[tokio::test]
    async fn health_watch_and_reflection_streams_hold_a_stream_slot_for_their_life() {
        let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
        let inner = {
            let senders = senders.clone();
            tower::service_fn(move |_: http::Request<Body>| {
                let (tx, body) = open_body();
                senders.lock().unwrap().push(tx);
                async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
            })
        };
        let mut svc = tower::Layer::layer(&layer(8, 1), inner);
        let watch = svc
            .ready()
            .await
            .unwrap()
            .call(request("/grpc.health.v1.Health/Watch"))
            .await
            .unwrap();
        assert_eq!(code(&watch), None);
        let refused = svc
            .ready()
            .await
            .unwrap()
            .call(request(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            ))
            .await
            .unwrap();
        assert_eq!(code(&refused), Some(tonic::Code::ResourceExhausted));
        // The stream ends: its slot comes back.
        drop(watch);
        let again = svc
            .ready()
            .await
            .unwrap()
            .call(request(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            ))
            .await
            .unwrap();
        assert_eq!(code(&again), None);
    }

    #[test]
    fn stream_slots_count_and_refuse() {
        let slots = StreamSlots::new(2);
        let a = slots.acquire(None).unwrap();
        let _b = slots.acquire(None).unwrap();
        assert_eq!(slots.in_use(), 2);
        let e = slots.acquire(None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        drop(a);
        assert!(slots.acquire(None).is_ok());
    }
}
