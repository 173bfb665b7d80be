//! The call gate as a tower layer: every service on every listener is wrapped in a [`Guarded`]
//! that asks the listener's [`Policy`] for the request's [`Caller`](super::Caller), refuses
//! callers it does not admit for the method (a refused mutating call gets an audit line), and
//! hands the `Caller` to the handlers through the request's extensions.

use super::audit;
use super::auth::CertIdentity;
use super::caller::{is_read_only, Policy};
use futures::future::BoxFuture;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tower::Service;

/// The peer of a refused request as its connection shows it (no verification implied).
fn peer_of<B>(request: &http::Request<B>) -> String {
    let ext = request.extensions();
    if let Some(cred) = ext.get::<UdsConnectInfo>().and_then(|i| i.peer_cred) {
        return format!("unix uid={}", cred.uid());
    }
    if let Some(tls) = ext.get::<TlsConnectInfo<TcpConnectInfo>>() {
        let addr = tls
            .get_ref()
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let first = tls
            .peer_certs()
            .and_then(|c| first_name(c.first()?.as_ref()))
            .unwrap_or_else(|| "(no certificate)".into());
        return format!("tls {addr} {first}");
    }
    "unknown".into()
}

/// A certificate's first name, unverified (for refusal lines only).
fn first_name(der: &[u8]) -> Option<String> {
    CertIdentity::names_unverified(der)
        .into_iter()
        .next()
        .map(|n| n.to_string())
}

/// A service behind a [`Policy`].
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S> Guarded<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, policy: Policy) -> Guarded<S> {
        Guarded {
            inner,
            policy: Arc::new(policy),
        }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Guarded<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        match self.policy.admit(&request) {
            Ok(caller) => {
                tracing::debug!(caller = %caller, path = request.uri().path(), "admitted");
                request.extensions_mut().insert(caller);
                Box::pin(self.inner.call(request))
            }
            Err(status) => {
                let path = request.uri().path();
                tracing::info!(path, code = ?status.code(), reason = status.message(), "call refused");
                if !is_read_only(path) {
                    audit::refused(&peer_of(&request), path, status.code());
                }
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}
