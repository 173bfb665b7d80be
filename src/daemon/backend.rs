//! Builds the configured subnet-manager backend (and, when the embedded backend or observer
//! needs it, the simulated fabric).

use super::stores::{StoredNodeLedgers, StoredSimTables, StoredSmNodes, StoredUfmLedger};
use super::StartError;
use crate::api::RemoteSm;
use crate::config::{Backend, Config, ObserverKind};
use crate::domain::NodeId;
use crate::embedded_fabric::SimFabric;
use crate::sm::embedded::EmbeddedSm;
use crate::sm::opensm::sa_members::SaMembers;
use crate::sm::opensm::OpenSmBackend;
use crate::sm::ufm::broker::UfmBroker;
use crate::sm::ufm::UfmSm;
use crate::sm::SubnetManager;
use crate::store::Store;
use std::sync::Arc;

/// The backend, plus what the rest of the daemon needs besides the trait object.
pub(super) struct BuiltBackend {
    /// The backend the agent programs keys through.
    pub sm: Arc<dyn SubnetManager>,
    /// On an OpenSM SM host: the same backend, which also serves `fabric.sm.v1.Partitions`.
    pub opensm: Option<OpenSmBackend>,
    /// On an OpenSM SM host whose ownership checks ask the SA: where `ListPartitionMembers`
    /// asks it too.
    pub sa_members: Option<SaMembers>,
    /// On a UFM broker: the broker, which serves `fabric.sm.v1.Partitions` to the nodes.
    pub broker: Option<UfmBroker>,
    /// On an OpenSM SM host with peers (`[subnet_manager.opensm_ha]`): the anti-entropy.
    pub sync: Option<Arc<crate::sm::opensm::sync::PeerSync>>,
    /// The simulated fabric, when the embedded backend or the embedded observer uses it.
    pub sim: Option<Arc<SimFabric>>,
    /// The remote backend, whose SM hosts SIGHUP replaces (`sm::remote::reload`).
    pub remote: Option<Arc<crate::sm::remote::reload::ReloadableSm>>,
}

/// Builds the backend `config` names, persisting its state through `store`.
pub(super) fn build(
    config: &Config,
    node_id: &NodeId,
    store: &Arc<Store>,
    grants: &crate::domain::GrantPolicy,
) -> Result<BuiltBackend, StartError> {
    let sm_cfg = &config.subnet_manager;
    let needs_sim =
        sm_cfg.backend == Backend::Embedded || config.observer_kind() == ObserverKind::Embedded;
    let sim = needs_sim.then(|| {
        Arc::new(SimFabric::new(
            node_id.as_str(),
            sm_cfg.embedded.ports,
            sm_cfg.embedded.pkey_table_size,
            sm_cfg.embedded.default_entry(),
            Box::new(StoredSimTables(store.clone())),
        ))
    });
    let mut opensm = None;
    let mut broker = None;
    let mut sa_members = None;
    let mut sync = None;
    let mut remote = None;
    let sm: Arc<dyn SubnetManager> = match sm_cfg.backend {
        Backend::Embedded => Arc::new(EmbeddedSm::new(
            sim.clone().expect("sim built for the embedded backend"),
            &sm_cfg.embedded,
        )),
        Backend::Opensm => {
            let mut cfg = sm_cfg
                .opensm
                .clone()
                .expect("validated: [subnet_manager.opensm] present");
            cfg.allow_full_default = config.allow_full_default;
            cfg.grants = Some(grants.clone());
            sa_members = cfg
                .ownership
                .enabled
                .then(|| SaMembers::new(&cfg.ownership, cfg.pkey_table_size));
            if !grants.require {
                tracing::warn!(
                    "GRANTS NOT REQUIRED: [grants] require = false on this SM host, so any node may \
                     put its ports in any partition by naming the key (a rooted node joins every \
                     tenant's partition); set require = true with the control plane's keys"
                );
            }
            let backend = match &sm_cfg.opensm_ha {
                None => OpenSmBackend::new(
                    cfg,
                    node_id.as_str().to_owned(),
                    Arc::new(StoredSmNodes(store.clone())),
                )
                .map_err(StartError::OpenSm)?,
                Some(ha) => {
                    let (backend, s) = build_ha(cfg, ha, node_id, store)?;
                    sync = Some(s);
                    backend
                }
            };
            opensm = Some(backend.clone());
            match &sync {
                Some(s) => Arc::new(crate::sm::opensm::sync::WithPeers {
                    backend,
                    sync: s.clone(),
                }) as Arc<dyn SubnetManager>,
                None => Arc::new(backend),
            }
        }
        Backend::Remote => {
            let cfg = sm_cfg
                .remote
                .as_ref()
                .expect("validated: [subnet_manager.remote] present");
            let built = Arc::new(RemoteSm::new(cfg).map_err(StartError::Remote)?);
            let r = Arc::new(crate::sm::remote::reload::ReloadableSm::new(
                cfg.clone(),
                built,
            ));
            remote = Some(r.clone());
            r
        }
        Backend::Ufm if sm_cfg.ufm_broker() => {
            let cfg = sm_cfg
                .ufm
                .as_ref()
                .expect("validated: [subnet_manager.ufm] present");
            if !grants.require {
                tracing::warn!(
                    "GRANTS NOT REQUIRED: [grants] require = false on this UFM broker, so any node \
                     may put its ports in any partition by naming the key (a rooted node joins \
                     every tenant's partition); set require = true with the control plane's keys"
                );
            }
            let b = UfmBroker::new(
                cfg,
                node_id.clone(),
                grants.clone(),
                Arc::new(StoredSmNodes(store.clone())),
                Arc::new(StoredNodeLedgers {
                    store: store.clone(),
                    local: node_id.clone(),
                }),
            )
            .map_err(StartError::Ufm)?;
            broker = Some(b.clone());
            Arc::new(b)
        }
        Backend::Ufm => {
            let cfg = sm_cfg
                .ufm
                .as_ref()
                .expect("validated: [subnet_manager.ufm] present");
            if !grants.require {
                tracing::warn!(
                    "DIRECT UFM ACCESS: this node holds a UFM credential that can change every \
                     partition of the fabric and grants are not required ([grants] require = \
                     false): the fabric trusts every node; use a UFM broker \
                     ([subnet_manager.ufm_broker] on a management host) and the remote backend on \
                     the nodes"
                );
            }
            let ledger = Arc::new(StoredUfmLedger(store.clone()));
            // A store found restored from a copy holds an old ledger: watch every key.
            let sm = UfmSm::new(cfg, ledger).and_then(|u| u.after_restore(store.rolled_back()));
            Arc::new(sm.map_err(StartError::Ufm)?)
        }
    };
    Ok(BuiltBackend {
        sm,
        opensm,
        sa_members,
        broker,
        sync,
        sim,
        remote,
    })
}

/// An SM host with peers: the store loads gated, a standby OpenSM's file is confirmed for its
/// takeover, and the peers are pulled (`sm::opensm::sync`).
fn build_ha(
    cfg: crate::sm::opensm::OpenSmConfig,
    ha: &crate::sm::opensm::peers::PeersConfig,
    node_id: &NodeId,
    store: &Arc<Store>,
) -> Result<(OpenSmBackend, Arc<crate::sm::opensm::sync::PeerSync>), StartError> {
    use crate::sm::opensm::opensm_state::LogStateReader;
    use crate::sm::opensm::reload::OpenSmReloader;
    use crate::sm::opensm::sminfo::SmRole;
    use crate::sm::opensm::standby::StandbyAware;
    use crate::sm::opensm::sync::{GatedStore, PeerSync};
    let log = Arc::new(LogStateReader::new(cfg.log_file.clone()));
    let state = Arc::new(
        match &ha.sminfo_umad_device {
            Some(device) => SmRole::with_sminfo(log, device.clone()),
            None => SmRole::from_log(log),
        }
        .with_pid_check(crate::sm::opensm::sminfo::pid_check(&cfg)),
    );
    let reloader = Arc::new(StandbyAware::new(
        Arc::new(OpenSmReloader::new(&cfg)),
        state.clone(),
        &cfg,
    ));
    // Every stored set loads held back until confirmed. Beside an OpenSM that already runs
    // (an agent restart), a held-back set keeps the keys the running file holds for it: the
    // file OpenSM has programmed is never rewritten with fewer tenant keys before a newer
    // confirmed set removes them (`sm::opensm::running_start`).
    use crate::sm::opensm::running_start::{file_members, opensm_running, KeepRunningKeys};
    let stored: Arc<dyn crate::sm::opensm::NodeMembershipStore> =
        Arc::new(StoredSmNodes(store.clone()));
    let gated: Arc<dyn crate::sm::opensm::NodeMembershipStore> = match opensm_running(&cfg) {
        // The only SM host (no peers yet): no peer can hold a newer set, nothing is held back.
        _ if ha.peers.is_empty() => stored,
        Ok(pid) => {
            tracing::info!(
                pid,
                "OpenSM is already running: held-back sets keep the keys its partitions file holds until the catch-up"
            );
            Arc::new(KeepRunningKeys {
                store: stored,
                file: file_members(&cfg.partitions_file),
            })
        }
        Err(why) => {
            tracing::debug!(%why, "OpenSM is not running at start");
            Arc::new(GatedStore(stored))
        }
    };
    let gated_for_fences = gated.clone();
    let backend = OpenSmBackend::with_reloader(cfg, node_id.as_str().to_owned(), gated, reloader)
        .map_err(StartError::OpenSm)?;
    // No commit for a node, a revocation or the local apply before the catch-up's own.
    backend.hold_commits_until_caught_up();
    let peers = peer_clients(ha).map_err(StartError::Remote)?;
    let evidence: Option<Arc<dyn crate::sm::opensm::fence::FenceEvidence>> = ha
        .sminfo_umad_device
        .is_some()
        .then(|| Arc::new(crate::sm::opensm::fence::SmInfoEvidence(state.clone())) as Arc<_>);
    let fences = crate::sm::opensm::fence::Fences::new(
        ha.host_name
            .clone()
            .unwrap_or_else(|| node_id.as_str().to_owned()),
        ha.identities(),
        evidence,
        Some(gated_for_fences),
        ha.fence_after(),
    )
    .map_err(|e| StartError::OpenSm(crate::sm::opensm::OpenSmError::Store(e)))?;
    let sync = PeerSync::with_fences(
        backend.clone(),
        node_id.as_str().to_owned(),
        peers,
        Some(state),
        Arc::new(fences),
    );
    Ok((backend, sync))
}

/// The clients of `ha`'s peers (none for the only SM host).
pub(super) fn peer_clients(
    ha: &crate::sm::opensm::peers::PeersConfig,
) -> Result<Vec<Arc<dyn crate::sm::opensm::peer_state::Peer>>, crate::api::sm_v1::RemoteError> {
    if ha.peers.is_empty() {
        return Ok(Vec::new());
    }
    crate::api::sm_v1::peers::peers(ha)
}
