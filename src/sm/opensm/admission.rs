//! What of a node's set is admitted: the generation fence (one check, `State::fence`), the
//! ports it claims (proven through the fabric and the operator's inventory, or held by another
//! node), the grants its keys need, and the checks against the operator's part of the file.
//! Pure over `State` (the stored sets, held in memory) except `gather_evidence`, which asks
//! the fabric before the admission lock is taken.
//!
//! Generations (fencing): each node orders its sets with a persisted counter. A set with a lower
//! generation than the stored one, or the same generation and a different set, is refused with
//! [`OpenSmError::StaleGeneration`] carrying the stored generation (never answered OK); the same
//! generation with the same set is a retry and re-checks the file.

use super::config::OpenSmConfig;
use super::error::{task_failed, OpenSmError};
use super::isolation;
use super::model::PartitionsConf;
use super::ownership::{
    judge, FabricFacts, OperatorInventory, OwnershipRefusal, PortDirectory, Proof,
};
use super::region::{check_operator_keys, FullDefault, TableOverflow};
use super::store::{AcceptedGrant, StoredNode};
use crate::domain::{Guid, NodeId, NodeMemberships, RetiredKeys};
use crate::sm::grant_judge::{Freshness, Ledger, VerifiedGrants};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// What the last read of the operator's part of the file says, as admission needs it.
#[derive(Clone, Copy)]
pub(super) struct Posture<'a> {
    /// The operator's part.
    pub(super) operator: &'a PartitionsConf,
    /// Where the Default entry grants `ALL=full`.
    pub(super) all_full: Option<FullDefault>,
}

/// The stored sets, locked.
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave State half-updated in a way that matters
    // more than stopping would: keep serving.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `config` requires grants.
pub(super) fn requires_grants(config: &OpenSmConfig) -> bool {
    config.grants.as_ref().is_some_and(|g| g.require)
}

/// The grants a set carries, checked before the lock, and whether their age is judged.
#[derive(Clone, Copy)]
pub(super) struct Carried<'a> {
    /// The set's grants ([`crate::sm::grant_judge::verify_all`]).
    pub(super) grants: &'a VerifiedGrants,
    /// Whether a grant not yet admitted for the node is judged by its age.
    pub(super) freshness: Freshness,
}

/// What of a node's set is admitted ([`State::judge_set`]).
pub(super) struct Admitted {
    pub(super) set: NodeMemberships,
    pub(super) moves: BTreeMap<Guid, NodeId>,
    pub(super) accepted: Option<Vec<AcceptedGrant>>,
    /// When given, `set` is only the part of the request that could be admitted (refused ports
    /// left out, or only its removals) and the caller gets this refusal after the commit.
    pub(super) refusal: Option<OpenSmError>,
}

/// What the fabric and the inventory said about a request's new ports.
#[derive(Default)]
pub(super) struct Evidence {
    facts: FabricFacts,
    inventory: OperatorInventory,
    /// Why the fabric or the inventory could not be asked: every new port is unproven.
    failure: Option<OpenSmError>,
}

pub(super) struct State {
    pub(super) nodes: BTreeMap<NodeId, StoredNode>,
    /// Every consumed grant id (any node's): refused forever.
    pub(super) consumed: BTreeSet<String>,
    /// Retired keys: grants issued before their retirement are refused.
    pub(super) retired: RetiredKeys,
    pub(super) guid_owner: BTreeMap<Guid, NodeId>,
    /// Requests admitted in part (a port refused, or only their removals), by node: the
    /// request and its generation. The same request again is judged again, not refused as a
    /// stale generation (the stored set differs from it).
    pub(super) partial: BTreeMap<NodeId, (u64, NodeMemberships)>,
    /// Admitted node sets not yet stored: the next commit stores them before it writes.
    pub(super) unsaved: BTreeSet<NodeId>,
}

impl State {
    /// Every node's set, and the unsaved ones (taken: the commit that writes this snapshot
    /// stores them first).
    pub(super) fn snapshot(&mut self) -> (BTreeMap<NodeId, StoredNode>, Vec<StoredNode>) {
        let unsaved = std::mem::take(&mut self.unsaved)
            .into_iter()
            .filter_map(|id| self.nodes.get(&id).cloned())
            .collect();
        (self.nodes.clone(), unsaved)
    }

    /// [`StoredNode::fence`] for `set` against `old`, the node's stored set, except that a
    /// request admitted only in part is judged again when it comes back with the same
    /// generation (its port may be provable now), instead of being refused as another set.
    pub(super) fn fence(
        &self,
        old: &StoredNode,
        set: &NodeMemberships,
        generation: u64,
    ) -> Result<bool, u64> {
        match old.fence(set, generation) {
            Err(stored)
                if stored == generation
                    && self
                        .partial
                        .get(&set.node_id)
                        .is_some_and(|(g, r)| *g == generation && r == set) =>
            {
                Ok(false)
            }
            other => other,
        }
    }

    /// Decides what of `desired` is admitted (under the admission lock); `None`: a retry of
    /// the stored set (same generation), served again.
    ///
    /// Rules (docs/OPENSM.md, "Failure isolation"): the generation fences first. A port that
    /// cannot be proven the node's, or that another node holds, is refused with its keys and
    /// the rest of the set goes on. A set that only takes away from the stored one (a release)
    /// needs no posture, operator-key or table check. A set refused for any other reason still
    /// has its removals applied when it carries any (the node gets the refusal either way).
    pub(super) fn judge_set(
        &self,
        config: &OpenSmConfig,
        file: Posture<'_>,
        desired: &NodeMemberships,
        carried: Carried<'_>,
        generation: u64,
        evidence: Option<&Evidence>,
    ) -> Result<Option<Admitted>, OpenSmError> {
        let stored = self.nodes.get(&desired.node_id);
        if let Some(old) = stored {
            match self.fence(old, desired, generation) {
                Ok(true) => return Ok(None),
                Ok(false) => {}
                Err(stored) => {
                    return Err(OpenSmError::StaleGeneration {
                        sent: generation,
                        stored,
                    })
                }
            }
        }
        let (moves, mut refused) = match evidence {
            Some(ev) => self.prove_claims(config, desired, ev),
            None => (BTreeMap::new(), BTreeMap::new()),
        };
        for g in &desired.port_guids {
            if let Some(owner) = self.guid_owner.get(g) {
                if owner != &desired.node_id && moves.get(g) != Some(owner) {
                    refused.entry(*g).or_insert(OpenSmError::PortHeld {
                        port: *g,
                        owner: owner.clone(),
                    });
                }
            }
        }
        let set = isolation::strip_ports(desired, &refused.keys().copied().collect());
        // A port that is forbidden or another node's is refused even when it carries no key;
        // an unproven one (the fabric does not show it yet, or cannot be asked) only when the
        // request gives it a key: a keyless new port does not hold up a release.
        let port_refusal = refused
            .values()
            .find(|e| {
                matches!(
                    e,
                    OpenSmError::PortForbidden(_) | OpenSmError::PortHeld { .. }
                )
            })
            .or_else(|| {
                refused
                    .iter()
                    .find(|(g, _)| desired.keys.keys().any(|k| desired.gives(*k, **g)))
                    .map(|(_, e)| e)
            })
            .cloned();
        if let Some(e) = &port_refusal {
            // Nothing else would change: refused, nothing stored or written.
            let unchanged = match stored {
                Some(old) => isolation::same_effect(&old.memberships, &set),
                None => set.port_guids.is_empty(),
            };
            if unchanged {
                return Err(e.clone());
            }
        }
        let release = stored.is_some_and(|old| isolation::removes_only(&old.memberships, &set));
        let checked = self
            .judge_grants(config, &set, carried.grants, carried.freshness)
            .and_then(|accepted| {
                if !release {
                    self.admissible(config, file, &set)?;
                }
                Ok(accepted)
            });
        match checked {
            Ok(accepted) => Ok(Some(Admitted {
                set,
                moves,
                accepted,
                refusal: port_refusal,
            })),
            Err(e) => {
                let Some(old) = stored else {
                    return Err(e);
                };
                let part = isolation::removal_part(&old.memberships, &set);
                if !isolation::takes_away(&old.memberships, &part) {
                    return Err(e);
                }
                let accepted = requires_grants(config).then(|| {
                    old.grants
                        .iter()
                        .filter(|g| {
                            part.keys
                                .get(&g.pkey)
                                .is_some_and(|k| k.membership == g.membership)
                        })
                        .cloned()
                        .collect()
                });
                Ok(Some(Admitted {
                    set: part,
                    moves: BTreeMap::new(),
                    accepted,
                    refusal: Some(e),
                }))
            }
        }
    }

    /// Takes an admitted set in memory, marked unsaved (the next commit stores it). Ports that
    /// move (`moves`: GUID -> the node that held it) leave their old node's set (same
    /// generation); both sets are stored in the same transaction, so the port is never stored
    /// in two.
    pub(super) fn admit(
        &mut self,
        desired: NodeMemberships,
        generation: u64,
        moves: BTreeMap<Guid, NodeId>,
        accepted: Option<Vec<AcceptedGrant>>,
    ) {
        let losers: BTreeSet<&NodeId> = moves.values().collect();
        for from in losers {
            let Some(old) = self.nodes.get_mut(from) else {
                continue;
            };
            old.memberships
                .port_guids
                .retain(|g| moves.get(g).is_none_or(|f| f != from));
            self.unsaved.insert(from.clone());
        }
        for (g, f) in &moves {
            if self.guid_owner.get(g) == Some(f) {
                self.guid_owner.remove(g);
            }
        }
        let old_guids = self
            .nodes
            .get(&desired.node_id)
            .map(|old| old.memberships.port_guids.clone())
            .unwrap_or_default();
        for g in &old_guids {
            self.guid_owner.remove(g);
        }
        for g in &desired.port_guids {
            self.guid_owner.insert(*g, desired.node_id.clone());
        }
        self.unsaved.insert(desired.node_id.clone());
        let mut record = self
            .nodes
            .remove(&desired.node_id)
            .unwrap_or_else(|| StoredNode::new(desired.clone(), generation));
        if let Some(accepted) = accepted {
            // A grant of the previous accepted set that this one no longer carries is consumed:
            // its instance was released. Stored in the same record, so in the same transaction.
            for id in crate::sm::grant_judge::replace_grants(&mut record, accepted) {
                tracing::info!(node_id = %desired.node_id, grant_id = %id, "grant consumed: its key left the node's set");
                self.consumed.insert(id);
            }
        }
        record.memberships = desired;
        record.generation = generation;
        record.gated = false;
        self.nodes
            .insert(record.memberships.node_id.clone(), record);
    }

    /// With grants required: the grants that justify `desired.keys`, or the refusal naming the
    /// key and the reason. `None` when grants are not required (nothing is recorded).
    ///
    /// Rules: every carried grant must verify (known key id, signature, the key's validity
    /// window: checked before the lock, [`crate::sm::grant_judge::verify_all`]), name this node
    /// exactly, this fabric, a key of the set with exactly its membership, an instance not
    /// revoked on this node, a key not retired since its issue, and not be consumed; one the
    /// node's stored set does not hold yet must be within its lifetime (`freshness`); a refused
    /// carried grant refuses the whole set. Every key of the set needs a carried grant, except a key the
    /// node's stored set already holds with the same membership: a set that only removes keys
    /// (a release) needs no grant, and such a key keeps the grants stored for it.
    fn judge_grants(
        &self,
        config: &OpenSmConfig,
        desired: &NodeMemberships,
        grants: &VerifiedGrants,
        freshness: Freshness,
    ) -> Result<Option<Vec<AcceptedGrant>>, OpenSmError> {
        let Some(policy) = config.grants.as_ref().filter(|g| g.require) else {
            return Ok(None);
        };
        let stored = self.nodes.get(&desired.node_id);
        let ledger = Ledger {
            consumed: &self.consumed,
            retired: &self.retired,
        };
        crate::sm::grant_judge::judge(policy, ledger, stored, desired, grants, freshness)
            .map(Some)
            .map_err(|(pkey, error)| {
                let e = OpenSmError::GrantRefused {
                    node: desired.node_id.clone(),
                    pkey,
                    error: Box::new(error),
                };
                tracing::warn!(node_id = %desired.node_id, error = %e, "set refused: grant");
                e
            })
    }

    /// Judges every GUID of `desired` not already in the node's stored set. Returns the ports
    /// that move from another node, and the refused ports with why (each logged).
    fn prove_claims(
        &self,
        config: &OpenSmConfig,
        desired: &NodeMemberships,
        evidence: &Evidence,
    ) -> (BTreeMap<Guid, NodeId>, BTreeMap<Guid, OpenSmError>) {
        let held: BTreeSet<Guid> = self
            .nodes
            .get(&desired.node_id)
            .map(|n| n.memberships.port_guids.iter().copied().collect())
            .unwrap_or_default();
        let mut moves = BTreeMap::new();
        let mut refused = BTreeMap::new();
        for g in desired.port_guids.iter().filter(|g| !held.contains(g)) {
            if let Some(e) = &evidence.failure {
                refused.insert(*g, e.clone());
                continue;
            }
            let holder = self.guid_owner.get(g);
            let verdict = judge(
                desired.node_id.as_str(),
                *g,
                &evidence.facts,
                &config.ownership.description_patterns,
                &evidence.inventory,
                holder.map(NodeId::as_str),
            );
            match verdict {
                Ok(Proof::Moved { from, description }) => {
                    tracing::info!(node_id = %desired.node_id, guid = %g, from = %from, description = %description, "port moves to the node the fabric shows it in");
                    if let Some(holder) = holder {
                        moves.insert(*g, holder.clone());
                    }
                }
                Ok(proof) => {
                    tracing::debug!(node_id = %desired.node_id, guid = %g, ?proof, "port claim proven");
                }
                Err(refusal) => {
                    tracing::warn!(node_id = %desired.node_id, guid = %g, reason = %refusal, "port claim refused");
                    let e = match refusal {
                        OwnershipRefusal::Forbidden { .. }
                        | OwnershipRefusal::OwnedByOther { .. } => {
                            OpenSmError::PortForbidden(refusal)
                        }
                        OwnershipRefusal::NotAsked { .. } | OwnershipRefusal::NotShown { .. } => {
                            OpenSmError::PortNotShown(refusal)
                        }
                    };
                    refused.insert(*g, e);
                }
            }
        }
        (moves, refused)
    }

    /// Request checks against the posture and the operator's part of the file. Ports another
    /// node holds were already taken out of `desired` by [`State::judge_set`].
    fn admissible(
        &self,
        config: &OpenSmConfig,
        file: Posture<'_>,
        desired: &NodeMemberships,
    ) -> Result<(), OpenSmError> {
        if !desired.keys.is_empty() && !config.allow_full_default {
            if let Some(why) = file.all_full {
                return Err(OpenSmError::InsecureDefault(why));
            }
        }
        check_operator_keys(file.operator, desired.keys.keys())?;
        let size = config.pkey_table_size;
        for g in &desired.port_guids {
            let n =
                file.operator.table_entries_for(*g, config.allow_both_pkeys) + desired.keys.len();
            if n > size {
                return Err(OpenSmError::TableFull(TableOverflow {
                    port: Some(*g),
                    needed: n,
                    capacity: size,
                }));
            }
        }
        Ok(())
    }
}

/// Asks the fabric about every GUID of `desired` not already in the node's stored set
/// (and reads the inventory), outside the admission lock. Fails closed. Asks nothing for a
/// set the generation check will refuse anyway (that refusal must not wait for the SA).
pub(super) async fn gather_evidence(
    state: &Mutex<State>,
    config: &OpenSmConfig,
    directory: &Arc<dyn PortDirectory>,
    desired: &NodeMemberships,
    generation: u64,
) -> Result<Evidence, OpenSmError> {
    let held: BTreeSet<Guid> = {
        let st = lock(state);
        match st.nodes.get(&desired.node_id) {
            Some(old) if st.fence(old, desired, generation).is_err() => {
                return Ok(Evidence::default());
            }
            Some(old) => old.memberships.port_guids.iter().copied().collect(),
            None => BTreeSet::new(),
        }
    };
    let new: Vec<Guid> = desired
        .port_guids
        .iter()
        .copied()
        .filter(|g| !held.contains(g))
        .collect();
    if new.is_empty() {
        return Ok(Evidence::default());
    }
    // Fail closed: a port the fabric or the inventory cannot speak for is refused (with
    // its keys); the rest of the set, its removals first, does not wait for it.
    let unproven = |e: OpenSmError| {
        tracing::warn!(node_id = %desired.node_id, error = %e, "port claim refused");
        Evidence {
            failure: Some(e),
            ..Evidence::default()
        }
    };
    let facts = match directory.facts(&new).await {
        Ok(facts) => facts,
        Err(e) => return Ok(unproven(OpenSmError::FabricUnreachable(e))),
    };
    let inventory = match &config.ownership.inventory_file {
        Some(path) => {
            let path = path.clone();
            match tokio::task::spawn_blocking(move || OperatorInventory::load(&path))
                .await
                .map_err(|e| task_failed("inventory", e))?
            {
                Ok(inventory) => inventory,
                Err(e) => return Ok(unproven(OpenSmError::Inventory(e))),
            }
        }
        None => OperatorInventory::default(),
    };
    Ok(Evidence {
        facts,
        inventory,
        failure: None,
    })
}

/// Checks a desired set on its own ([`NodeMemberships::validate`]) and its key count.
pub fn validate(desired: &NodeMemberships, table_size: usize) -> Result<(), OpenSmError> {
    desired.validate().map_err(OpenSmError::Invalid)?;
    // The default partition takes one entry.
    if desired.keys.len() + 1 > table_size {
        return Err(OpenSmError::TableFull(TableOverflow {
            port: None,
            needed: desired.keys.len() + 1,
            capacity: table_size,
        }));
    }
    Ok(())
}
