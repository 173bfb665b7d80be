//! The store adapters the backends persist through: each keeps one backend's state in the
//! agent's store (its own table or meta key), so the backends depend on their traits only.

use crate::embedded_fabric::SimPersistence;
use crate::sm::opensm::{CommitState, NodeMembershipStore, NodeStoreError, StoredNode};
use crate::sm::ufm::{LedgerStoreError, UfmLedgerStore};
use crate::store::Store;
use std::sync::Arc;

const SIM_TABLES: &str = "sim_tables";

/// A stored record that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("stored record {key}: {source}")]
struct RecordError {
    /// The record's key (a node id or a meta key).
    key: String,
    /// Why it does not decode.
    source: serde_json::Error,
}
/// Store meta key of the OpenSM backend's commit state (unconfirmed write, rejected file).
const OPENSM_COMMIT: &str = "opensm_commit_state";
/// Store meta key of the OpenSM backend's retired P_Keys.
const OPENSM_RETIRED: &str = "opensm_retired_pkeys";
/// Store meta key of the peer SM hosts this SM host holds fenced.
const OPENSM_FENCED: &str = "opensm_fenced_sm_hosts";
/// Store meta key: the log epoch of the rollback whose node sets were marked unconfirmed.
const SM_ROLLBACK_MARKED: &str = "sm_rollback_marked";
/// Store meta key of the UFM backend's ledger (GUIDs this node put in partitions).
const UFM_LEDGER: &str = "ufm_ledger";

/// Keeps the SM host's per-node memberships in the agent's store (one row per node, the
/// commit state in a meta key). Public so benches can restart the backend on the real store.
pub struct StoredSmNodes(pub Arc<Store>);

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSmNode {
    memberships: crate::domain::NodeMemberships,
    generation: u64,
    // Absent in records written before grants existed.
    #[serde(default)]
    grants: Vec<crate::sm::opensm::AcceptedGrant>,
    #[serde(default)]
    consumed: std::collections::BTreeSet<String>,
    #[serde(default)]
    revoked_instances: std::collections::BTreeSet<String>,
    // Absent in records written before revocations were shared with peer SM hosts.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    revoked_grants: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Loaded from a store found restored from a copy, and not rewritten since: kept out of the
    /// rendered region (see [`StoredNode::unconfirmed`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unconfirmed: bool,
}

impl StoredSmNodes {
    /// After a detected rollback (once per rollback), marks every stored set unconfirmed,
    /// durably, so a second restart still keeps them out of the region.
    fn mark_restored(&self, rows: &mut [(String, StoredSmNode)]) -> Result<(), NodeStoreError> {
        let Some(why) = self.0.rolled_back() else {
            return Ok(());
        };
        let epoch = self.0.epoch().to_string();
        if self
            .0
            .meta(SM_ROLLBACK_MARKED)
            .map_err(NodeStoreError::new)?
            .as_deref()
            == Some(epoch.as_bytes())
        {
            return Ok(());
        }
        tracing::error!(%why, nodes = rows.len(), "SM-host store rolled back: every stored node set stays out of the partitions file until that node sends its next set");
        let mut bytes = Vec::with_capacity(rows.len());
        for (id, n) in rows.iter_mut() {
            n.unconfirmed = true;
            bytes.push((
                id.clone(),
                serde_json::to_vec(n).map_err(NodeStoreError::new)?,
            ));
        }
        self.0
            .put_sm_nodes(&bytes, Some((SM_ROLLBACK_MARKED, epoch.as_bytes())))
            .map_err(NodeStoreError::new)
    }
}

impl NodeMembershipStore for StoredSmNodes {
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError> {
        let mut rows = self
            .0
            .sm_nodes()
            .map_err(NodeStoreError::new)?
            .into_iter()
            .map(|(id, bytes)| {
                let n: StoredSmNode = serde_json::from_slice(&bytes).map_err(|source| {
                    NodeStoreError::new(RecordError {
                        key: id.clone(),
                        source,
                    })
                })?;
                Ok((id, n))
            })
            .collect::<Result<Vec<_>, NodeStoreError>>()?;
        self.mark_restored(&mut rows)?;
        Ok(rows
            .into_iter()
            .map(|(_, n)| {
                let node = StoredNode {
                    memberships: n.memberships,
                    generation: n.generation,
                    grants: n.grants,
                    consumed: n.consumed,
                    revoked_instances: n.revoked_instances,
                    revoked_grants: n.revoked_grants,
                    gated: false,
                };
                if n.unconfirmed {
                    node.unconfirmed()
                } else {
                    node
                }
            })
            .collect())
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
                    grants: n.grants.clone(),
                    consumed: n.consumed.clone(),
                    revoked_instances: n.revoked_instances.clone(),
                    revoked_grants: n.revoked_grants.clone(),
                    unconfirmed: false,
                })?;
                Ok((n.memberships.node_id.to_string(), bytes))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(NodeStoreError::new)?;
        let state = commit
            .map(serde_json::to_vec)
            .transpose()
            .map_err(NodeStoreError::new)?;
        self.0
            .put_sm_nodes(&rows, state.as_deref().map(|s| (OPENSM_COMMIT, s)))
            .map_err(NodeStoreError::new)
    }

    fn load_commit_state(&self) -> Result<CommitState, NodeStoreError> {
        match self.0.meta(OPENSM_COMMIT).map_err(NodeStoreError::new)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| {
                NodeStoreError::new(RecordError {
                    key: OPENSM_COMMIT.to_owned(),
                    source,
                })
            }),
            None => Ok(CommitState::default()),
        }
    }

    fn load_retired(&self) -> Result<crate::domain::RetiredKeys, NodeStoreError> {
        match self.0.meta(OPENSM_RETIRED).map_err(NodeStoreError::new)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| {
                NodeStoreError::new(RecordError {
                    key: OPENSM_RETIRED.to_owned(),
                    source,
                })
            }),
            None => Ok(crate::domain::RetiredKeys::default()),
        }
    }

    fn put_retired(&self, retired: &crate::domain::RetiredKeys) -> Result<(), NodeStoreError> {
        let bytes = serde_json::to_vec(retired).map_err(NodeStoreError::new)?;
        self.0
            .set_meta(OPENSM_RETIRED, &bytes)
            .map_err(NodeStoreError::new)
    }

    fn load_fenced(&self) -> Result<Vec<crate::sm::opensm::fence::FencedHost>, NodeStoreError> {
        match self.0.meta(OPENSM_FENCED).map_err(NodeStoreError::new)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| {
                NodeStoreError::new(RecordError {
                    key: OPENSM_FENCED.to_owned(),
                    source,
                })
            }),
            None => Ok(Vec::new()),
        }
    }

    fn put_fenced(
        &self,
        fenced: &[crate::sm::opensm::fence::FencedHost],
    ) -> Result<(), NodeStoreError> {
        let bytes = serde_json::to_vec(fenced).map_err(NodeStoreError::new)?;
        self.0
            .set_meta(OPENSM_FENCED, &bytes)
            .map_err(NodeStoreError::new)
    }
}

/// Keeps the simulated fabric's tables in the agent's store.
pub(super) struct StoredSimTables(pub(super) Arc<Store>);

impl SimPersistence for StoredSimTables {
    fn load(&self) -> Option<Vec<Vec<u16>>> {
        let bytes = self.0.meta(SIM_TABLES).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    fn save(&self, tables: &[Vec<u16>]) -> Result<(), crate::embedded_fabric::PersistError> {
        let bytes = serde_json::to_vec(tables)?;
        Ok(self.0.set_meta(SIM_TABLES, &bytes)?)
    }
}

/// Keeps the UFM backend's ledger in the agent's store (meta key `ufm_ledger`): it goes back
/// with the store when the store is restored from a copy.
pub struct StoredUfmLedger(pub Arc<Store>);

impl UfmLedgerStore for StoredUfmLedger {
    fn load(&self) -> Result<Option<Vec<u8>>, LedgerStoreError> {
        self.0.meta(UFM_LEDGER).map_err(LedgerStoreError::new)
    }

    fn save(&self, bytes: &[u8]) -> Result<(), LedgerStoreError> {
        self.0
            .set_meta(UFM_LEDGER, bytes)
            .map_err(LedgerStoreError::new)
    }
}

/// Each node's UFM ledger on a UFM broker, in the agent's store: meta key `ufm_ledger/<node>`;
/// the broker host's own node keeps the direct mode's key `ufm_ledger`, so switching a host to
/// broker keeps its ledger.
pub(super) struct StoredNodeLedgers {
    /// The store.
    pub(super) store: Arc<Store>,
    /// This host's node id.
    pub(super) local: crate::domain::NodeId,
}

/// One node's ledger under its own meta key.
struct StoredNodeLedger {
    store: Arc<Store>,
    key: String,
}

impl crate::sm::ufm::broker::NodeLedgers for StoredNodeLedgers {
    fn ledger(&self, node: &crate::domain::NodeId) -> Arc<dyn UfmLedgerStore> {
        let key = if *node == self.local {
            UFM_LEDGER.to_owned()
        } else {
            format!("{UFM_LEDGER}/{}", node.as_str())
        };
        Arc::new(StoredNodeLedger {
            store: self.store.clone(),
            key,
        })
    }
}

impl UfmLedgerStore for StoredNodeLedger {
    fn load(&self) -> Result<Option<Vec<u8>>, LedgerStoreError> {
        self.store.meta(&self.key).map_err(LedgerStoreError::new)
    }

    fn save(&self, bytes: &[u8]) -> Result<(), LedgerStoreError> {
        self.store
            .set_meta(&self.key, bytes)
            .map_err(LedgerStoreError::new)
    }
}
