//! SIGHUP for the subnet-manager side: the node's SM hosts (`[subnet_manager.remote]`, through
//! `sm::remote::reload`) and an SM host's peers (`[subnet_manager.opensm_ha]`, through
//! `sm::opensm::sync::reload`). Each is validated and built before it replaces what runs; a
//! refused one keeps the running one and says why.

use crate::agent::Agent;
use crate::api::RemoteSm;
use crate::config::{Backend, Config};
use crate::sm::opensm::sync::PeerSync;
use crate::sm::remote::reload::{judge, ReloadableSm, RemoteChange};
use std::sync::Arc;

/// The SIGHUP-replaceable parts of the subnet-manager side.
#[derive(Clone)]
pub struct SmReload {
    pub(super) remote: Option<Arc<ReloadableSm>>,
    pub(super) sync: Option<Arc<PeerSync>>,
    pub(super) agent: Agent,
}

/// What became of one re-read subnet-manager section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmOutcome {
    /// Applied: in effect from now; what changed.
    Applied(String),
    /// Unchanged (its TLS files re-read where it has some).
    Unchanged,
    /// Refused: the running one stays; why.
    Refused(String),
    /// Needs a restart (the section appeared, disappeared or changed backend).
    Restart,
}

/// The subnet-manager settings SIGHUP compares: (setting, applied in place, unchanged).
pub fn sm_changes(running: &Config, file: &Config) -> Vec<(&'static str, bool, bool)> {
    let same =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") == format!("{b:?}");
    let (r, f) = (&running.subnet_manager, &file.subnet_manager);
    let rest = |c: &Config| {
        let mut s = c.subnet_manager.clone();
        s.remote = None;
        s.opensm_ha = None;
        s
    };
    let both_remote = r.backend == Backend::Remote && f.backend == Backend::Remote;
    let both_ha = r.opensm_ha.is_some() && f.opensm_ha.is_some();
    vec![
        (
            "subnet_manager",
            false,
            same(&rest(running), &rest(file))
                && r.remote.is_some() == f.remote.is_some()
                && r.opensm_ha.is_some() == f.opensm_ha.is_some(),
        ),
        (
            "subnet_manager.remote",
            both_remote,
            same(&r.remote, &f.remote),
        ),
        (
            "subnet_manager.opensm_ha",
            both_ha,
            same(&r.opensm_ha, &f.opensm_ha),
        ),
    ]
}

impl SmReload {
    /// Re-reads `[subnet_manager.remote]` from `file` (every SIGHUP: its TLS files too). On
    /// success `running` takes the section.
    pub fn remote(&self, running: &mut Config, file: &Config) -> SmOutcome {
        let (Some(live), Some(new)) = (&self.remote, &file.subnet_manager.remote) else {
            return SmOutcome::Unchanged;
        };
        if file.subnet_manager.backend != Backend::Remote {
            return SmOutcome::Restart;
        }
        let change = match judge(&live.config(), new) {
            Ok(c) => c,
            Err(e) => return SmOutcome::Refused(format!("invalid subnet_manager.remote: {e}")),
        };
        let built = match RemoteSm::new(new) {
            Ok(b) => b,
            Err(e) => return SmOutcome::Refused(e.to_string()),
        };
        live.replace(new.clone(), Arc::new(built), change);
        running.subnet_manager.remote = Some(new.clone());
        match change {
            RemoteChange::Material => SmOutcome::Unchanged,
            RemoteChange::Settings => SmOutcome::Applied("timeouts or TLS files".to_owned()),
            RemoteChange::HostSet => {
                // The reconciler forgets the old set's acknowledgement and sends again now.
                self.agent.wake();
                SmOutcome::Applied(format!(
                    "SM hosts now {}; no ACTIVE or RELEASED until each acknowledged the current set",
                    new.all_endpoints().join(", ")
                ))
            }
        }
    }

    /// Re-reads the peers of `[subnet_manager.opensm_ha]` from `file`. On success `running`
    /// takes the peers' keys (the others wait for a restart and are named).
    pub fn peers(&self, running: &mut Config, file: &Config) -> (SmOutcome, Vec<&'static str>) {
        let (Some(sync), Some(old), Some(new)) = (
            &self.sync,
            running.subnet_manager.opensm_ha.as_mut(),
            &file.subnet_manager.opensm_ha,
        ) else {
            return (SmOutcome::Restart, Vec::new());
        };
        let change = match sync.reload_peers(old, new, |c| {
            super::backend::peer_clients(c).map_err(|e| e.to_string())
        }) {
            Ok(c) => c,
            Err(e) => return (SmOutcome::Refused(e), Vec::new()),
        };
        let restart = change.restart.clone();
        if !change.in_place {
            let outcome = if restart.is_empty() {
                SmOutcome::Unchanged
            } else {
                SmOutcome::Restart
            };
            return (outcome, restart);
        }
        old.peers = new.peers.clone();
        old.peer_host_names = new.peer_host_names.clone();
        old.peer_sm_port_guids = new.peer_sm_port_guids.clone();
        old.ca = new.ca.clone();
        old.cert = new.cert.clone();
        old.key = new.key.clone();
        old.domain_name = new.domain_name.clone();
        old.request_timeout_ms = new.request_timeout_ms;
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        (
            SmOutcome::Applied(format!(
                "peers now {}; added: {}; removed: {}",
                list(&new.peers),
                list(&change.added),
                list(&change.removed)
            )),
            restart,
        )
    }
}
