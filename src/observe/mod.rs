//! Port observers: how the agent sees its own ports' state and P_Key tables.

pub mod auto;
pub mod combined;
mod config;
pub mod embedded;
pub mod smp;
pub mod sysfs;
pub mod verbs;

pub use config::{ObserverConfig, ObserverConfigError, ObserverKind};

use crate::domain::Inventory;
use async_trait::async_trait;
use thiserror::Error;

/// Why the ports could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ObserveError {
    /// No RDMA device was found.
    #[error("no RDMA devices: {0}")]
    NoDevices(String),
    /// Reading a device or file failed.
    #[error("reading ports failed: {0}")]
    Io(String),
}

/// A source of port inventories.
#[async_trait]
pub trait PortObserver: Send + Sync + 'static {
    /// Observer name: "embedded", "smp", "sysfs" or "verbs".
    fn kind(&self) -> &'static str;

    /// Reads every port now (state, LIDs, the whole P_Key table). `fabric_port` is left false;
    /// the agent applies the node's port selection.
    async fn inventory(&self) -> Result<Inventory, ObserveError>;

    /// Resolves when the ports may have changed: an event arrived, or the poll interval passed.
    /// `pending` asks for the fast cadence (a transition is awaited); otherwise the slow one.
    /// Must not busy-wait.
    async fn changed(&self, pending: bool);
}
