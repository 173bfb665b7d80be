//! Listeners and the gRPC server: the unix socket always, TCP when configured.

use super::auth::{ClientAllowlist, Gate};
use super::limits::{self, InFlightLimitLayer};
use super::partitions::PartitionsService;
use super::socket_guard;
use super::AgentService;
use crate::config::ListenConfig;
use crate::proto::agent::fabric_agent_server::FabricAgentServer;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Why serving failed.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Binding a listener failed.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// The address or path.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A live agent already answers on the unix socket: its socket is not replaced.
    #[error("another fabric-agent is serving on {0}; refusing to replace its socket (stop it, or give this one another [listen] unix_socket)")]
    SocketInUse(String),
    /// TLS material could not be loaded.
    #[error("TLS: {0}")]
    Tls(String),
    /// The server failed while running.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Bound listeners (bound before READY=1, so clients can connect as soon as systemd says so).
pub struct Listeners {
    unix: UnixListener,
    unix_path: PathBuf,
    unix_mode: u32,
    tcp: Option<(TcpListener, Option<(ServerTlsConfig, ClientAllowlist)>)>,
}

impl Listeners {
    /// Binds the unix socket (replacing a stale one, mode from config) and TCP if configured.
    pub async fn bind(config: &ListenConfig) -> Result<Listeners, ServeError> {
        let path = config.unix_socket.clone();
        let bind_err = |source| ServeError::Bind {
            what: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(bind_err)?;
        }
        // Only a stale socket (nobody answers) is replaced; a live agent's is left alone.
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Err(ServeError::SocketInUse(path.display().to_string()));
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(bind_err(e)),
        }
        let mode = config.socket_mode().unwrap_or(0o660);
        let unix = socket_guard::bind(&path, mode).map_err(bind_err)?;
        let tcp = match config.tcp {
            None => None,
            Some(addr) => {
                let listener =
                    TcpListener::bind(addr)
                        .await
                        .map_err(|source| ServeError::Bind {
                            what: addr.to_string(),
                            source,
                        })?;
                let tls = match &config.tls {
                    None => None,
                    Some(t) => {
                        crate::tls::install_crypto_provider();
                        let read = |p: &PathBuf| {
                            std::fs::read(p)
                                .map_err(|e| ServeError::Tls(format!("{}: {e}", p.display())))
                        };
                        let tls = ServerTlsConfig::new()
                            .identity(Identity::from_pem(read(&t.cert)?, read(&t.key)?))
                            .client_ca_root(Certificate::from_pem(read(&t.client_ca)?))
                            // Accept certificate-less handshakes so they get a clear
                            // UNAUTHENTICATED status instead of a TLS alert.
                            .client_auth_optional(true);
                        Some((tls, ClientAllowlist::new(t.allowed_clients.clone())))
                    }
                };
                Some((listener, tls))
            }
        };
        Ok(Listeners {
            unix,
            unix_path: path,
            unix_mode: mode,
            tcp,
        })
    }

    /// The TCP address actually bound (useful with port 0).
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }
}

/// Serves FabricAgent (plus, on an OpenSM SM host, `fabric.sm.v1.Partitions`) until `shutdown` turns true, then drains in-flight calls and removes the socket.
pub async fn serve(
    listeners: Listeners,
    agent: AgentService,
    partitions: Option<PartitionsService>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_serving::<FabricAgentServer<AgentService>>()
        .await;
    let bounds = agent.limits().clone();
    let agent = Arc::new(agent);
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("embedded descriptor set is valid");
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("embedded descriptor set is valid");
    let routes = |gate: Gate| -> Routes {
        let mut b = RoutesBuilder::default();
        b.add_service(InterceptedService::new(
            FabricAgentServer::from_arc(agent.clone()),
            gate.clone(),
        ));
        b.add_service(InterceptedService::new(health_svc.clone(), gate.clone()));
        b.add_service(InterceptedService::new(reflection_v1.clone(), gate.clone()));
        b.add_service(InterceptedService::new(
            reflection_v1alpha.clone(),
            gate.clone(),
        ));
        if let Some(p) = &partitions {
            b.add_service(InterceptedService::new(p.clone().into_server(), gate));
        }
        b.routes()
    };
    let signal = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let owned = socket_guard::OwnedSocket::default();
    let unix_incoming = socket_guard::incoming(
        listeners.unix,
        listeners.unix_path.clone(),
        listeners.unix_mode,
        shutdown.clone(),
        owned.clone(),
    );
    let unix = limits::builder(&bounds)
        .layer(InFlightLimitLayer::new(
            bounds.max_in_flight_requests,
            "the unix socket",
        ))
        .add_routes(routes(Gate::Open))
        .serve_with_incoming_shutdown(unix_incoming, signal(shutdown.clone()));
    let tcp = async {
        match listeners.tcp {
            None => Ok(()),
            Some((listener, tls)) => {
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                let (builder, gate) = match tls {
                    Some((cfg, list)) => (
                        limits::builder(&bounds).tls_config(cfg)?,
                        Gate::Allowlist(list),
                    ),
                    None => (limits::builder(&bounds), Gate::Open),
                };
                builder
                    .layer(InFlightLimitLayer::new(
                        bounds.max_in_flight_requests,
                        "the TCP listener",
                    ))
                    .add_routes(routes(gate))
                    .serve_with_incoming_shutdown(incoming, signal(shutdown.clone()))
                    .await
            }
        }
    };
    let result = tokio::try_join!(unix, tcp);
    let _ = shutdown.wait_for(|s| *s).await;
    // Only the socket this daemon bound is removed: a path taken over by another process
    // meanwhile is not ours to delete.
    if owned.is_ours(&listeners.unix_path) {
        let _ = std::fs::remove_file(&listeners.unix_path);
    }
    result.map(|_| ()).map_err(ServeError::from)
}
