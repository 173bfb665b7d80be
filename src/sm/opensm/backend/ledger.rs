//! What the SM host holds against grants whatever a node sends, beyond revocations: retired
//! P_Keys (`RetirePKey`, the control plane deleting a partition) and grant ids consumed on a
//! peer SM host. Both only ever grow; both are stored before any set they change, and applied
//! to the stored sets like a revocation (the grants they end are consumed, the keys only those
//! grants justified leave the node's set), then the file is written and confirmed like a set.

use super::super::error::OpenSmError;
use super::super::store::NodeMembershipStore;
use super::{OpenSmBackend, StoredNode};
use crate::domain::{NodeId, PKey, RetiredKeys};
use crate::sm::grant_judge;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What a retirement did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retirement {
    /// Whether this call recorded anything new (false on a repeat or an earlier time).
    pub recorded: bool,
    /// The retirement time now held for the key.
    pub retired_at_unix_ms: u64,
    /// Per node, the grants this call consumed and the keys it took out of the node's set.
    pub removed: Vec<(NodeId, Vec<String>, Vec<PKey>)>,
    /// Sweeps requested since the backend started.
    pub sweeps: u64,
}

/// Stores `retired` durably (off the async threads).
async fn store_retired(
    store: &Arc<dyn NodeMembershipStore>,
    retired: RetiredKeys,
) -> Result<(), OpenSmError> {
    let store = Arc::clone(store);
    crate::sm::blocking::unblock(move || store.put_retired(&retired))
        .await
        .map_err(|e| super::super::error::task_failed("store", e))?
        .map_err(OpenSmError::Store)
}

/// Applies `retired` to every record; returns what changed, per node.
fn apply_to_all(
    nodes: &mut BTreeMap<NodeId, StoredNode>,
    retired: &RetiredKeys,
) -> Vec<(NodeId, Vec<String>, Vec<PKey>)> {
    nodes
        .iter_mut()
        .filter_map(|(id, record)| {
            grant_judge::apply_retired(record, retired).map(|(ids, keys)| (id.clone(), ids, keys))
        })
        .collect()
}

impl OpenSmBackend {
    /// The retired keys this host holds.
    pub fn retired(&self) -> RetiredKeys {
        self.inner.lock().retired.clone()
    }

    /// Retires `pkey` as of `retired_at_unix_ms` (the control plane's clock, the one its grants
    /// are stamped with): no grant for it issued at or before then is accepted again, and every
    /// node's stored grant for it issued then or before is consumed, its key taken out of the
    /// node's set. The retirement is stored before any set changes; then the file is written
    /// and confirmed like a set (same errors; UNAVAILABLE when not confirmed: the retirement is
    /// stored and the file retried). Idempotent; an earlier time than the one held changes
    /// nothing.
    pub async fn retire_pkey(
        &self,
        pkey: PKey,
        retired_at_unix_ms: u64,
    ) -> Result<Retirement, OpenSmError> {
        if !self.requires_grants() {
            return Err(OpenSmError::GrantsNotRequired);
        }
        let skew = self
            .inner
            .config
            .grants
            .as_ref()
            .and_then(|g| g.keys.lifetime())
            .map_or(0, |l| l.max_clock_skew_ms);
        let now = match grant_judge::Freshness::now() {
            grant_judge::Freshness::Checked { now_unix_ms } => now_unix_ms,
            grant_judge::Freshness::AdmittedByPeer => 0,
        };
        if retired_at_unix_ms == 0 || retired_at_unix_ms > now.saturating_add(skew) {
            return Err(OpenSmError::Invalid(crate::domain::DomainError::invalid(
                "retired_at_unix_ms",
                format!("{retired_at_unix_ms} is 0 or more than the {skew} ms clock skew ahead of this host's clock ({now})"),
            )));
        }
        let _alone = self.serial_unless_grouped().await;
        let mut out = Retirement::default();
        {
            let _admit = self.inner.admit.lock().await;
            let mut retired = self.inner.lock().retired.clone();
            out.recorded = retired.retire(pkey, retired_at_unix_ms);
            if out.recorded {
                store_retired(&self.inner.store, retired.clone()).await?;
            }
            out.retired_at_unix_ms = retired.retired_at(pkey).unwrap_or(retired_at_unix_ms);
            let mut st = self.inner.lock();
            let st = &mut *st;
            st.retired = retired;
            out.removed = apply_to_all(&mut st.nodes, &st.retired);
            for (node, ids, _) in &out.removed {
                st.consumed.extend(ids.iter().cloned());
                st.unsaved.insert(node.clone());
            }
            tracing::warn!(%pkey, retired_at_unix_ms = out.retired_at_unix_ms, recorded = out.recorded, removed = ?out.removed, "P_Key retired on the fabric side: grants issued before are refused");
        }
        self.commit(None).await?;
        out.sweeps = self.sweeps();
        Ok(out)
    }

    /// Records what a peer SM host holds against grants: its retired keys and, per node, the
    /// grant ids it holds consumed. Union only (nothing is ever un-retired or un-consumed); the
    /// retired keys are stored first, then the sets they and the consumed ids change (consumed
    /// like a release seen here: the grant leaves the set, with its key when no other grant
    /// justifies it), then the file is written and confirmed when anything changed. A node this
    /// host holds no set for gets a record holding only what it learned, so its first set here
    /// is judged against it. Returns the nodes whose record changed.
    pub async fn learn_ledger(
        &self,
        retired: &RetiredKeys,
        consumed: &BTreeMap<NodeId, BTreeSet<String>>,
    ) -> Result<Vec<NodeId>, OpenSmError> {
        let new = |st: &super::State| {
            retired
                .iter()
                .any(|(k, t)| st.retired.retired_at(k).is_none_or(|held| held < t))
                || consumed.iter().any(|(node, ids)| {
                    st.nodes
                        .get(node)
                        .is_none_or(|r| ids.iter().any(|id| !r.consumed.contains(id)))
                })
        };
        if !self.requires_grants() || !new(&self.inner.lock()) {
            return Ok(Vec::new());
        }
        let _alone = self.serial_unless_grouped().await;
        let mut changed = BTreeSet::new();
        {
            let _admit = self.inner.admit.lock().await;
            let mut union = self.inner.lock().retired.clone();
            let mut more = false;
            for (k, t) in retired.iter() {
                more |= union.retire(k, t);
            }
            if more {
                store_retired(&self.inner.store, union.clone()).await?;
            }
            let mut st = self.inner.lock();
            let st = &mut *st;
            for (node, ids) in consumed {
                let record = st
                    .nodes
                    .entry(node.clone())
                    .or_insert_with(|| StoredNode::revocations_only(node.clone()));
                if let Some((ids, removed)) = grant_judge::learn_consumed(record, ids) {
                    tracing::warn!(node_id = %node, consumed = ?ids, removed = ?removed.iter().map(ToString::to_string).collect::<Vec<_>>(), "grants consumed on a peer SM host: consumed here too");
                    st.consumed.extend(ids);
                    changed.insert(node.clone());
                }
            }
            st.retired = union;
            for (node, ids, keys) in apply_to_all(&mut st.nodes, &st.retired) {
                tracing::warn!(node_id = %node, consumed = ?ids, removed = ?keys.iter().map(ToString::to_string).collect::<Vec<_>>(), "P_Key retired on a peer SM host: retired here too");
                st.consumed.extend(ids);
                changed.insert(node);
            }
            for node in &changed {
                st.unsaved.insert(node.clone());
            }
        }
        if !changed.is_empty() {
            self.commit(None).await?;
        }
        Ok(changed.into_iter().collect())
    }
}
