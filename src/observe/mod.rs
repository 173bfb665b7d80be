//! Port observers: how the agent sees its own ports' state and P_Key tables.

pub mod auto;
pub mod combined;
mod config;
pub mod embedded;
mod error;
pub mod presence;
pub mod sa_presence;
pub mod smp;
pub mod sysfs;
pub mod verbs;

pub use config::{ObserverConfig, ObserverConfigError, ObserverKind};
pub(crate) use error::read_blocking;
pub use error::{NoDevices, ObserveError, ReadError};
pub use presence::Presence;

use crate::domain::{Guid, Inventory};
use async_trait::async_trait;
use std::time::Duration;

/// How long to wait before reading again: `fast` while a transition is awaited.
pub(crate) fn poll_interval(pending: bool, fast: Duration, slow: Duration) -> Duration {
    if pending {
        fast
    } else {
        slow
    }
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

    /// What the subnet manager says of `guids` (covered ports missing from this node's read),
    /// one answer per GUID in order, asked through a port of this node that is still in the
    /// fabric (see [`presence`]). The default has no way to ask: every answer is
    /// [`Presence::Unknown`], and such a port keeps blocking RELEASED.
    async fn fabric_presence(&self, guids: &[Guid]) -> Vec<Presence> {
        presence::unknown(
            guids,
            &format!(
                "the {} observer cannot ask the subnet administrator",
                self.kind()
            ),
        )
    }
}
