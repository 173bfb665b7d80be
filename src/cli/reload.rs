//! SIGHUP: what the daemon reloads in place — the log filter from the config file (unless
//! `FABRIC_AGENT_LOG` pins it) — and what it leaves for a restart, each change named in the
//! log.

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

/// A setting SIGHUP compared: its name and whether it is applied in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The dotted setting (`log.filter`, `metrics`, `listen.tls`, ...).
    pub setting: &'static str,
    /// Whether SIGHUP applies it (else it takes effect on restart).
    pub in_place: bool,
}

/// The settings that differ between the running configuration and the file's, each with
/// whether SIGHUP applies it in place (see `config::reference::RELOADED_ON_SIGHUP`).
pub fn changed(running: &Config, file: &Config) -> Vec<Changed> {
    fn same<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }
    let listen_rest = |c: &Config| {
        let mut l = c.listen.clone();
        l.tls = None;
        l
    };
    let candidates: [(&'static str, bool, bool); 15] = [
        ("log.filter", true, same(&running.log, &file.log)),
        (
            "listen.tls",
            true,
            same(&running.listen.tls, &file.listen.tls),
        ),
        (
            "listen",
            false,
            same(&listen_rest(running), &listen_rest(file)),
        ),
        ("node_id", false, running.node_id == file.node_id),
        ("fabric", false, same(&running.fabric, &file.fabric)),
        ("state_dir", false, running.state_dir == file.state_dir),
        (
            "subnet_manager",
            false,
            same(&running.subnet_manager, &file.subnet_manager),
        ),
        ("observer", false, same(&running.observer, &file.observer)),
        ("ports", false, same(&running.ports, &file.ports)),
        ("events", false, same(&running.events, &file.events)),
        (
            "reconciler",
            false,
            same(&running.reconciler, &file.reconciler),
        ),
        (
            "allow_full_default",
            false,
            running.allow_full_default == file.allow_full_default,
        ),
        ("metrics", false, same(&running.metrics, &file.metrics)),
        ("limits", false, same(&running.limits, &file.limits)),
        ("grants", false, same(&running.grants, &file.grants)),
    ];
    candidates
        .into_iter()
        .filter(|(_, _, unchanged)| !unchanged)
        .map(|(setting, in_place, _)| Changed { setting, in_place })
        .collect()
}

/// Handles one SIGHUP: re-reads the config file, applies what can change in place (the log
/// filter here; the caller reloads TLS) and logs which settings changed, which were applied
/// and which need a restart. A file that no longer validates changes nothing. Never ends the
/// process. Returns the file's configuration when it loaded.
pub fn on_sighup(config_path: &Path, log: &LogControl, running: &Config) -> Option<Config> {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: the config file does not validate; nothing reloaded");
            return None;
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
    let changes = changed(running, &config);
    let names = |in_place: bool| {
        changes
            .iter()
            .filter(|c| c.in_place == in_place)
            .map(|c| c.setting)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (applied, restart) = (names(true), names(false));
    if changes.is_empty() {
        tracing::info!("SIGHUP: no setting changed");
    }
    if !applied.is_empty() {
        tracing::info!(
            settings = applied.as_str(),
            "SIGHUP: changed and applied: {applied}"
        );
    }
    if !restart.is_empty() {
        tracing::warn!(
            settings = restart.as_str(),
            "SIGHUP: changed, NOT applied until a restart (systemctl restart fabric-agent): {restart}"
        );
    }
    Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!("node_id = \"n1\"\nfabric = \"f\"\n{extra}");
        Config::parse(&text, Path::new("test.toml")).unwrap()
    }

    #[test]
    fn sighup_tells_applied_settings_from_restart_ones() {
        let running = config("[log]\nfilter = \"info\"\n");
        assert_eq!(changed(&running, &running.clone()), vec![]);
        let file = config(
            "[log]\nfilter = \"debug\"\n[metrics]\nenabled = true\n[events]\nretain = 5000\n",
        );
        let got = changed(&running, &file);
        assert_eq!(
            got,
            vec![
                Changed {
                    setting: "log.filter",
                    in_place: true
                },
                Changed {
                    setting: "events",
                    in_place: false
                },
                Changed {
                    setting: "metrics",
                    in_place: false
                },
            ]
        );
    }
}
