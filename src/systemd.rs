//! systemd's notify protocol: READY=1 once the store is open, listeners are bound and the
//! first inventory is read; STATUS= with a one-line summary; WATCHDOG=1 only while the
//! reconciler is alive; STOPPING=1 on shutdown. Without NOTIFY_SOCKET every call is a no-op.

use sd_notify::NotifyState;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

/// READY=1 plus a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// STOPPING=1.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// The watchdog interval systemd asked for (WATCHDOG_USEC), if any.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

/// What the watchdog watches: a loop that answers a probe while it goes round, and a one-line
/// status for STATUS=.
pub trait Watched {
    /// Whether the loop answered within `limit`.
    fn probe(&self, limit: Duration) -> impl Future<Output = bool> + Send;
    /// The one-line summary STATUS= shows.
    fn status_line(&self) -> String;
}

/// Pets the watchdog at half its interval, each time only after the watched loop (the
/// reconciler) answered a probe (it went round its loop), and refreshes STATUS= when it
/// changes. A stuck loop stops the pets and systemd restarts the service.
pub async fn watchdog(
    agent: impl Watched,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval / 2);
    let mut last_status = String::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !agent.probe(interval / 4).await {
            tracing::error!("reconciler did not answer the watchdog probe; withholding WATCHDOG=1");
            continue;
        }
        let status = agent.status_line();
        if status != last_status {
            send(&[NotifyState::Watchdog, NotifyState::Status(&status)]);
            last_status = status;
        } else {
            send(&[NotifyState::Watchdog]);
        }
    }
}
