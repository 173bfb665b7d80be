//! The model UFM's state ([`UfmWorld`]) in `--ufm` runs, kept in the world under its one lock
//! (`model_ufm` drives it).

use super::constants::{PORTS, PORT_GUID_BASE};
use super::keys::Keys;
use crate::fake_ufm::model::Model;
use fabric_agent::domain::Membership;
use std::collections::BTreeMap;

/// The model UFM's state, kept in the world (one lock for everything).
#[derive(Debug, Default)]
pub struct UfmWorld {
    /// Partitions, the stamp, the quirks of this seed.
    pub(crate) model: Model,
    /// Requests UFM will still execute, by request number, with when they were sent (ms into
    /// the run; a UFM restart loses them).
    pub(crate) pending: BTreeMap<u64, u64>,
}

impl UfmWorld {
    /// The keys UFM's partitions give the node's ports (what its SM programs).
    pub(crate) fn node_keys(&self) -> Keys {
        let mut keys = Keys::new();
        for (base, p) in &self.model.partitions {
            let mine: Vec<(u64, Membership)> = p
                .members
                .iter()
                .filter(|(g, _)| (PORT_GUID_BASE..PORT_GUID_BASE + PORTS as u64).contains(g))
                .map(|(g, m)| (*g, m.membership))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let full = mine.iter().any(|(_, m)| *m == Membership::Full);
            let value = if full { base | 0x8000 } else { *base };
            keys.insert(*base, (value, mine.iter().map(|(g, _)| *g).collect()));
        }
        keys
    }
}
