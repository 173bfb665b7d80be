//! Builds the port observer: the embedded one, or a real one (auto/verbs/sysfs/smp); with the
//! embedded backend a real observer also shows the simulated ports (see `observe::combined`).

use super::StartError;
use crate::config::{Config, ObserverKind};
use crate::domain::Inventory;
use crate::embedded_fabric::SimFabric;
use crate::observe::combined::CombinedObserver;
use crate::observe::embedded::EmbeddedObserver;
use crate::observe::smp::SmpObserver;
use crate::observe::PortObserver;
use std::sync::Arc;

/// The observer and why it was chosen (shown by `fabric-agent node`).
pub(super) fn build(
    config: &Config,
    sim: Option<Arc<SimFabric>>,
) -> Result<(Arc<dyn PortObserver>, String), StartError> {
    let embedded = |sim: Arc<SimFabric>| EmbeddedObserver::new(sim, config.observer.slow_poll());
    let kind = config.observer_kind();
    let (real, reason): (Box<dyn PortObserver>, String) = match kind {
        ObserverKind::Embedded => {
            let sim = sim.expect("sim built for the embedded observer");
            return Ok((
                Arc::new(embedded(sim)),
                "configured: the embedded simulated fabric".to_owned(),
            ));
        }
        ObserverKind::Auto | ObserverKind::Verbs | ObserverKind::Sysfs => {
            crate::observe::auto::select(&config.observer, kind).map_err(StartError::Observer)?
        }
        ObserverKind::Smp => {
            let smp = SmpObserver::open(&config.observer).map_err(StartError::Observer)?;
            let reason = format!(
                "configured: SMPs to the local port through {}",
                config.observer.umad_device.display()
            );
            (Box::new(smp), reason)
        }
    };
    Ok(match sim {
        Some(sim) => (
            Arc::new(CombinedObserver::new(real, Box::new(embedded(sim)))),
            format!("{reason}; plus the embedded fabric's simulated ports"),
        ),
        None => (Arc::from(real), reason),
    })
}

/// Reads the ports once through the configured observer, without a daemon (`fabric-agent
/// ports`, `doctor`). Returns the observer's kind and the inventory with fabric ports marked.
pub async fn read_ports_once(config: &Config) -> Result<(&'static str, Inventory), StartError> {
    if config.observer_kind() == ObserverKind::Embedded {
        return Err(StartError::EmbeddedOutsideDaemon);
    }
    let (observer, _) = build(config, None)?;
    let mut inventory = observer.inventory().await.map_err(StartError::ReadPorts)?;
    config.ports.apply(&mut inventory);
    Ok((observer.kind(), inventory))
}
