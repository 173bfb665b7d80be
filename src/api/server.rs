//! Listeners and the gRPC server: the unix socket always (callers checked by SO_PEERCRED), TCP
//! when configured (mTLS with per-service allowlists and reloadable TLS material, or plaintext
//! loopback on a test rig).

use super::agent_v1::AgentService;
use super::gate::conn_limits::ConnLimits;
use super::gate::limits::InFlightLimitLayer;
use super::gate::quota::{Bounds, Quota, Reserve};
use super::gate::socket_guard;
use super::gate::{Guarded, LiveTlsAccess, LocalPolicy, Policy, TlsService};
use super::server_tls::TlsReloader;
use super::settings::{LimitsConfig, ListenConfig};
use super::sm_v1::PartitionsService;
use crate::proto::agent::fabric_agent_server::FabricAgentServer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

/// A server builder with the request timeout, the keepalive bounds and the HTTP/2 stream
/// bound of `limits`. Every connection announces SETTINGS_MAX_CONCURRENT_STREAMS = the stream
/// limit plus the in-flight limit: a client then knows it may multiplex that many calls (h2
/// clients otherwise assume 100 and queue the rest), and the agent's own limits, not HTTP/2,
/// decide what is refused.
fn builder(limits: &LimitsConfig) -> Server {
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
    Tls(#[from] super::server_tls::TlsLoadError),
    /// A TCP listener without TLS (and without the test-only plaintext switch).
    #[error("TLS: TCP needs [listen.tls] or insecure_plaintext_for_tests")]
    TcpWithoutTls,
    /// The unix socket's caller policy could not be set up.
    #[error("unix socket policy: listen.read_group: {0}")]
    Policy(#[from] crate::sys::users::GroupError),
    /// The server failed while running.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

enum TcpMode {
    Tls(TlsReloader, LiveTlsAccess),
    InsecureTest,
}

/// Bound listeners (bound before READY=1, so clients can connect as soon as systemd says so).
pub struct Listeners {
    unix: UnixListener,
    unix_path: PathBuf,
    unix_access: socket_guard::SocketAccess,
    local: LocalPolicy,
    tcp: Option<(TcpListener, TcpMode)>,
}

impl Listeners {
    /// Binds the unix socket (replacing a stale one, mode from config) and TCP if configured;
    /// loads the TLS material and the callers' policies.
    pub async fn bind(config: &ListenConfig) -> Result<Listeners, ServeError> {
        let local = LocalPolicy::new(config.read_group.as_deref(), &config.allowed_uids)?;
        let tls = match &config.tls {
            None => None,
            Some(t) => {
                let lists = LiveTlsAccess::new(t.access());
                let (reloader, loaded) = TlsReloader::load(t)?;
                tracing::info!(%loaded, "TLS material loaded");
                if let Err(e) = reloader.watch_files() {
                    tracing::warn!(error = %e, "cannot watch the TLS files for changes; SIGHUP reloads them");
                }
                Some((reloader, lists))
            }
        };
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
        let access = socket_guard::SocketAccess {
            mode: config.socket_mode(),
            group: local.read_gid(),
        };
        let unix = socket_guard::bind(&path, access).map_err(bind_err)?;
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
                let mode = match tls {
                    Some((reloader, lists)) => TcpMode::Tls(reloader, lists),
                    None if config.insecure_plaintext_for_tests => {
                        tracing::warn!(%addr, "UNSAFE: plaintext gRPC without caller checks (insecure_plaintext_for_tests)");
                        TcpMode::InsecureTest
                    }
                    None => return Err(ServeError::TcpWithoutTls),
                };
                Some((listener, mode))
            }
        };
        Ok(Listeners {
            unix,
            unix_path: path,
            unix_access: access,
            local,
            tcp,
        })
    }

    /// The handle that re-reads the TCP listener's certificate, key and client CA bundle
    /// (SIGHUP); None without TLS.
    pub fn tls_reloader(&self) -> Option<TlsReloader> {
        match &self.tcp {
            Some((_, TcpMode::Tls(r, _))) => Some(r.clone()),
            _ => None,
        }
    }

    /// The TCP listener's allowlists and node mapping in effect, which SIGHUP replaces; None
    /// without TLS.
    pub fn tls_access(&self) -> Option<LiveTlsAccess> {
        match &self.tcp {
            Some((_, TcpMode::Tls(_, access))) => Some(access.clone()),
            _ => None,
        }
    }
}

/// The policy of each service on one listener.
struct Policies {
    agent: Policy,
    partitions: Policy,
    other: Policy,
}

impl Policies {
    fn same(p: Policy) -> Policies {
        Policies {
            agent: p.clone(),
            partitions: p.clone(),
            other: p,
        }
    }

    fn tls(access: &LiveTlsAccess) -> Policies {
        let policy = |service| Policy::LiveTls {
            access: access.clone(),
            service,
        };
        Policies {
            agent: policy(TlsService::Agent),
            partitions: policy(TlsService::Partitions),
            // Health and reflection: anyone on any list.
            other: policy(TlsService::Other),
        }
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
    // Without TLS no certificate calls, and the default mapping is never consulted.
    let partitions = match listeners.tls_access() {
        Some(access) => partitions.map(|p| p.with_live_node_mapping(access)),
        None => partitions,
    };
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
    let routes = |p: Policies| -> Routes {
        let mut b = RoutesBuilder::default();
        b.add_service(Guarded::new(
            FabricAgentServer::from_arc(agent.clone()),
            p.agent,
        ));
        b.add_service(Guarded::new(health_svc.clone(), p.other.clone()));
        b.add_service(Guarded::new(reflection_v1.clone(), p.other.clone()));
        b.add_service(Guarded::new(reflection_v1alpha.clone(), p.other));
        if let Some(svc) = &partitions {
            b.add_service(Guarded::new(svc.clone().into_server(), p.partitions));
        }
        b.routes()
    };
    let signal = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let streams = agent.stream_slots();
    let reserve = Reserve::new(
        listeners.tls_access(),
        partitions
            .as_ref()
            .map(|p| p.peer_identities().clone())
            .unwrap_or_default(),
    );
    let in_flight = |listener: &str, conns: Option<ConnLimits>| {
        InFlightLimitLayer::new(
            bounds.max_in_flight_requests,
            listener,
            Duration::from_secs(bounds.request_body_secs),
            streams.clone(),
        )
        .with_identities(reserve.clone(), conns)
    };
    let owned = socket_guard::OwnedSocket::default();
    let unix_incoming = socket_guard::incoming(
        listeners.unix,
        listeners.unix_path.clone(),
        listeners.unix_access,
        shutdown.clone(),
        owned.clone(),
    );
    let unix = builder(&bounds)
        .layer(in_flight("the unix socket", None))
        .add_routes(routes(Policies::same(Policy::Local(listeners.local))))
        .serve_with_incoming_shutdown(unix_incoming, signal(shutdown.clone()));
    let tcp = async {
        match listeners.tcp {
            None => Ok(()),
            Some((listener, TcpMode::Tls(reloader, lists))) => {
                let conns = ConnLimits::new(
                    bounds.max_connections,
                    bounds.max_unauthenticated_per_address,
                    Duration::from_secs(bounds.unauthenticated_secs),
                    Duration::from_secs(
                        bounds
                            .max_connection_age_secs
                            .saturating_add(bounds.request_timeout_secs),
                    ),
                )
                .with_identity_quota(
                    Quota::new(Bounds {
                        total: bounds.max_connections,
                        per_holder: bounds.max_connections_per_identity(),
                        reserved: bounds.reserved_connections(),
                        what: "TCP connections",
                        keys: [
                            "max_connections",
                            "max_connections_per_identity",
                            "reserved_connections",
                        ],
                    }),
                    reserve.clone(),
                );
                let incoming = tokio_stream::wrappers::ReceiverStream::new(
                    reloader.incoming(listener, conns.clone()),
                );
                builder(&bounds)
                    // GOAWAY at the age; the connection's own deadline (age + the request
                    // timeout) ends it if a stream outlives that. (tonic's grace setting would
                    // skip the GOAWAY and only cut the connection at age + grace.)
                    .max_connection_age(Duration::from_secs(bounds.max_connection_age_secs))
                    .layer(in_flight("the TCP listener", Some(conns)))
                    .add_routes(routes(Policies::tls(&lists)))
                    .serve_with_incoming_shutdown(incoming, signal(shutdown.clone()))
                    .await
            }
            Some((listener, TcpMode::InsecureTest)) => {
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                builder(&bounds)
                    .layer(in_flight("the TCP listener", None))
                    .add_routes(routes(Policies::same(Policy::InsecureTest)))
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
