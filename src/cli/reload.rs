//! SIGHUP: what the daemon reloads in place — the log filter from the config file (unless
//! `FABRIC_AGENT_LOG` pins it), the mTLS listener's certificate, key and client CA bundle (the
//! files it was started with, re-read) and its allowlists and node mapping — and what it leaves
//! for a restart, each change named in the log as applied only once it is in effect.

use crate::api::gate::{LiveTlsAccess, NodeMapping};
use crate::api::settings::TlsConfig;
use crate::api::TlsReloader;
use crate::config::Config;
use std::path::Path;

/// Why one step of a SIGHUP reload failed.
pub type StepError = Box<dyn std::error::Error + Send + Sync>;

/// Replaces the process's log filter.
type SetFilter = Box<dyn Fn(&str) -> Result<(), StepError> + Send + Sync>;

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
        set: impl Fn(&str) -> Result<(), StepError> + Send + Sync + 'static,
        pinned: Option<String>,
    ) -> LogControl {
        LogControl {
            set: Box::new(set),
            pinned,
        }
    }

    /// Applies the configured filter (default [`DEFAULT_FILTER`]) unless the environment pins
    /// one; returns the filter in effect and whether it came from the environment.
    pub fn apply(&self, configured: Option<&str>) -> Result<(String, bool), StepError> {
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
    /// The dotted setting (`log.filter`, `metrics`, `listen.tls.allowed_clients`, ...).
    pub setting: &'static str,
    /// Whether SIGHUP applies it (else it takes effect on restart).
    pub in_place: bool,
}

/// The settings that differ between the running configuration and the file's, each with
/// whether SIGHUP applies it in place (see `config::reference::RELOADED_ON_SIGHUP`). The mTLS
/// allowlists and node mapping apply in place when both have a `[listen.tls]`; adding or
/// removing the table, or naming other certificate, key or CA files, needs a restart (the
/// files already named are re-read on every SIGHUP).
pub fn changed(running: &Config, file: &Config) -> Vec<Changed> {
    let listen_rest = |c: &Config| {
        let mut l = c.listen.clone();
        l.tls = None;
        l
    };
    let mut candidates: Vec<(&'static str, bool, bool)> =
        vec![("log.filter", true, same(&running.log, &file.log))];
    match (&running.listen.tls, &file.listen.tls) {
        (Some(a), Some(b)) => candidates.extend(tls_changes(a, b)),
        (a, b) => candidates.push(("listen.tls", false, a.is_none() == b.is_none())),
    }
    candidates.extend([
        (
            "listen",
            false,
            same(&listen_rest(running), &listen_rest(file)),
        ),
        ("node_id", false, running.node_id == file.node_id),
        ("fabric", false, same(&running.fabric, &file.fabric)),
        ("state_dir", false, running.state_dir == file.state_dir),
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
    ]);
    // [subnet_manager.remote] and [subnet_manager.opensm_ha]'s peers apply in place.
    candidates.extend(crate::daemon::sm_changes(running, file));
    candidates
        .into_iter()
        .filter(|(_, _, unchanged)| !unchanged)
        .map(|(setting, in_place, _)| Changed { setting, in_place })
        .collect()
}

/// Whether two settings are equal as written (the sections do not all implement `PartialEq`).
fn same<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// `[listen.tls]`'s keys, compared: (key, applied in place, unchanged).
fn tls_changes(a: &TlsConfig, b: &TlsConfig) -> [(&'static str, bool, bool); 8] {
    let template = |m: &NodeMapping| match m {
        NodeMapping::Names { template } => template.clone(),
        NodeMapping::Table(_) => None,
    };
    let table = |m: &NodeMapping| match m {
        NodeMapping::Names { .. } => String::new(),
        NodeMapping::Table(t) => format!("{t:?}"),
    };
    [
        ("listen.tls.cert", false, a.cert == b.cert),
        ("listen.tls.key", false, a.key == b.key),
        ("listen.tls.client_ca", false, a.client_ca == b.client_ca),
        (
            "listen.tls.allowed_clients",
            true,
            same(&a.allowed_clients, &b.allowed_clients),
        ),
        (
            "listen.tls.partitions_clients",
            true,
            same(&a.partitions_clients, &b.partitions_clients),
        ),
        (
            "listen.tls.operator_clients",
            true,
            same(&a.operator_clients, &b.operator_clients),
        ),
        (
            "listen.tls.node_name_template",
            true,
            template(&a.nodes) == template(&b.nodes),
        ),
        (
            "listen.tls.node_identities",
            true,
            table(&a.nodes) == table(&b.nodes),
        ),
    ]
}

/// What SIGHUP can change in the running daemon.
pub struct Reloadable<'a> {
    /// The log filter.
    pub log: &'a LogControl,
    /// The mTLS listener's certificate, key and client CA bundle, when it serves.
    pub tls: Option<&'a TlsReloader>,
    /// The mTLS listener's allowlists and node mapping, when it serves.
    pub access: Option<&'a LiveTlsAccess>,
    /// The node's SM hosts and an SM host's peers (`daemon::SmReload`).
    pub sm: Option<&'a crate::daemon::SmReload>,
}

/// What became of one changed setting.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// In effect for what follows.
    Applied,
    /// Takes effect on restart.
    Restart,
    /// Could have been applied but was not; why.
    NotApplied(String),
}

/// Handles one SIGHUP: re-reads the config file, re-reads the TLS material, applies what can
/// change in place (the log filter, the mTLS allowlists and node mapping) and logs which
/// settings changed, which were applied (only once they are in effect), which were not and why,
/// and which need a restart. A file that no longer validates changes nothing. Never ends the
/// process. `running` (the configuration in effect) takes what was applied.
pub fn on_sighup(config_path: &Path, parts: &Reloadable<'_>, running: &mut Config) {
    let file = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: the config file does not validate; nothing reloaded");
            return;
        }
    };
    let log = match parts.log.apply(file.log.filter.as_deref()) {
        Ok((filter, true)) => {
            tracing::info!(
                filter = filter.as_str(),
                "SIGHUP: log filter kept: FABRIC_AGENT_LOG pins it"
            );
            Outcome::NotApplied("FABRIC_AGENT_LOG pins the log filter".to_owned())
        }
        Ok((filter, false)) => {
            tracing::info!(filter = filter.as_str(), "SIGHUP: log filter reloaded");
            Outcome::Applied
        }
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: log filter not changed");
            Outcome::NotApplied(e.to_string())
        }
    };
    match parts.tls.map(TlsReloader::reload) {
        Some(Ok(loaded)) => tracing::info!(%loaded, "SIGHUP: TLS material reloaded"),
        Some(Err(e)) => tracing::error!(
            error = %e,
            "SIGHUP: TLS reload failed; the previous material stays in use"
        ),
        None => {}
    }
    let changes = changed(running, &file);
    // The SM hosts are re-read on every SIGHUP (their TLS files too), the peers when changed.
    let remote = parts.sm.map(|sm| sm.remote(running, &file));
    let peers = match parts.sm {
        Some(sm)
            if changes
                .iter()
                .any(|c| c.setting == "subnet_manager.opensm_ha") =>
        {
            Some(sm.peers(running, &file))
        }
        _ => None,
    };
    let access_changed = changes
        .iter()
        .any(|c| c.in_place && c.setting.starts_with("listen.tls."));
    // Both configurations have [listen.tls] whenever one of its in-place keys changed.
    let access = match (parts.access, &file.listen.tls, access_changed) {
        (Some(live), Some(tls), true) => {
            live.replace(tls.access());
            if let Some(r) = running.listen.tls.as_mut() {
                r.allowed_clients = tls.allowed_clients.clone();
                r.partitions_clients = tls.partitions_clients.clone();
                r.operator_clients = tls.operator_clients.clone();
                r.nodes = tls.nodes.clone();
            }
            Outcome::Applied
        }
        // No mTLS listener serves (no listen.tcp): the lists take effect when one is bound.
        _ => Outcome::Restart,
    };
    if log == Outcome::Applied {
        running.log = file.log.clone();
    }
    let outcomes: Vec<(&'static str, Outcome)> = changes
        .iter()
        .map(|c| {
            let outcome = match (c.in_place, c.setting) {
                (false, _) => Outcome::Restart,
                (true, "log.filter") => log.clone(),
                (true, "subnet_manager.remote") => sm_outcome(remote.as_ref()),
                (true, "subnet_manager.opensm_ha") => sm_outcome(peers.as_ref().map(|p| &p.0)),
                (true, _) => access.clone(),
            };
            (c.setting, outcome)
        })
        .collect();
    report(&outcomes);
    let restart_keys: Vec<&str> = peers.iter().flat_map(|p| p.1.iter().copied()).collect();
    if !restart_keys.is_empty() {
        tracing::warn!(
            settings = restart_keys.join(", ").as_str(),
            "SIGHUP: changed, NOT applied until a restart (systemctl restart fabric-agent): {}",
            restart_keys.join(", ")
        );
    }
}

/// What became of a re-read subnet-manager section, logged with what changed.
fn sm_outcome(outcome: Option<&crate::daemon::SmOutcome>) -> Outcome {
    use crate::daemon::SmOutcome;
    match outcome {
        Some(SmOutcome::Applied(what)) => {
            tracing::info!(change = what.as_str(), "SIGHUP: subnet manager: {what}");
            Outcome::Applied
        }
        Some(SmOutcome::Refused(why)) => {
            Outcome::NotApplied(format!("{why}; the running configuration stays in effect"))
        }
        Some(SmOutcome::Unchanged) => Outcome::Applied,
        Some(SmOutcome::Restart) | None => Outcome::Restart,
    }
}

/// Logs the changed settings by what became of them.
fn report(outcomes: &[(&'static str, Outcome)]) {
    if outcomes.is_empty() {
        tracing::info!("SIGHUP: no setting changed");
        return;
    }
    let names = |wanted: &Outcome| {
        outcomes
            .iter()
            .filter(|(_, o)| o == wanted)
            .map(|(s, _)| *s)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (applied, restart) = (names(&Outcome::Applied), names(&Outcome::Restart));
    if !applied.is_empty() {
        tracing::info!(
            settings = applied.as_str(),
            "SIGHUP: changed and applied: {applied}"
        );
    }
    for (setting, outcome) in outcomes {
        if let Outcome::NotApplied(why) = outcome {
            tracing::warn!(
                setting,
                reason = why.as_str(),
                "SIGHUP: changed, NOT applied: {setting}: {why}"
            );
        }
    }
    if !restart.is_empty() {
        tracing::warn!(
            settings = restart.as_str(),
            "SIGHUP: changed, NOT applied until a restart (systemctl restart fabric-agent): {restart}"
        );
    }
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

    #[test]
    fn sighup_applies_the_sm_hosts_and_peers_but_not_a_new_backend() {
        let remote = |endpoints: &str| {
            config(&format!(
                "[subnet_manager]\nbackend = \"remote\"\n[subnet_manager.remote]\nendpoints = {endpoints}\n"
            ))
        };
        let one = remote("[\"http://127.0.0.1:1\"]");
        let two = remote("[\"http://127.0.0.1:1\", \"http://127.0.0.1:2\"]");
        assert_eq!(
            changed(&one, &two),
            vec![Changed {
                setting: "subnet_manager.remote",
                in_place: true
            }]
        );
        let got = changed(&one, &config(""));
        assert!(
            got.contains(&Changed {
                setting: "subnet_manager",
                in_place: false
            }),
            "{got:?}"
        );
    }

    #[test]
    fn sighup_applies_the_mtls_lists_but_not_other_files() {
        let tls = |clients: &str, cert: &str| {
            config(&format!(
                "[listen]\ntcp = \"127.0.0.1:7443\"\n[listen.tls]\ncert = \"{cert}\"\nkey = \"k\"\n\
                 client_ca = \"ca\"\nallowed_clients = {clients}\n"
            ))
        };
        let running = tls("[\"dns:a.example\", \"dns:b.example\"]", "c");
        let got = changed(&running, &tls("[\"dns:b.example\"]", "c"));
        assert_eq!(
            got,
            vec![Changed {
                setting: "listen.tls.allowed_clients",
                in_place: true
            }]
        );
        let got = changed(
            &running,
            &tls("[\"dns:a.example\", \"dns:b.example\"]", "c2"),
        );
        assert_eq!(
            got,
            vec![Changed {
                setting: "listen.tls.cert",
                in_place: false
            }]
        );
        let got = changed(&running, &config(""));
        assert!(
            got.contains(&Changed {
                setting: "listen.tls",
                in_place: false
            }),
            "{got:?}"
        );
    }
}
