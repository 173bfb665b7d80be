//! The embedded fabric's simulated ports laid next to a real observer's ports. With the embedded
//! backend on a real host (a soft-RoCE rig, a laptop with an HCA) the real devices are shown in
//! the inventory, while the keys the embedded SM programs live on the simulated ports; the node's
//! port selection decides which ports must hold them (by default every InfiniBand port: the
//! simulated ones, not an rxe device, whose link layer is Ethernet).

use super::{ObserveError, PortObserver, Presence};
use crate::domain::{Guid, Inventory};
use async_trait::async_trait;

/// A real observer plus the simulated ports.
pub struct CombinedObserver {
    real: Box<dyn PortObserver>,
    simulated: Box<dyn PortObserver>,
}

impl CombinedObserver {
    /// Combines two observers; the real one's kind names the result.
    pub fn new(real: Box<dyn PortObserver>, simulated: Box<dyn PortObserver>) -> CombinedObserver {
        CombinedObserver { real, simulated }
    }
}

#[async_trait]
impl PortObserver for CombinedObserver {
    fn kind(&self) -> &'static str {
        self.real.kind()
    }

    async fn inventory(&self) -> Result<Inventory, ObserveError> {
        let mut inv = self.real.inventory().await?;
        inv.ports.extend(self.simulated.inventory().await?.ports);
        Ok(inv)
    }

    /// Asked of the real observer: the simulated ports never leave the embedded fabric.
    async fn fabric_presence(&self, guids: &[Guid]) -> Vec<Presence> {
        self.real.fabric_presence(guids).await
    }

    async fn changed(&self, pending: bool) {
        tokio::select! {
            _ = self.real.changed(pending) => {}
            _ = self.simulated.changed(pending) => {}
        }
    }
}
