//! The remote backend's SM hosts, replaceable in place (SIGHUP): the node's `endpoints` and
//! their TLS settings are re-read without a restart.
//!
//! The new `[subnet_manager.remote]` is validated and its clients built (TLS files read) before
//! anything changes; a bad one is refused with its error and the running clients stay.
//!
//! The safety rule: an acknowledgement counts only against the SM-host set it was given by.
//! Every replacement that changes which hosts the node sends to (the endpoint list or the name
//! TLS verifies, `domain_name`) moves [`ReloadableSm::host_set_epoch`] on; the reconciler then
//! forgets its last acknowledgement and sends the current set again, so no ACTIVE or RELEASED
//! is said until every host of the new set (as judged in `api::sm_v1::host_set`, against the
//! set the SM hosts themselves state) acknowledged it. A removal is safe only in the documented
//! order: the SM hosts stop naming the removed host first (it is fenced, then dropped from their
//! peers); until then a node without it never counts an apply complete
//! (`SM_HOST_SET_INCOMPLETE`).

use super::{RemoteConfig, RemoteConfigError};
use crate::domain::{Condition, NodeId, NodeMemberships, SignedGrant};
use crate::sm::{ApplyOutcome, HostStoredSet, SmError, SubnetManager};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// What a re-read `[subnet_manager.remote]` changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteChange {
    /// Nothing but possibly the TLS material behind the same paths (re-read anyway).
    Material,
    /// Timeouts or TLS file paths: the clients are rebuilt, the host set is the same.
    Settings,
    /// The SM hosts sent to (endpoints, or the name verified in their certificates): the last
    /// acknowledgement no longer counts.
    HostSet,
}

impl RemoteChange {
    /// Whether the acknowledgement taken before the change still counts after it.
    pub fn keeps_ack(self) -> bool {
        self != RemoteChange::HostSet
    }
}

/// Validates `file` (the re-read section) and says what it changes against `running`. A
/// refused section changes nothing.
pub fn judge(
    running: &RemoteConfig,
    file: &RemoteConfig,
) -> Result<RemoteChange, RemoteConfigError> {
    file.validate()?;
    let hosts = |c: &RemoteConfig| {
        let mut e = c.all_endpoints();
        e.sort();
        (e, c.domain_name.clone())
    };
    if hosts(running) != hosts(file) {
        return Ok(RemoteChange::HostSet);
    }
    let rest = |c: &RemoteConfig| {
        (
            c.ca.clone(),
            c.cert.clone(),
            c.key.clone(),
            c.connect_timeout_ms,
            c.request_timeout_ms,
        )
    };
    Ok(if rest(running) == rest(file) {
        RemoteChange::Material
    } else {
        RemoteChange::Settings
    })
}

/// The remote backend behind a swap: every call goes to the clients in effect.
pub struct ReloadableSm {
    current: RwLock<Arc<dyn SubnetManager>>,
    config: Mutex<RemoteConfig>,
    epoch: AtomicU64,
}

impl ReloadableSm {
    /// `initial`, built from `config`.
    pub fn new(config: RemoteConfig, initial: Arc<dyn SubnetManager>) -> ReloadableSm {
        ReloadableSm {
            current: RwLock::new(initial),
            config: Mutex::new(config),
            epoch: AtomicU64::new(0),
        }
    }

    /// The section in effect.
    pub fn config(&self) -> RemoteConfig {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn backend_now(&self) -> Arc<dyn SubnetManager> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `built` (the clients of `config`, which [`judge`] found to make `change`) in effect.
    /// An apply already sent finishes on the clients it started with; a host-set change moves
    /// the epoch on after the swap, so its answer is judged by the reconciler as one of the old set.
    pub fn replace(
        &self,
        config: RemoteConfig,
        built: Arc<dyn SubnetManager>,
        change: RemoteChange,
    ) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = built;
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = config;
        if !change.keeps_ack() {
            self.epoch.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl SubnetManager for ReloadableSm {
    fn backend(&self) -> &'static str {
        self.backend_now().backend()
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.backend_now().apply(desired, generation).await
    }

    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.backend_now()
            .apply_granted(desired, grants, generation)
            .await
    }

    async fn stored_sets(&self, node: &NodeId) -> Option<Vec<HostStoredSet>> {
        self.backend_now().stored_sets(node).await
    }

    fn conditions(&self) -> Vec<Condition> {
        self.backend_now().conditions()
    }

    fn sm_hosts(&self) -> Option<crate::domain::SmHostSet> {
        self.backend_now().sm_hosts()
    }

    async fn cause_changed(&self) {
        let backend = self.backend_now();
        backend.cause_changed().await
    }

    fn host_set_epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(endpoints: &[&str]) -> RemoteConfig {
        RemoteConfig {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            ..RemoteConfig::default()
        }
    }

    #[test]
    fn a_new_host_set_is_told_from_new_settings_and_a_bad_section_is_refused() {
        let one = remote(&["http://127.0.0.1:1"]);
        let two = remote(&["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert_eq!(judge(&one, &one), Ok(RemoteChange::Material));
        assert_eq!(judge(&one, &two), Ok(RemoteChange::HostSet));
        assert_eq!(judge(&two, &one), Ok(RemoteChange::HostSet));
        // The same hosts in another order: the same set.
        let swapped = remote(&["http://127.0.0.1:2", "http://127.0.0.1:1"]);
        assert_eq!(judge(&two, &swapped), Ok(RemoteChange::Material));
        // `endpoint` and a one-element `endpoints` name the same host.
        let single = RemoteConfig {
            endpoint: "http://127.0.0.1:1".into(),
            ..RemoteConfig::default()
        };
        assert_eq!(judge(&one, &single), Ok(RemoteChange::Material));
        let mut slower = two.clone();
        slower.request_timeout_ms = Some(60_000);
        assert_eq!(judge(&two, &slower), Ok(RemoteChange::Settings));
        let mut renamed = two.clone();
        renamed.domain_name = Some("sm.example".into());
        assert_eq!(judge(&two, &renamed), Ok(RemoteChange::HostSet));
        // Refused: the old section stays (the caller changes nothing).
        let dup = remote(&["http://127.0.0.1:1", "http://127.0.0.1:1"]);
        assert!(matches!(
            judge(&one, &dup),
            Err(RemoteConfigError::DuplicateEndpoint(_))
        ));
        assert_eq!(
            judge(&one, &remote(&["http://smhost2:7443"])),
            Err(RemoteConfigError::PlaintextNotLoopback)
        );
        assert_eq!(
            judge(&one, &remote(&[])),
            Err(RemoteConfigError::EndpointCount)
        );
    }

    struct Named(&'static str);

    #[async_trait]
    impl SubnetManager for Named {
        fn backend(&self) -> &'static str {
            self.0
        }
        async fn apply(&self, _: &NodeMemberships, _: u64) -> Result<ApplyOutcome, SmError> {
            // (`..Default::default()`: the outcome may gain fields, e.g. the acknowledging hosts.)
            #[allow(clippy::needless_update)]
            Ok(ApplyOutcome {
                detail: self.0.to_owned(),
                ..Default::default()
            })
        }
        fn sm_hosts(&self) -> Option<crate::domain::SmHostSet> {
            Some(crate::domain::SmHostSet {
                known: vec![self.0.to_owned()],
                ..Default::default()
            })
        }
    }

    #[test]
    fn the_wrapper_shows_the_current_backends_sm_host_set() {
        let sm = ReloadableSm::new(remote(&["http://127.0.0.1:1"]), Arc::new(Named("old")));
        assert_eq!(sm.sm_hosts().unwrap().known, ["old"]);
        sm.replace(
            remote(&["http://127.0.0.1:1", "http://127.0.0.1:2"]),
            Arc::new(Named("new")),
            RemoteChange::HostSet,
        );
        assert_eq!(sm.sm_hosts().unwrap().known, ["new"]);
    }

    #[tokio::test]
    async fn a_replacement_takes_effect_and_only_a_host_set_change_moves_the_epoch() {
        let one = remote(&["http://127.0.0.1:1"]);
        let two = remote(&["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        let sm = ReloadableSm::new(one.clone(), Arc::new(Named("old")));
        let set = NodeMemberships {
            node_id: NodeId::parse("n1").unwrap(),
            port_guids: Vec::new(),
            keys: Default::default(),
        };
        assert_eq!(sm.apply(&set, 1).await.unwrap().detail, "old");
        sm.replace(one.clone(), Arc::new(Named("same")), RemoteChange::Material);
        assert_eq!(sm.host_set_epoch(), 0);
        assert_eq!(sm.apply(&set, 2).await.unwrap().detail, "same");
        sm.replace(two.clone(), Arc::new(Named("new")), RemoteChange::HostSet);
        assert_eq!(sm.host_set_epoch(), 1);
        assert_eq!(sm.apply(&set, 3).await.unwrap().detail, "new");
        assert_eq!(sm.config().all_endpoints().len(), 2);
    }
}
