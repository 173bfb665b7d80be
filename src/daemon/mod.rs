//! The composition root: builds the store, the subnet-manager backend, the port observer, the
//! agent and the listeners from a validated [`Config`]. The only place that names concrete
//! backends and observers; the agent sees their traits.

mod backend;
mod error;
mod listen;
mod observer;
mod reload;
mod stores;

pub use error::StartError;
pub use listen::{bind, Bound};
pub use observer::read_ports_once;
pub use reload::{sm_changes, SmOutcome, SmReload};
pub use stores::{StoredSmNodes, StoredUfmLedger};

use crate::agent::{Agent, AgentParts};
use crate::config::Config;
use crate::sm::opensm::OpenSmBackend;
use crate::sm::ufm::broker::UfmBroker;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

/// The store's file name under `state_dir`.
pub const STORE_FILE: &str = "state.redb";

/// A built agent plus the pieces other services of the daemon need.
pub struct Daemon {
    /// The agent.
    pub agent: Agent,
    /// The store (shared with the agent).
    pub store: Arc<Store>,
    /// On an OpenSM SM host: the backend that also serves `fabric.sm.v1.Partitions`.
    pub opensm: Option<OpenSmBackend>,
    /// On a UFM broker: the broker that serves `fabric.sm.v1.Partitions` to the nodes.
    pub broker: Option<UfmBroker>,
    /// On an OpenSM SM host that asks the SA: where `ListPartitionMembers` asks it.
    sa_members: Option<crate::sm::opensm::sa_members::SaMembers>,
    /// On an OpenSM SM host with peers: the anti-entropy (caught up before READY, then run).
    pub sync: Option<Arc<crate::sm::opensm::sync::PeerSync>>,
    /// The peers' identities that may pull this host's sets.
    peer_identities: crate::api::ClientAllowlist,
    /// The remote backend, whose SM hosts SIGHUP replaces.
    remote: Option<Arc<crate::sm::remote::reload::ReloadableSm>>,
}

impl Daemon {
    /// What SIGHUP may replace on the subnet-manager side.
    pub fn sm_reload(&self) -> SmReload {
        SmReload {
            remote: self.remote.clone(),
            sync: self.sync.clone(),
            agent: self.agent.clone(),
        }
    }

    /// The `fabric.sm.v1.Partitions` service, when this host is a fabric side (an OpenSM SM
    /// host or a UFM broker).
    pub fn partitions(&self) -> Option<crate::api::PartitionsService> {
        use crate::api::PartitionsService;
        match (&self.opensm, &self.broker) {
            (Some(o), _) => Some(
                PartitionsService::new(
                    crate::sm::opensm::fabric_side::OpenSmSide::new(
                        o.clone(),
                        self.sa_members.clone(),
                    )
                    .with_sync(self.sync.clone()),
                )
                .with_peer_identities(self.peer_identities.clone()),
            ),
            (None, Some(b)) => Some(PartitionsService::new(b.clone())),
            (None, None) => None,
        }
    }
}

/// Opens the store and builds the backend, the observer and the agent `config` asks for.
pub fn build(config: &Config) -> Result<Daemon, StartError> {
    crate::test_mutation::announce();
    let store = Arc::new(
        Store::open(&config.state_dir.join(STORE_FILE), config.events.retain)
            .map_err(StartError::Store)?,
    );
    let grants = config.grants.load().map_err(StartError::Grants)?;
    let built = backend::build(config, &config.node_id, &store, &grants)?;
    let (observer, observer_reason) = observer::build(config, built.sim)?;
    let agent = Agent::new(AgentParts {
        grants,
        node_id: config.node_id.clone(),
        fabric: config.fabric.clone(),
        store: store.clone(),
        sm: built.sm,
        observer,
        observer_reason,
        selector: config.ports.clone(),
        reconciler: config.reconciler.clone(),
        released_retain: Duration::from_secs(config.events.released_retain_secs),
        allow_full_default: config.allow_full_default,
        clock: Arc::new(crate::agent::SystemClock),
    })
    .map_err(StartError::Agent)?;
    Ok(Daemon {
        agent,
        store,
        opensm: built.opensm,
        broker: built.broker,
        sa_members: built.sa_members,
        sync: built.sync,
        peer_identities: config.peer_identities.clone(),
        remote: built.remote,
    })
}
