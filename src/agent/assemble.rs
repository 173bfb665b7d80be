//! Builds an agent from the configuration: the store, the subnet-manager backend and the port
//! observer.

use super::{Agent, AgentError, AgentParts, StartError};
use crate::config::{Backend, Config, ObserverKind};
use crate::domain::FabricName;
use crate::observe::combined::CombinedObserver;
use crate::observe::embedded::EmbeddedObserver;
use crate::observe::PortObserver;
use crate::sim::{SimFabric, SimPersistence};
use crate::sm::embedded::EmbeddedSm;
use crate::sm::opensm::{
    CommitState, NodeMembershipStore, NodeStoreError, OpenSmBackend, StoredNode,
};
use crate::sm::SubnetManager;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

const SIM_TABLES: &str = "sim_tables";
/// Store meta key of the OpenSM backend's commit state (unconfirmed write, rejected file).
const OPENSM_COMMIT: &str = "opensm_commit_state";
/// Store meta key of the UFM backend's ledger (GUIDs this node put in partitions).
const UFM_LEDGER: &str = "ufm_ledger";

/// An assembled agent plus the pieces other services of the daemon need.
pub struct Assembled {
    /// The agent.
    pub agent: Agent,
    /// The store (shared with the agent).
    pub store: Arc<Store>,
    /// On an OpenSM SM host: the backend that also serves `fabric.sm.v1.Partitions`.
    pub opensm: Option<OpenSmBackend>,
}

/// Keeps the SM host's per-node memberships in the agent's store.
struct StoredSmNodes(Arc<Store>);

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSmNode {
    memberships: crate::domain::NodeMemberships,
    generation: u64,
}

impl NodeMembershipStore for StoredSmNodes {
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError> {
        let rows = self
            .0
            .sm_nodes()
            .map_err(|e| NodeStoreError(e.to_string()))?;
        rows.into_iter()
            .map(|(id, bytes)| {
                let n: StoredSmNode = serde_json::from_slice(&bytes)
                    .map_err(|e| NodeStoreError(format!("node {id}: {e}")))?;
                Ok(StoredNode {
                    memberships: n.memberships,
                    generation: n.generation,
                })
            })
            .collect()
    }

    fn put_group(
        &self,
        nodes: &[StoredNode],
        commit: Option<&CommitState>,
    ) -> Result<(), NodeStoreError> {
        let rows = nodes
            .iter()
            .map(|n| {
                let bytes = serde_json::to_vec(&StoredSmNode {
                    memberships: n.memberships.clone(),
                    generation: n.generation,
                })?;
                Ok((n.memberships.node_id.clone(), bytes))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(|e| NodeStoreError(e.to_string()))?;
        let state = commit
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| NodeStoreError(e.to_string()))?;
        self.0
            .put_sm_nodes(&rows, state.as_deref().map(|s| (OPENSM_COMMIT, s)))
            .map_err(|e| NodeStoreError(e.to_string()))
    }

    fn load_commit_state(&self) -> Result<CommitState, NodeStoreError> {
        match self
            .0
            .meta(OPENSM_COMMIT)
            .map_err(|e| NodeStoreError(e.to_string()))?
        {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| NodeStoreError(format!("{OPENSM_COMMIT}: {e}"))),
            None => Ok(CommitState::default()),
        }
    }
}

/// Keeps the simulated fabric's tables in the agent's store.
struct StoredSimTables(Arc<Store>);

impl SimPersistence for StoredSimTables {
    fn load(&self) -> Option<Vec<Vec<u16>>> {
        let bytes = self.0.meta(SIM_TABLES).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    fn save(&self, tables: &[Vec<u16>]) -> Result<(), crate::sim::PersistError> {
        let bytes = serde_json::to_vec(tables)?;
        Ok(self.0.set_meta(SIM_TABLES, &bytes)?)
    }
}

/// Keeps the UFM backend's ledger in the agent's store.
struct StoredUfmLedger(Arc<Store>);

impl crate::sm::ufm::UfmLedgerStore for StoredUfmLedger {
    fn load(&self) -> Result<Option<Vec<u8>>, crate::sm::ufm::LedgerStoreError> {
        self.0
            .meta(UFM_LEDGER)
            .map_err(|e| crate::sm::ufm::LedgerStoreError(e.to_string()))
    }

    fn save(&self, bytes: &[u8]) -> Result<(), crate::sm::ufm::LedgerStoreError> {
        self.0
            .set_meta(UFM_LEDGER, bytes)
            .map_err(|e| crate::sm::ufm::LedgerStoreError(e.to_string()))
    }
}

/// Opens the store and builds the backend and observer the configuration asks for.
pub fn assemble(config: &Config) -> Result<Assembled, AgentError> {
    let node_id = config.node_id();
    let store = Arc::new(Store::open(
        &config.state_dir.join("state.redb"),
        config.events.retain,
    )?);
    let kind = config.observer_kind();
    let sm_cfg = &config.subnet_manager;
    let needs_sim = sm_cfg.backend == Backend::Embedded || kind == ObserverKind::Embedded;
    let sim = needs_sim.then(|| {
        Arc::new(SimFabric::new(
            &node_id,
            sm_cfg.embedded.ports,
            sm_cfg.embedded.pkey_table_size,
            sm_cfg.embedded.default_entry(),
            Box::new(StoredSimTables(store.clone())),
        ))
    });
    let mut opensm = None;
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
            let backend =
                OpenSmBackend::new(cfg, node_id.clone(), Arc::new(StoredSmNodes(store.clone())))
                    .map_err(StartError::from)?;
            opensm = Some(backend.clone());
            Arc::new(backend)
        }
        Backend::Remote => {
            let cfg = sm_cfg
                .remote
                .as_ref()
                .expect("validated: [subnet_manager.remote] present");
            Arc::new(
                crate::api::sm_client::RemoteSm::new(cfg)
                    .map_err(|e| StartError::Remote(Box::new(e)))?,
            )
        }
        Backend::Ufm => {
            let ufm = sm_cfg
                .ufm
                .as_ref()
                .expect("validated: [subnet_manager.ufm] present");
            Arc::new(
                crate::sm::ufm::UfmSm::new(ufm, Arc::new(StoredUfmLedger(store.clone())))
                    .map_err(StartError::from)?,
            )
        }
    };
    let (observer, observer_reason) = observer(config, kind, sim.clone())?;
    let agent = Agent::new(AgentParts {
        node_id,
        fabric: FabricName::parse(&config.fabric)?,
        store: store.clone(),
        sm,
        observer,
        observer_reason,
        selector: config.port_selector().map_err(StartError::from)?,
        reconciler: config.reconciler.clone(),
        released_retain: Duration::from_secs(config.events.released_retain_secs),
        allow_full_default: config.allow_full_default,
    })?;
    Ok(Assembled {
        agent,
        store,
        opensm,
    })
}

/// Builds the observer: the embedded one, or a real one (auto/verbs/sysfs/smp); with the
/// embedded backend a real observer also shows the simulated ports (see `observe::combined`).
fn observer(
    config: &Config,
    kind: ObserverKind,
    sim: Option<Arc<SimFabric>>,
) -> Result<(Arc<dyn PortObserver>, String), AgentError> {
    let embedded = |sim: Arc<SimFabric>| EmbeddedObserver::new(sim, config.observer.slow_poll());
    let unavailable = StartError::Observe;
    let (real, reason): (Box<dyn PortObserver>, String) = match kind {
        ObserverKind::Embedded => {
            let sim = sim.expect("sim built for the embedded observer");
            return Ok((
                Arc::new(embedded(sim)),
                "configured: the embedded simulated fabric".to_owned(),
            ));
        }
        ObserverKind::Auto | ObserverKind::Verbs | ObserverKind::Sysfs => {
            crate::observe::auto::select(&config.observer, kind).map_err(unavailable)?
        }
        ObserverKind::Smp => {
            let smp =
                crate::observe::smp::SmpObserver::open(&config.observer).map_err(unavailable)?;
            let reason = format!(
                "configured: SMPs to the local port through {}",
                config.observer.umad_device.display()
            );
            (Box::new(smp), reason)
        }
    };
    Ok(match sim {
        Some(sim) => (
            Arc::new(CombinedObserver::new(real, Box::new(embedded(sim)))),
            format!("{reason}; plus the embedded fabric's simulated ports"),
        ),
        None => (Arc::from(real), reason),
    })
}

/// Reads the ports once through the configured observer, without a daemon (`fabric-agent
/// ports`). Returns the observer's kind and the inventory with fabric ports marked.
pub async fn read_ports_once(
    config: &Config,
) -> Result<(&'static str, crate::domain::Inventory), AgentError> {
    let kind = config.observer_kind();
    if kind == ObserverKind::Embedded {
        return Err(StartError::EmbeddedPortsInDaemon.into());
    }
    let (observer, _) = observer(config, kind, None)?;
    let mut inventory = observer.inventory().await?;
    config
        .port_selector()
        .map_err(StartError::from)?
        .apply(&mut inventory);
    Ok((observer.kind(), inventory))
}
