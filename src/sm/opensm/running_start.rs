//! An SM-host agent that starts beside an OpenSM that is already running (an agent upgrade or
//! restart, OpenSM untouched): what its held-back sets keep.
//!
//! With peers, every set loaded at start is held back until the node or a caught-up peer
//! confirms it ([`super::sync::GatedStore`]): its keys stay out of the region (fail closed), so
//! an OpenSM that starts after the agent never reads a set the node may have replaced. An
//! OpenSM that is *already running* has programmed the file as it is, though: a region
//! rewritten without those keys would take every tenant key off its ports at the next sweep.
//! So when OpenSM runs at the agent's start, a held-back set keeps the keys that both its
//! stored record and the running file give the node's ports ([`KeepRunningKeys`]): never more
//! than the file already holds (nothing stale comes back), never fewer unless a newer confirmed
//! set (the node's, or a peer's at catch-up) removes them. The set is still held back (not
//! served to peers, confirmed like any other) until confirmed.
//!
//! Together with the commit gate ([`super::backend::OpenSmBackend::hold_commits_until_caught_up`]:
//! no commit for a node or the local apply before the catch-up's), a restarted agent never
//! rewrites the running file with fewer tenant keys than it holds.

use super::config::OpenSmConfig;
use super::model::{MemberKind, PortSet};
use super::parse::parse;
use super::store::{CommitState, NodeMembershipStore, NodeStoreError, StoredNode};
use crate::domain::{Guid, Membership};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Whether OpenSM runs now: the pid from `pid_file`/`pid` names a live process (not a zombie)
/// called `process_name`. `Err` says why not.
pub fn opensm_running(config: &OpenSmConfig) -> Result<i32, String> {
    super::sminfo::pid_state(config).map_err(|down| down.reason)
}

/// The tenant memberships the running file gives each port: key base -> port -> membership.
pub type FileMembers = BTreeMap<u16, BTreeMap<Guid, MemberKind>>;

/// The members named by GUID in `file` (the whole partitions file, parsed as OpenSM reads it).
/// An unreadable or unparsable file gives none: nothing is kept.
pub fn file_members(file: &Path) -> FileMembers {
    let Ok(bytes) = super::file::read_or_empty(file) else {
        return FileMembers::new();
    };
    let Ok(conf) = parse(&bytes) else {
        return FileMembers::new();
    };
    let mut out = FileMembers::new();
    for (base, partition) in conf.effective() {
        for m in &partition.members {
            if let PortSet::Guid(g) = m.ports {
                out.entry(base).or_default().insert(g, m.kind);
            }
        }
    }
    out
}

/// What of `record`'s stored keys the running file holds on the node's ports with the same
/// membership: the keys a held-back set keeps while OpenSM runs.
pub fn kept_keys(record: &StoredNode, file: &FileMembers) -> StoredNode {
    let mut kept = record.clone();
    kept.memberships.keys.retain(|key, setting| {
        let Some(ports) = file.get(&key.base()) else {
            return false;
        };
        let wanted: Vec<Guid> = match &setting.ports {
            Some(p) => p.iter().copied().collect(),
            None => record.memberships.port_guids.clone(),
        };
        !wanted.is_empty()
            && wanted.iter().all(|g| {
                ports.get(g).is_some_and(|kind| match setting.membership {
                    Membership::Full => matches!(kind, MemberKind::Full | MemberKind::Both),
                    Membership::Limited => *kind == MemberKind::Limited,
                })
            })
    });
    kept
}

/// The store of an SM host with peers whose OpenSM runs at the agent's start: every record
/// loads held back (as [`super::sync::GatedStore`]) but keeps the keys the running file holds
/// for it ([`kept_keys`]).
pub struct KeepRunningKeys {
    /// The store.
    pub store: Arc<dyn NodeMembershipStore>,
    /// The running file's members, read at start.
    pub file: FileMembers,
}

impl NodeMembershipStore for KeepRunningKeys {
    fn load_all(&self) -> Result<Vec<StoredNode>, NodeStoreError> {
        let nodes = self.store.load_all()?;
        let mut kept_total = 0;
        let out: Vec<StoredNode> = nodes
            .into_iter()
            .map(|n| {
                if !n.has_set() {
                    return n;
                }
                let kept = kept_keys(&n, &self.file).memberships.keys;
                kept_total += kept.len();
                let mut held = n.gated();
                held.memberships.keys = kept;
                held
            })
            .collect();
        if !out.is_empty() {
            tracing::warn!(
                nodes = out.len(),
                kept_keys = kept_total,
                "SM host with peers, OpenSM already running: every stored node set is held back until the node or a caught-up peer confirms it, keeping the keys the running partitions file holds for it"
            );
        }
        Ok(out)
    }
    fn put_group(
        &self,
        nodes: &[StoredNode],
        commit: Option<&CommitState>,
    ) -> Result<(), NodeStoreError> {
        self.store.put_group(nodes, commit)
    }
    fn load_commit_state(&self) -> Result<CommitState, NodeStoreError> {
        self.store.load_commit_state()
    }
    fn load_retired(&self) -> Result<crate::domain::RetiredKeys, NodeStoreError> {
        self.store.load_retired()
    }
    fn put_retired(&self, retired: &crate::domain::RetiredKeys) -> Result<(), NodeStoreError> {
        self.store.put_retired(retired)
    }
    fn load_fenced(&self) -> Result<Vec<super::fenced_host::FencedHost>, NodeStoreError> {
        self.store.load_fenced()
    }
    fn put_fenced(&self, fenced: &[super::fenced_host::FencedHost]) -> Result<(), NodeStoreError> {
        self.store.put_fenced(fenced)
    }
}
