//! `fabric-agent serve`: the daemon's life from config to drained exit.

use super::preflight::Preflight;
use super::LogControl;
use crate::agent::Agent;
use crate::api::{serve, AgentService, ServeError};
use crate::config::Config;
use crate::daemon::{self, Bound, Daemon};
use crate::systemd;
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const DRAIN: Duration = Duration::from_secs(10);

/// Runs the daemon until SIGTERM or SIGINT; SIGHUP reloads what can change in place.
pub async fn run(config_path: &Path, log: LogControl) -> ExitCode {
    let config = match super::loaded::load(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // Every configuration problem is exit 64, found before anything is bound or opened.
    if !preflight_passes(&config) {
        return ExitCode::from(super::exit::CONFIG);
    }
    if let Err(e) = log.apply(config.log.filter.as_deref()) {
        tracing::warn!(error = %e, "cannot apply [log] filter");
    }
    let Some(mut signals) = Signals::install() else {
        eprintln!("error: cannot install signal handlers");
        return ExitCode::from(super::exit::OS_ERROR);
    };
    let built = match daemon::build(&config) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    // The socket is bound and served from the start, even when no port can be read: a
    // daemon that cannot see its ports must still answer `node` and `doctor` and say why.
    let partitions = built.partitions();
    let peer_sync = built.sync.clone();
    let sm_reload = built.sm_reload();
    let peers_config = config.subnet_manager.opensm_ha.clone();
    let Daemon {
        agent,
        opensm,
        store,
        ..
    } = built;
    let Bound {
        grpc: listeners,
        metrics,
    } = match daemon::bind(&config).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    let tls = listeners.tls_reloader();
    let access = listeners.tls_access();
    let (stop, stopped) = watch::channel(false);
    if let Some(listener) = metrics {
        tokio::spawn(crate::api::metrics::serve(
            listener,
            agent.clone(),
            opensm.clone(),
            peer_sync.clone(),
            stopped.clone(),
        ));
    }
    first_inventory(&agent, &config).await;
    let reconciler = agent.reconcile(stopped.clone());
    let mut server = tokio::spawn(serve(
        listeners,
        AgentService::with_limits(
            agent.clone(),
            config.node_id.to_string(),
            config.limits.clone(),
        )
        .with_sm_host(peer_sync.clone()),
        partitions,
        stopped.clone(),
    ));
    let metrics_at = if config.metrics.enabled {
        format!("http://{}/metrics", config.metrics.addr())
    } else {
        "off ([metrics] enabled = false)".to_owned()
    };
    // An SM host with peers catches up before READY: its OpenSM (ordered after the agent)
    // must not read a region that holds sets nobody confirmed (docs/OPENSM.md).
    if let (Some(sync), Some(ha)) = (&peer_sync, &peers_config) {
        sync.catch_up(ha.catch_up_timeout()).await;
        tokio::spawn(sync.clone().run(ha.sync_interval(), stopped.clone()));
    }
    // A store found restored from a copy: its fail-closed region goes into the partitions
    // file before OpenSM (ordered after the agent) reads a file that may be as old as the store.
    if let Some(o) = &opensm {
        if let Err(e) = o.render_after_restore(store.rolled_back()).await {
            tracing::warn!(error = %e, "rendering the partitions file after a store restore");
        }
    }
    // `ready` is said when it is true: after the catch-up (or its timeout, which leaves
    // SM_HOST_NOT_CAUGHT_UP standing), together with READY=1.
    tracing::info!(
        node = %config.node_id,
        fabric = %config.fabric.as_str(),
        socket = %config.listen.unix_socket.display(),
        tcp = %config.listen.tcp.map(|a| a.to_string()).unwrap_or_else(|| "off".to_owned()),
        metrics = %metrics_at,
        "ready"
    );
    systemd::ready(&agent.status_line());
    // The pets start after READY=1: the watchdog's first tick is immediate, and a pet sent
    // before READY tells systemd nothing it can use.
    if let Some(interval) = systemd::watchdog_interval() {
        tokio::spawn(systemd::watchdog(agent.clone(), interval, stopped.clone()));
    }
    let reload = Reload {
        config_path,
        parts: super::reload::Reloadable {
            log: &log,
            tls: tls.as_ref(),
            access: access.as_ref(),
            sm: Some(&sm_reload),
        },
        running: std::sync::Mutex::new(config.clone()),
    };
    let failed = signals.serve_until_stopped(&mut server, &reload).await;
    systemd::stopping();
    tracing::info!("stopping: draining calls");
    agent.begin_shutdown();
    let _ = stop.send(true);
    let server_drained = !failed && tokio::time::timeout(DRAIN, server).await.is_ok();
    if !failed && !server_drained {
        tracing::warn!("calls still running after {DRAIN:?}; exiting anyway");
    }
    // A clean stop only when nothing can append another event: the next start keeps the
    // log's epoch (otherwise it opens a new one: src/store/life.rs).
    if tokio::time::timeout(DRAIN, reconciler).await.is_ok() && server_drained {
        if let Err(e) = agent.stopped_cleanly().await {
            tracing::warn!(error = %e, "recording the clean stop failed: the next start opens a new log epoch");
        }
    }
    tracing::info!("stopped");
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs every check `serve` needs before it binds; prints and logs each failure.
fn preflight_passes(config: &Config) -> bool {
    let preflight = Preflight::run(config);
    for c in preflight.failures() {
        eprintln!("error: {}: {}", c.check, c.detail);
        tracing::error!(
            check = c.check.as_str(),
            detail = c.detail.as_str(),
            "configuration"
        );
    }
    preflight.ok()
}

/// Reads the ports once before READY, so the node view has them from the first call. A
/// failure is logged loudly and the daemon serves anyway: the reconciler reads again on every
/// pass, and `node` / `doctor` say what is missing.
async fn first_inventory(agent: &Agent, config: &Config) {
    match agent.read_ports().await {
        Ok(inv) => tracing::info!(
            ports = inv.ports.len(),
            fabric_ports = inv.fabric_ports().count(),
            "ports read"
        ),
        Err(e) => tracing::error!(
            error = %e,
            observer = %super::loaded::observer_name(config),
            "cannot read the ports; serving anyway (no state changes until they are read; \
             `fabric-agent doctor` says why)"
        ),
    }
}

/// The watchdog watches the reconciler.
impl systemd::Watched for Agent {
    fn probe(&self, limit: Duration) -> impl Future<Output = bool> + Send {
        self.probe_reconciler(limit)
    }

    fn status_line(&self) -> String {
        Agent::status_line(self)
    }
}

/// What a SIGHUP re-reads.
struct Reload<'a> {
    config_path: &'a Path,
    parts: super::reload::Reloadable<'a>,
    /// The configuration in effect: the start-up one, with what SIGHUP applied since.
    running: std::sync::Mutex<Config>,
}

impl Reload<'_> {
    /// SIGHUP never ends the daemon: it re-reads the log filter, the TLS material and the mTLS
    /// allowlists, and logs which other settings changed and need a restart.
    fn on_sighup(&self) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        super::reload::on_sighup(self.config_path, &self.parts, &mut running);
    }
}

/// The signals the daemon acts on.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers; `None` when the runtime refuses.
    fn install() -> Option<Signals> {
        Some(Signals {
            term: signal(SignalKind::terminate()).ok()?,
            int: signal(SignalKind::interrupt()).ok()?,
            hup: signal(SignalKind::hangup()).ok()?,
        })
    }

    /// Serves (reloading on SIGHUP) until SIGTERM/SIGINT (false) or until the gRPC server
    /// stops on its own (true: a failure).
    async fn serve_until_stopped(
        &mut self,
        server: &mut JoinHandle<Result<(), ServeError>>,
        reload: &Reload<'_>,
    ) -> bool {
        loop {
            tokio::select! {
                _ = self.term.recv() => return false,
                _ = self.int.recv() => return false,
                _ = self.hup.recv() => reload.on_sighup(),
                r = &mut *server => {
                    tracing::error!(result = ?r, "gRPC server stopped unexpectedly");
                    return true;
                }
            }
        }
    }
}
