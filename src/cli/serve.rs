//! `fabric-agent serve`: the daemon's life from config to drained exit.

use super::preflight::Preflight;
use super::LogControl;
use crate::api::{serve, AgentService};
use crate::config::Config;
use crate::daemon::{self, Bound, Daemon};
use crate::systemd;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

const DRAIN: Duration = Duration::from_secs(10);

/// Runs the daemon until SIGTERM or SIGINT; SIGHUP reloads what can change in place.
pub async fn run(config_path: &Path, log: LogControl) -> ExitCode {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::exit::CONFIG);
        }
    };
    // Every configuration problem is exit 64, found before anything is bound or opened.
    let preflight = Preflight::run(&config);
    if !preflight.ok() {
        for c in preflight.failures() {
            eprintln!("error: {}: {}", c.check, c.detail);
            tracing::error!(
                check = c.check.as_str(),
                detail = c.detail.as_str(),
                "configuration"
            );
        }
        return ExitCode::from(super::exit::CONFIG);
    }
    if let Err(e) = log.apply(config.log.filter.as_deref()) {
        tracing::warn!(error = %e, "cannot apply [log] filter");
    }
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("error: cannot install signal handlers");
        return ExitCode::from(71);
    };
    let Daemon { agent, opensm, .. } = match daemon::build(&config) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    // READY waits for the first inventory; keep trying (observer may come up late) unless told
    // to stop.
    let mut delay = Duration::from_millis(200);
    loop {
        match agent.read_ports().await {
            Ok(inv) => {
                tracing::info!(
                    ports = inv.ports.len(),
                    fabric_ports = inv.fabric_ports().count(),
                    "ports read"
                );
                break;
            }
            Err(e) => tracing::warn!(error = %e, retry_in = ?delay, "reading ports failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = term.recv() => return ExitCode::SUCCESS,
            _ = int.recv() => return ExitCode::SUCCESS,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
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
    let partitions = opensm.map(crate::api::partitions::PartitionsService::new);
    let server = tokio::spawn(serve(
        listeners,
        AgentService::with_limits(
            agent.clone(),
            config.node_id.to_string(),
            config.limits.clone(),
        ),
        partitions,
        stopped.clone(),
    ));
    if let Some(interval) = systemd::watchdog_interval() {
        tokio::spawn(systemd::watchdog(agent.clone(), interval, stopped.clone()));
    }
    tracing::info!(node = %config.node_id, fabric = %config.fabric.as_str(), socket = %config.listen.unix_socket.display(), "ready");
    systemd::ready(&agent.status_line());
    let mut server = server;
    let failed = loop {
        tokio::select! {
            _ = term.recv() => break false,
            _ = int.recv() => break false,
            _ = hup.recv() => {
                // SIGHUP never ends the daemon: it re-reads the log filter and the TLS
                // material; everything else takes effect on restart.
                super::reload::on_sighup(config_path, &log);
                match tls.as_ref().map(|t| t.reload()) {
                    Some(Ok(loaded)) => tracing::info!(%loaded, "SIGHUP: TLS material reloaded"),
                    Some(Err(e)) => tracing::error!(error = %e, "SIGHUP: TLS reload failed; the previous material stays in use"),
                    None => {}
                }
            }
            r = &mut server => {
                tracing::error!(result = ?r, "gRPC server stopped unexpectedly");
                break true;
            }
        }
    };
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
