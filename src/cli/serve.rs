//! `fabric-agent serve`: the daemon's life from config to drained exit.

use super::preflight::Preflight;
use super::LogControl;
use crate::agent::Agent;
use crate::api::{serve, AgentService, ServeError, TlsReloader};
use crate::config::Config;
use crate::daemon::{self, Bound, Daemon};
use crate::systemd;
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
        return ExitCode::from(71);
    };
    let built = match daemon::build(&config) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    let partitions = built.partitions();
    let Daemon { agent, opensm, .. } = built;
    if !first_inventory(&agent, &mut signals).await {
        return ExitCode::SUCCESS;
    }
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
    let (stop, stopped) = watch::channel(false);
    if let Some(listener) = metrics {
        tokio::spawn(crate::api::metrics::serve(
            listener,
            agent.clone(),
            opensm.clone(),
            stopped.clone(),
        ));
    }
    let reconciler = agent.reconcile(stopped.clone());
    let mut server = tokio::spawn(serve(
        listeners,
        AgentService::with_limits(
            agent.clone(),
            config.node_id.to_string(),
            config.limits.clone(),
        ),
        partitions,
        stopped.clone(),
    ));
    tracing::info!(node = %config.node_id, fabric = %config.fabric.as_str(), socket = %config.listen.unix_socket.display(), "ready");
    systemd::ready(&agent.status_line());
    // The pets start after READY=1: the watchdog's first tick is immediate, and a pet sent
    // before READY tells systemd nothing it can use.
    if let Some(interval) = systemd::watchdog_interval() {
        tokio::spawn(systemd::watchdog(agent.clone(), interval, stopped.clone()));
    }
    let reload = Reload {
        config_path,
        log: &log,
        tls: tls.as_ref(),
    };
    let failed = signals.serve_until_stopped(&mut server, &reload).await;
    systemd::stopping();
    tracing::info!("stopping: draining calls");
    agent.begin_shutdown();
    let _ = stop.send(true);
    if !failed && tokio::time::timeout(DRAIN, server).await.is_err() {
        tracing::warn!("calls still running after {DRAIN:?}; exiting anyway");
    }
    let _ = tokio::time::timeout(DRAIN, reconciler).await;
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

/// READY waits for the first inventory: keeps trying (the observer may come up late), backing
/// off to 10 s, until the ports are read (true) or SIGTERM/SIGINT says stop (false).
async fn first_inventory(agent: &Agent, signals: &mut Signals) -> bool {
    let mut delay = Duration::from_millis(200);
    loop {
        match agent.read_ports().await {
            Ok(inv) => {
                tracing::info!(
                    ports = inv.ports.len(),
                    fabric_ports = inv.fabric_ports().count(),
                    "ports read"
                );
                return true;
            }
            Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "reading ports failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = signals.stop() => return false,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// What a SIGHUP re-reads.
struct Reload<'a> {
    config_path: &'a Path,
    log: &'a LogControl,
    tls: Option<&'a TlsReloader>,
}

impl Reload<'_> {
    /// SIGHUP never ends the daemon: it re-reads the log filter and the TLS material;
    /// everything else takes effect on restart.
    fn on_sighup(&self) {
        super::reload::on_sighup(self.config_path, self.log);
        match self.tls.map(TlsReloader::reload) {
            Some(Ok(loaded)) => tracing::info!(%loaded, "SIGHUP: TLS material reloaded"),
            Some(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: TLS reload failed; the previous material stays in use")
            }
            None => {}
        }
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

    /// Resolves at SIGTERM or SIGINT.
    async fn stop(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
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
