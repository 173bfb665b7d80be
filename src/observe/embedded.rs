//! Embedded observer: reads [`SimFabric`]'s tables and wakes on every change (no polling).

use super::{ObserveError, PortObserver};
use crate::domain::Inventory;
use crate::embedded_fabric::SimFabric;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex};

/// Observer of the embedded simulated fabric.
pub struct EmbeddedObserver {
    fabric: Arc<SimFabric>,
    changes: Mutex<watch::Receiver<u64>>,
    safety_poll: Duration,
}

impl EmbeddedObserver {
    /// Watches `fabric`; `safety_poll` bounds how long `changed` sleeps without an event.
    pub fn new(fabric: Arc<SimFabric>, safety_poll: Duration) -> EmbeddedObserver {
        let changes = Mutex::new(fabric.subscribe());
        EmbeddedObserver {
            fabric,
            changes,
            safety_poll,
        }
    }
}

#[async_trait]
impl PortObserver for EmbeddedObserver {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn inventory(&self) -> Result<Inventory, ObserveError> {
        Ok(self.fabric.inventory())
    }

    async fn changed(&self, _pending: bool) {
        let mut rx = self.changes.lock().await;
        // Table changes are pushed, so even a pending transition needs no fast polling.
        let _ = tokio::time::timeout(self.safety_poll, rx.changed()).await;
    }
}
