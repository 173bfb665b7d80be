//! SIGHUP: what the daemon reloads in place — the log filter from the config file (unless
//! `FABRIC_AGENT_LOG` pins it) — and what it leaves for a restart.

use crate::config::Config;
use std::path::Path;

/// Why a reload step failed.
pub type ReloadError = Box<dyn std::error::Error + Send + Sync>;

/// Replaces the process's log filter.
type SetFilter = Box<dyn Fn(&str) -> Result<(), ReloadError> + Send + Sync>;

/// The running log filter, as the binary installed it.
pub struct LogControl {
    set: SetFilter,
    pinned: Option<String>,
}

/// The filter the daemon logs with when neither the environment nor the config names one.
pub const DEFAULT_FILTER: &str = "info";

impl LogControl {
    /// A filter that `set` replaces; `pinned` is the `FABRIC_AGENT_LOG` value, which wins over
    /// the config file's `[log] filter`.
    pub fn new(
        set: impl Fn(&str) -> Result<(), ReloadError> + Send + Sync + 'static,
        pinned: Option<String>,
    ) -> LogControl {
        LogControl {
            set: Box::new(set),
            pinned,
        }
    }

    /// Applies the configured filter (default [`DEFAULT_FILTER`]) unless the environment pins
    /// one; returns the filter in effect and whether it came from the environment.
    pub fn apply(&self, configured: Option<&str>) -> Result<(String, bool), ReloadError> {
        if let Some(pinned) = &self.pinned {
            return Ok((pinned.clone(), true));
        }
        let filter = configured.unwrap_or(DEFAULT_FILTER);
        (self.set)(filter)?;
        Ok((filter.to_owned(), false))
    }
}

/// Handles one SIGHUP: re-reads the config file and applies what can change in place. A file
/// that no longer validates changes nothing. Never ends the process.
pub fn on_sighup(config_path: &Path, log: &LogControl) {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: the config file does not validate; nothing reloaded");
            return;
        }
    };
    match log.apply(config.log.filter.as_deref()) {
        Ok((filter, true)) => tracing::info!(
            filter = filter.as_str(),
            "SIGHUP: log filter kept: FABRIC_AGENT_LOG pins it"
        ),
        Ok((filter, false)) => {
            tracing::info!(filter = filter.as_str(), "SIGHUP: log filter reloaded")
        }
        Err(e) => tracing::warn!(error = %e, "SIGHUP: log filter not changed"),
    }
    tracing::info!(
        "SIGHUP: other settings (listeners, backend, observer, state) take effect on restart"
    );
}
