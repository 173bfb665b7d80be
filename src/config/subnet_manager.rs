//! `[subnet_manager]`: which backend programs keys, with each backend's own section.

use super::error::{invalid, rejected_by, ConfigError};
use crate::api::ClientAllowlist;
use crate::observe::ObserverKind;
use serde::Deserialize;

/// Which backend programs keys, with each backend's settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SubnetManagerConfig {
    /// The backend.
    #[serde(default)]
    pub backend: Backend,
    /// `embedded` settings.
    #[serde(default)]
    pub embedded: crate::sm::embedded::EmbeddedConfig,
    /// `opensm` settings (SM host).
    #[serde(default)]
    pub opensm: Option<crate::sm::opensm::OpenSmConfig>,
    /// `remote` settings (nodes of an OpenSM fabric).
    #[serde(default)]
    pub remote: Option<crate::sm::remote::RemoteConfig>,
    /// `ufm` settings.
    #[serde(default)]
    pub ufm: Option<crate::sm::ufm::UfmConfig>,
    /// `ufm_broker`: with `backend = "ufm"`, serve `fabric.sm.v1` to the fabric's nodes.
    #[serde(default)]
    pub ufm_broker: Option<crate::sm::ufm::broker::BrokerConfig>,
    /// `opensm_ha`: with `backend = "opensm"`, the fabric's other SM hosts (several SM hosts).
    #[serde(default)]
    pub opensm_ha: Option<crate::sm::opensm::peers::PeersConfig>,
}

/// Subnet-manager backend names.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In-process simulated SM (demos, soft-RoCE rigs).
    #[default]
    Embedded,
    /// OpenSM's partitions file on this host.
    Opensm,
    /// The SM host's agent over gRPC.
    Remote,
    /// NVIDIA UFM REST.
    Ufm,
}

impl SubnetManagerConfig {
    /// Whether this host is a UFM broker (`[subnet_manager.ufm_broker] enabled = true`).
    pub fn ufm_broker(&self) -> bool {
        self.ufm_broker.as_ref().is_some_and(|b| b.enabled)
    }

    /// A UFM broker needs the `ufm` backend and a TCP listener the nodes can reach (mTLS, or the
    /// test rigs' plaintext).
    pub(super) fn validate_broker(&self, listen: &super::ListenConfig) -> Result<(), ConfigError> {
        if !self.ufm_broker() {
            return Ok(());
        }
        if self.backend != Backend::Ufm {
            return Err(invalid(
                "subnet_manager.ufm_broker",
                "enabled = true needs backend = \"ufm\" (the broker programs UFM for the nodes)",
            ));
        }
        if listen.tcp.is_none() || (listen.tls.is_none() && !listen.insecure_plaintext_for_tests) {
            return Err(invalid(
                "subnet_manager.ufm_broker",
                "enabled = true needs [listen] tcp with [listen.tls] (the nodes call the broker over mTLS)",
            ));
        }
        Ok(())
    }

    /// The backend's own section is present and valid, and the observer (`observer.kind`)
    /// fits the backend. Returns the peer SM hosts' identities (`opensm_ha.peer_identities`),
    /// parsed; none without `opensm_ha`.
    pub(super) fn validate(
        &self,
        observer: Option<ObserverKind>,
    ) -> Result<ClientAllowlist, ConfigError> {
        if observer == Some(ObserverKind::Embedded) && self.backend != Backend::Embedded {
            return Err(invalid(
                "observer.kind",
                "\"embedded\" observes the embedded fabric's simulated ports, which only the embedded \
                 backend programs; use auto, smp, sysfs or verbs with this backend",
            ));
        }
        /// The backend's section, or an error naming it.
        fn section<'a, T>(
            section: &'a Option<T>,
            key: &'static str,
            backend: &str,
        ) -> Result<&'a T, ConfigError> {
            section
                .as_ref()
                .ok_or_else(|| invalid(key, format!("backend = \"{backend}\" needs [{key}]")))
        }
        let mut peer_identities = ClientAllowlist::default();
        if let Some(ha) = &self.opensm_ha {
            if self.backend != Backend::Opensm {
                return Err(invalid(
                    "subnet_manager.opensm_ha",
                    "names the fabric's other SM hosts, so it needs backend = \"opensm\"",
                ));
            }
            ha.validate()
                .map_err(rejected_by("subnet_manager.opensm_ha"))?;
            peer_identities = ClientAllowlist::parse(&ha.peer_identities)
                .map_err(rejected_by("subnet_manager.opensm_ha.peer_identities"))?;
        }
        let backend = match self.backend {
            Backend::Embedded => self
                .embedded
                .validate()
                .map_err(rejected_by("subnet_manager.embedded")),
            Backend::Opensm => section(&self.opensm, "subnet_manager.opensm", "opensm")?
                .validate()
                .map_err(rejected_by("subnet_manager.opensm")),
            Backend::Remote => section(&self.remote, "subnet_manager.remote", "remote")?
                .validate()
                .map_err(rejected_by("subnet_manager.remote")),
            Backend::Ufm => section(&self.ufm, "subnet_manager.ufm", "ufm")?
                .validate()
                .map_err(rejected_by("subnet_manager.ufm")),
        };
        backend.map(|()| peer_identities)
    }
}
