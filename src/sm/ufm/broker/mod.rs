//! The UFM broker: one fabric-side agent with the `ufm` backend (on a management host) serves
//! `fabric.sm.v1.Partitions` to a UFM fabric's nodes, so the nodes hold no UFM credential.
//! Nodes use the `remote` backend toward it, exactly as toward an OpenSM SM host.
//!
//! For each node's set (identity from the mTLS node mapping, checked by the service):
//! 1. the generation is fenced against the node's stored one (older, or the same with a
//!    different set: refused; the same set again: a retry, re-applied);
//! 2. with grants required, every key needs a valid, unconsumed grant for this node, key and
//!    membership ([`crate::sm::grant_judge`]); a grant whose key left the set is consumed;
//! 3. every port GUID not already in the node's stored set must be shown in that node by UFM's
//!    own port inventory (`GET …/resources/ports`) as a channel-adapter port (`Computer IB
//!    Port`, the OpenSM SM host's rule) and held by no other node's stored set; the inventory
//!    not readable refuses the claim; a node's inventory is read at most once per
//!    [`inventory::NODE_READ_INTERVAL`] ([`inventory`]);
//! 4. the record (set, generation, grants, consumed ids) is stored durably, then the node's own
//!    [`UfmSm`] (its own ledger, keyed by node id in the store) applies it; Ok only after UFM's
//!    read-back shows it.
//!
//! Nothing reaches UFM for a refused set. Calls for one node run one at a time; different
//! nodes' calls run concurrently, each node's UFM requests under its own request budget.

mod config;
mod error;
pub mod inventory;

pub use config::BrokerConfig;
pub use error::BrokerError;

use super::{MemoryLedgerStore, UfmConfig, UfmLedgerStore, UfmSm};
use crate::domain::{
    Condition, GrantPolicy, Guid, Membership, NodeId, NodeMemberships, PKey, SignedGrant,
};
use crate::sm::fabric_side::{FabricSide, FabricSideError, PartitionMember, PartitionMembers};
use crate::sm::grant_judge;
use crate::sm::opensm::{NodeMembershipStore, Revocation, StoredNode};
use crate::sm::{ApplyOutcome, SmError, SubnetManager};
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where `ListPartitionMembers` reads on a broker: UFM's partition.
pub const MEMBERS_SOURCE: &str = "ufm";

/// Each node's UFM ledger store (the GUIDs that node's sets put in keys), by node id.
pub trait NodeLedgers: Send + Sync + 'static {
    /// The ledger store of `node`.
    fn ledger(&self, node: &NodeId) -> Arc<dyn UfmLedgerStore>;
}

/// Ledgers in memory, per node (tests and benches).
#[derive(Debug, Default, Clone)]
pub struct MemoryNodeLedgers(Arc<Mutex<BTreeMap<NodeId, MemoryLedgerStore>>>);

impl NodeLedgers for MemoryNodeLedgers {
    fn ledger(&self, node: &NodeId) -> Arc<dyn UfmLedgerStore> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Arc::new(map.entry(node.clone()).or_default().clone())
    }
}

/// The UFM broker. Cheap to clone (shared state).
#[derive(Clone)]
pub struct UfmBroker {
    inner: Arc<Inner>,
}

struct Inner {
    config: UfmConfig,
    local_node: NodeId,
    grants: GrantPolicy,
    store: Arc<dyn NodeMembershipStore>,
    ledgers: Arc<dyn NodeLedgers>,
    /// Reads UFM's port inventory and partitions (never writes).
    reader: UfmSm,
    state: Mutex<State>,
    /// Held from the port-holder check until the record is stored and in memory.
    admit: tokio::sync::Mutex<()>,
    applies: AtomicU64,
    /// Each node's ports at its last inventory read.
    inventories: inventory::NodeInventories,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<NodeId, StoredNode>,
    /// Every consumed grant id (any node's).
    consumed: BTreeSet<String>,
    backends: BTreeMap<NodeId, Arc<NodeBackend>>,
}

/// One node's UFM backend and the lock that runs its calls one at a time.
struct NodeBackend {
    sm: UfmSm,
    serial: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for UfmBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UfmBroker")
            .field("local_node", &self.inner.local_node)
            .field("require_grants", &self.inner.grants.require)
            .finish_non_exhaustive()
    }
}

impl UfmBroker {
    /// Builds the broker: validates `config` (one reader backend is built at once, so a bad
    /// setting or CA file fails here) and loads every node's stored record from `store`.
    pub fn new(
        config: &UfmConfig,
        local_node: NodeId,
        grants: GrantPolicy,
        store: Arc<dyn NodeMembershipStore>,
        ledgers: Arc<dyn NodeLedgers>,
    ) -> Result<UfmBroker, SmError> {
        let reader = UfmSm::new(config, Arc::new(MemoryLedgerStore::default()))?;
        let records = store
            .load_all()
            .map_err(|e| SmError::from(BrokerError::Store(e)))?;
        let mut state = State::default();
        for r in records {
            state.consumed.extend(r.consumed.iter().cloned());
            state.nodes.insert(r.memberships.node_id.clone(), r);
        }
        Ok(UfmBroker {
            inner: Arc::new(Inner {
                config: config.clone(),
                local_node,
                grants,
                store,
                ledgers,
                reader,
                state: Mutex::new(state),
                admit: tokio::sync::Mutex::new(()),
                applies: AtomicU64::new(0),
                inventories: inventory::NodeInventories::default(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether grants are required.
    pub fn requires_grants(&self) -> bool {
        self.inner.grants.require
    }

    /// Applies sent to UFM since start.
    pub fn applies(&self) -> u64 {
        self.inner.applies.load(Ordering::Relaxed)
    }

    /// The node's backend, built at its first call.
    fn backend_of(&self, node: &NodeId) -> Result<Arc<NodeBackend>, BrokerError> {
        if let Some(b) = self.lock().backends.get(node) {
            return Ok(b.clone());
        }
        let sm = UfmSm::new(&self.inner.config, self.inner.ledgers.ledger(node))
            .map_err(BrokerError::Ufm)?;
        let built = Arc::new(NodeBackend {
            sm,
            serial: tokio::sync::Mutex::new(()),
        });
        Ok(self
            .lock()
            .backends
            .entry(node.clone())
            .or_insert(built)
            .clone())
    }

    /// Replaces one node's set: the steps in the module docs. `check_ports` is off only for
    /// this host's own set (its ports come from its own observer, not from a node's word).
    pub async fn set_node_checked(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
        check_ports: bool,
    ) -> Result<u64, BrokerError> {
        desired.validate().map_err(BrokerError::Invalid)?;
        let node = desired.node_id.clone();
        let backend = self.backend_of(&node)?;
        let _serial = backend.serial.lock().await;
        let stored = self.lock().nodes.get(&node).cloned();
        let retry = match &stored {
            Some(old) => {
                old.fence(&desired, generation)
                    .map_err(|stored| BrokerError::StaleGeneration {
                        sent: generation,
                        stored,
                    })?
            }
            None => false,
        };
        if !retry {
            self.admit(&desired, grants, generation, stored, check_ports)
                .await?;
        }
        let outcome = backend.sm.apply(&desired, generation).await.map_err(|e| {
            tracing::warn!(node_id = %node, error = %e, "UFM did not confirm the node's set");
            BrokerError::Ufm(e)
        })?;
        tracing::debug!(node_id = %node, generation, detail = %outcome.detail, "node's set confirmed by UFM");
        Ok(self.inner.applies.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Judges grants and port claims, then stores the record (durably, then in memory).
    async fn admit(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
        stored: Option<StoredNode>,
        check_ports: bool,
    ) -> Result<(), BrokerError> {
        let node = &desired.node_id;
        let accepted = if self.inner.grants.require {
            let consumed = self.lock().consumed.clone();
            let judged = grant_judge::verify_all(&self.inner.grants, desired, grants)
                .and_then(|verified| {
                    let ledger = grant_judge::Ledger {
                        consumed: &consumed,
                        retired: &crate::domain::RetiredKeys::default(),
                    };
                    grant_judge::judge(
                        &self.inner.grants,
                        ledger,
                        stored.as_ref(),
                        desired,
                        &verified,
                        grant_judge::Freshness::now(),
                    )
                })
                .map_err(|(pkey, error)| {
                    let e = BrokerError::GrantRefused {
                        node: node.clone(),
                        pkey,
                        error: Box::new(error),
                    };
                    tracing::warn!(node_id = %node, error = %e, "set refused: grant");
                    e
                })?;
            Some(judged)
        } else {
            None
        };
        let held: BTreeSet<Guid> = stored
            .as_ref()
            .map(|s| s.memberships.port_guids.iter().copied().collect())
            .unwrap_or_default();
        let new: Vec<Guid> = desired
            .port_guids
            .iter()
            .copied()
            .filter(|g| !held.contains(g))
            .collect();
        if check_ports && !new.is_empty() {
            self.prove_ports(node, &new).await?;
        }
        let _admit = self.inner.admit.lock().await;
        {
            let st = self.lock();
            for g in &new {
                if let Some(owner) = st.nodes.iter().find_map(|(id, n)| {
                    (id != node && n.memberships.port_guids.contains(g)).then_some(id)
                }) {
                    let e = BrokerError::PortHeld {
                        port: *g,
                        owner: owner.clone(),
                    };
                    tracing::warn!(node_id = %node, error = %e, "port claim refused");
                    return Err(e);
                }
            }
        }
        let mut record = stored.unwrap_or_else(|| StoredNode::new(desired.clone(), generation));
        let gone = match accepted {
            Some(accepted) => grant_judge::replace_grants(&mut record, accepted),
            None => Vec::new(),
        };
        record.memberships = desired.clone();
        record.generation = generation;
        self.save(record.clone()).await?;
        let mut st = self.lock();
        for id in gone {
            tracing::info!(node_id = %node, grant_id = %id, "grant consumed: its key left the node's set");
            st.consumed.insert(id);
        }
        st.nodes.insert(node.clone(), record);
        Ok(())
    }

    /// Every GUID of `new` must be shown by UFM's port inventory as a channel-adapter port of
    /// `node` ([`inventory`]): judged by the node's last read while it is young, else by a fresh
    /// read (recorded for the node).
    async fn prove_ports(&self, node: &NodeId, new: &[Guid]) -> Result<(), BrokerError> {
        let refuse = |port: Guid, shown: Option<String>| {
            let e = BrokerError::PortNotOwned {
                node: node.clone(),
                port,
                shown,
            };
            tracing::warn!(node_id = %node, error = %e, "port claim refused");
            e
        };
        let ports = match self.inner.inventories.cached(node) {
            Some((ports, _age)) => ports,
            None => {
                let ports = Arc::new(self.inner.reader.ports().await.map_err(|e| {
                    let e = BrokerError::Inventory(e);
                    tracing::warn!(node_id = %node, error = %e, "port claim refused");
                    e
                })?);
                self.inner.inventories.record(node, ports.clone());
                ports
            }
        };
        for g in new {
            let shown = ports.iter().find(|p| p.guid == *g);
            match shown {
                Some(p) if inventory::owned_by(p, node) => {}
                _ => {
                    return Err(refuse(
                        *g,
                        shown.map(|p| {
                            format!(
                                "it in system {:?} ({:?}, {:?})",
                                p.system_name, p.node_description, p.description
                            )
                        }),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Full port-inventory reads made for port claims since start.
    pub fn inventory_reads(&self) -> u64 {
        self.inner.inventories.reads()
    }

    /// Stores one record durably.
    async fn save(&self, record: StoredNode) -> Result<(), BrokerError> {
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || store.put_group(&[record], None))
            .await
            .map_err(|e| BrokerError::Task(Arc::new(e)))?
            .map_err(BrokerError::Store)
    }

    /// Consumes every grant of `instance` on `node`, removes the keys no other grant of the
    /// node justifies (whatever the node keeps sending), stores that, and makes UFM agree.
    /// Idempotent: a repeat consumes nothing and re-applies.
    pub async fn revoke(&self, node: &NodeId, instance: &str) -> Result<Revocation, BrokerError> {
        if !self.requires_grants() {
            return Err(BrokerError::GrantsNotRequired);
        }
        let backend = self.backend_of(node)?;
        let _serial = backend.serial.lock().await;
        let mut record = self
            .lock()
            .nodes
            .get(node)
            .cloned()
            .ok_or_else(|| BrokerError::NodeNotStored(node.clone()))?;
        let (ids, removed) = grant_judge::revoke(&mut record, instance);
        self.save(record.clone()).await?;
        {
            let mut st = self.lock();
            st.consumed.extend(ids.iter().cloned());
            st.nodes.insert(node.clone(), record.clone());
        }
        tracing::warn!(node_id = %node, instance, revoked = ?ids, removed = ?removed.iter().map(ToString::to_string).collect::<Vec<_>>(), "instance revoked on the fabric side");
        backend
            .sm
            .apply(&record.memberships, record.generation)
            .await
            .map_err(BrokerError::Ufm)?;
        let applies = self.inner.applies.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Revocation {
            revoked_grant_ids: ids,
            removed_pkeys: removed,
            sweeps: applies,
        })
    }

    /// The ports UFM lists in `pkey`, with the node whose stored set holds each.
    pub async fn members(&self, pkey: PKey) -> Result<Vec<PartitionMember>, BrokerError> {
        let members = self
            .inner
            .reader
            .partition_members(pkey)
            .await
            .map_err(BrokerError::Ufm)?;
        let st = self.lock();
        Ok(members
            .into_iter()
            .map(|(guid, m)| PartitionMember {
                guid,
                full: m == Membership::Full,
                node: st
                    .nodes
                    .iter()
                    .find(|(_, n)| n.memberships.port_guids.contains(&guid))
                    .map(|(id, _)| id.clone()),
            })
            .collect())
    }

    /// This host's own set, under its own node id (ports not checked: its own observer's).
    async fn apply_own(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let mut own = desired.clone();
        own.node_id = self.inner.local_node.clone();
        let applies = self
            .set_node_checked(own, grants, generation, false)
            .await?;
        Ok(ApplyOutcome {
            detail: format!(
                "UFM broker: this host's set confirmed by UFM ({applies} applies since start)"
            ),
            acknowledged_by: Vec::new(),
        })
    }
}

#[async_trait]
impl FabricSide for UfmBroker {
    fn requires_grants(&self) -> bool {
        UfmBroker::requires_grants(self)
    }

    async fn set_node(
        &self,
        desired: NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<u64, FabricSideError> {
        Ok(self
            .set_node_checked(desired, grants, generation, true)
            .await?)
    }

    fn node(&self, node: &NodeId) -> Option<StoredNode> {
        self.lock().nodes.get(node).cloned()
    }

    async fn revoke_instance(
        &self,
        node: &NodeId,
        instance: &str,
    ) -> Result<Revocation, FabricSideError> {
        Ok(self.revoke(node, instance).await?)
    }

    async fn partition_members(&self, pkey: PKey) -> Result<PartitionMembers, FabricSideError> {
        Ok(PartitionMembers {
            members: self.members(pkey).await?,
            source: MEMBERS_SOURCE,
        })
    }

    fn conditions(&self) -> Vec<Condition> {
        Vec::new()
    }
}

#[async_trait]
impl SubnetManager for UfmBroker {
    fn backend(&self) -> &'static str {
        "ufm"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.apply_own(desired, &[], generation).await
    }

    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.apply_own(desired, grants, generation).await
    }
}
