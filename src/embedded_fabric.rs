//! The embedded simulated fabric: this node's port tables as an in-process subnet manager would
//! program them. Shared by the `embedded` subnet-manager backend (which writes tables) and the
//! `embedded` observer (which reads them and wakes on every change). Tables are persisted
//! through [`SimPersistence`] so a restart keeps what the "fabric" held.

use crate::domain::{Guid, Inventory, LinkLayer, PKeyValue, PortInfo, PortState};
use std::sync::Mutex;
use thiserror::Error;
use tokio::sync::watch;

/// Where the simulated tables are kept across restarts.
pub trait SimPersistence: Send + Sync {
    /// The saved tables (one `Vec` per port), if any.
    fn load(&self) -> Option<Vec<Vec<u16>>>;
    /// Saves the tables durably.
    fn save(&self, tables: &[Vec<u16>]) -> Result<(), PersistError>;
}

/// Why a [`SimPersistence`] could not save, with its cause.
pub type PersistError = Box<dyn std::error::Error + Send + Sync>;

/// Why the simulated SM could not program the tables.
#[derive(Debug, Error)]
pub enum SimError {
    /// More keys than a port's table holds.
    #[error("P_Key table full: {wanted} entries wanted, {size} slots per port")]
    TableFull {
        /// Entries wanted including the default partition.
        wanted: usize,
        /// Table size.
        size: usize,
    },
    /// Persisting the tables failed.
    #[error("persisting simulated tables failed: {0}")]
    Persist(#[source] PersistError),
}

/// A simulated HCA with `ports` InfiniBand ports, all ACTIVE.
pub struct SimFabric {
    node_guid: Guid,
    table_size: usize,
    default_entry: PKeyValue,
    tables: Mutex<Vec<Vec<u16>>>,
    generation: watch::Sender<u64>,
    persistence: Box<dyn SimPersistence>,
}

impl SimFabric {
    /// Creates the simulated device for `node_id`, restoring saved tables when their shape
    /// matches. GUIDs are derived from the node id, so they are stable across restarts.
    /// `default_entry` is the default partition's entry in slot 0 of every table: 0x7FFF
    /// (limited member, a well-run fabric) or 0xFFFF (full member, an insecure posture).
    pub fn new(
        node_id: &str,
        ports: u8,
        table_size: usize,
        default_entry: PKeyValue,
        persistence: Box<dyn SimPersistence>,
    ) -> SimFabric {
        let fresh = || {
            let mut t = vec![0u16; table_size];
            t[0] = default_entry.0;
            t
        };
        let tables = match persistence.load() {
            Some(saved)
                if saved.len() == usize::from(ports)
                    && saved.iter().all(|t| t.len() == table_size) =>
            {
                saved
            }
            _ => (0..ports).map(|_| fresh()).collect(),
        };
        // FNV-1a of the node id gives a stable, well-spread 24-bit device number.
        let hash = node_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let node_guid = Guid(0x0002_c903_0000_0000 | ((hash & 0x00ff_ffff) << 8));
        SimFabric {
            node_guid,
            table_size,
            default_entry,
            tables: Mutex::new(tables),
            generation: watch::channel(0).0,
            persistence,
        }
    }

    /// Port GUIDs of the simulated ports.
    pub fn port_guids(&self) -> Vec<Guid> {
        let n = self.tables.lock().expect("sim lock").len();
        (1..=n as u64).map(|p| Guid(self.node_guid.0 + p)).collect()
    }

    /// Programs every port with the default partition plus `keys`, like an SM would.
    pub fn program(&self, keys: &[PKeyValue]) -> Result<(), SimError> {
        let wanted = keys.len() + 1;
        if wanted > self.table_size {
            return Err(SimError::TableFull {
                wanted,
                size: self.table_size,
            });
        }
        let mut table = vec![0u16; self.table_size];
        table[0] = self.default_entry.0;
        for (slot, k) in table[1..].iter_mut().zip(keys) {
            *slot = k.0;
        }
        self.replace(|tables| tables.iter_mut().for_each(|t| *t = table.clone()))
    }

    /// Programs each port with the default partition plus the keys `keys_of` gives its GUID,
    /// like an SM that gives each partition only its members' ports.
    pub fn program_ports(&self, keys_of: impl Fn(Guid) -> Vec<PKeyValue>) -> Result<(), SimError> {
        let guids = self.port_guids();
        let mut tables = Vec::with_capacity(guids.len());
        for g in guids {
            let keys = keys_of(g);
            let wanted = keys.len() + 1;
            if wanted > self.table_size {
                return Err(SimError::TableFull {
                    wanted,
                    size: self.table_size,
                });
            }
            let mut table = vec![0u16; self.table_size];
            table[0] = self.default_entry.0;
            for (slot, k) in table[1..].iter_mut().zip(&keys) {
                *slot = k.0;
            }
            tables.push(table);
        }
        self.replace(|t| *t = tables)
    }

    fn replace(&self, edit: impl FnOnce(&mut Vec<Vec<u16>>)) -> Result<(), SimError> {
        let mut tables = self.tables.lock().expect("sim lock");
        let mut next = tables.clone();
        edit(&mut next);
        if next == *tables {
            return Ok(());
        }
        self.persistence.save(&next).map_err(SimError::Persist)?;
        *tables = next;
        drop(tables);
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// The simulated ports as an inventory.
    pub fn inventory(&self) -> Inventory {
        let tables = self.tables.lock().expect("sim lock");
        let ports = tables
            .iter()
            // Port numbers are 1-255; the simulation never has more ports.
            .zip(1..=u8::MAX)
            .map(|(t, n)| PortInfo {
                device: "sim0".to_owned(),
                port_number: n,
                port_guid: Guid(self.node_guid.0 + u64::from(n)),
                node_guid: self.node_guid,
                lid: u16::from(n) + 1,
                sm_lid: 1,
                state: PortState::Active,
                link_layer: LinkLayer::Infiniband,
                pkeys: t.iter().map(|v| PKeyValue(*v)).collect(),
                fabric_port: false,
            })
            .collect();
        Inventory { ports }
    }

    /// A receiver that changes whenever a table changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Default, Clone)]
    struct Memory(Arc<Mutex<Option<Vec<Vec<u16>>>>>);
    impl SimPersistence for Memory {
        fn load(&self) -> Option<Vec<Vec<u16>>> {
            self.0.lock().unwrap().clone()
        }
        fn save(&self, t: &[Vec<u16>]) -> Result<(), PersistError> {
            *self.0.lock().unwrap() = Some(t.to_vec());
            Ok(())
        }
    }

    #[test]
    fn programs_persists_and_restores() {
        let mem = Memory::default();
        let sim = SimFabric::new(
            "n1",
            2,
            4,
            PKeyValue::DEFAULT_LIMITED,
            Box::new(mem.clone()),
        );
        let mut rx = sim.subscribe();
        sim.program(&[PKeyValue(0x8001), PKeyValue(0x0002)])
            .unwrap();
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert_eq!(
            sim.inventory().ports[1].pkeys,
            vec![
                PKeyValue(0x7FFF),
                PKeyValue(0x8001),
                PKeyValue(0x0002),
                PKeyValue(0)
            ]
        );
        sim.program(&[PKeyValue(0x8001), PKeyValue(0x0002)])
            .unwrap();
        assert!(
            !rx.has_changed().unwrap(),
            "no-op program must not wake observers"
        );
        let again = SimFabric::new("n1", 2, 4, PKeyValue::DEFAULT_LIMITED, Box::new(mem));
        assert_eq!(again.inventory(), sim.inventory());
        assert_eq!(again.port_guids(), sim.port_guids());
        assert!(matches!(
            sim.program(&[PKeyValue(1), PKeyValue(2), PKeyValue(3), PKeyValue(4)]),
            Err(SimError::TableFull { wanted: 5, size: 4 })
        ));
    }
}
