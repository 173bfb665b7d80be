//! The Prometheus endpoint: `GET /metrics` (OpenMetrics text) on its own TCP listener.

use crate::agent::Agent;
use crate::sm::OpenSmBackend;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::sync::watch;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds the metrics listener (before READY, like the gRPC listeners).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `/metrics` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    agent: Agent,
    opensm: Option<OpenSmBackend>,
    sync: Option<std::sync::Arc<crate::sm::opensm::sync::PeerSync>>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let agent = agent.clone();
            let sweeps = opensm.as_ref().map(OpenSmBackend::sweeps);
            let sync = sync.clone();
            async move {
                let mut text = agent.metrics_text(sweeps);
                if let Some(s) = &sync {
                    text = super::sm_v1::metrics::append(text, &s.status());
                }
                ([(CONTENT_TYPE, OPENMETRICS)], text).into_response()
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
}
