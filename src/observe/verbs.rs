//! libibverbs observer: inventories through device, port, GID and P_Key queries; changes through
//! the devices' async events (P_Key change, port up/down, LID/SM/GID change, client
//! re-register, device fatal), with a slow safety poll and a fast poll while a transition is
//! pending. Works on real HCAs and soft-RoCE (rxe) devices.
//!
//! The device list is not fixed at open: every inventory first lists the devices libibverbs
//! sees, and the observer reopens them all when that list changed (a device removed, added, or
//! re-registered under the same name: an rxe link deleted and added back, a hot-plugged HCA), when
//! a read on an open context failed (a context of a removed device answers every call with an
//! error, forever), or after a DEVICE_FATAL event. While waiting for changes it lists the devices
//! every second, so a removal that sends no event (rxe) wakes it. The reopen closes the old
//! contexts (a driver that cannot disassociate them, like rxe, waits for that before the device
//! can go). A device read before that is no longer listed fails the inventory
//! ([`ReadError::DevicesGone`]) until it returns: its ports are unknown, and leaving them out
//! could make a key look absent from every fabric port (a false RELEASED).

use super::sa_presence::{self, SaPresence};
use super::{
    poll_interval, read_blocking, NoDevices, ObserveError, PortObserver, Presence, ReadError,
};
use crate::domain::{Guid, Inventory, LinkLayer, PKeyValue, PortInfo, PortState};
use crate::observe::ObserverConfig;
use crate::sys::verbs::{AsyncEvent, AsyncEventKind, AsyncEvents, Device, DeviceList};
use async_trait::async_trait;
use futures::future::{select_all, FutureExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Observer over libibverbs.
pub struct VerbsObserver {
    /// The devices open now; replaced whole when they are reopened.
    open: Mutex<Arc<OpenDevices>>,
    /// Set by a DEVICE_FATAL event or a failed event read: the next inventory reopens.
    stale: AtomicBool,
    fast_poll: Duration,
    slow_poll: Duration,
    /// Where a missing port's presence in the fabric is asked (`sa_umad_device`).
    presence: Option<SaPresence>,
}

/// One generation of open devices and their event channels.
struct OpenDevices {
    // Dropped before `devices` (field order), though each AsyncEvents also holds its device.
    events: Vec<AsyncEvents>,
    devices: Vec<Arc<Device>>,
    /// Every device name observed since the observer was opened: each must be listed again
    /// for an inventory to succeed.
    expected: Vec<String>,
}

impl OpenDevices {
    /// Subscribes to every device's async events (inside a tokio runtime). A device whose
    /// event fd cannot be registered is still observed, by polling only (logged).
    fn new(devices: Vec<Arc<Device>>, expected: Vec<String>) -> OpenDevices {
        let mut events = Vec::with_capacity(devices.len());
        for device in &devices {
            match AsyncEvents::new(Arc::clone(device)) {
                Ok(e) => events.push(e),
                Err(e) => tracing::warn!(
                    device = device.name(),
                    error = %e,
                    "async events unavailable; this device is observed by polling only"
                ),
            }
        }
        OpenDevices {
            events,
            devices,
            expected,
        }
    }

    fn names(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.name().to_owned()).collect()
    }
}

/// What one blocking read produced: an inventory of the devices already open, or of a freshly
/// opened set that replaces them.
enum Read {
    Current(Inventory),
    Reopened {
        devices: Vec<Arc<Device>>,
        expected: Vec<String>,
        inventory: Result<Inventory, ObserveError>,
    },
}

impl VerbsObserver {
    /// Opens every device libibverbs lists and subscribes to their async events. Must be
    /// called inside a tokio runtime (the event fds are registered with its reactor).
    ///
    /// No device is [`ObserveError::NoDevices`] with the reason
    /// ([`NoDevices::KernelWithoutRdma`], [`NoDevices::NoProvider`]); a device that cannot be
    /// opened is [`ReadError::Verbs`] with the errno.
    pub fn open(config: &ObserverConfig) -> Result<VerbsObserver, ObserveError> {
        let list = DeviceList::get().map_err(verbs_failed)?;
        if !list.kernel_has_rdma() {
            return Err(ObserveError::NoDevices(NoDevices::KernelWithoutRdma));
        }
        if list.is_empty() {
            return Err(ObserveError::NoDevices(NoDevices::NoProvider));
        }
        let devices = list.open_all().map_err(verbs_failed)?;
        VerbsObserver::from_devices(devices, config)
    }

    /// Observes already opened devices. Must be called inside a tokio runtime. A device whose
    /// event fd cannot be registered is still observed, by polling only (logged).
    pub fn from_devices(
        devices: Vec<Device>,
        config: &ObserverConfig,
    ) -> Result<VerbsObserver, ObserveError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ReadError::NoRuntime.into());
        }
        let devices: Vec<Arc<Device>> = devices.into_iter().map(Arc::new).collect();
        let expected = devices.iter().map(|d| d.name().to_owned()).collect();
        Ok(VerbsObserver {
            open: Mutex::new(Arc::new(OpenDevices::new(devices, expected))),
            stale: AtomicBool::new(false),
            fast_poll: config.fast_poll(),
            slow_poll: config.slow_poll(),
            presence: SaPresence::configured(config),
        })
    }

    /// The observed devices' names, in libibverbs order.
    pub fn device_names(&self) -> Vec<String> {
        self.current().names()
    }

    /// Reads every port now, blocking, through the devices open now (no reopening; the async
    /// [`PortObserver::inventory`] reopens when needed).
    pub fn read_inventory(&self) -> Result<Inventory, ObserveError> {
        read_inventory(&self.current().devices)
    }

    fn current(&self) -> Arc<OpenDevices> {
        Arc::clone(&self.open.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Reads the open devices if libibverbs still lists exactly them and the read succeeds;
/// otherwise opens the listed devices afresh and reads those. Blocking.
fn read_or_reopen(open: &OpenDevices, stale: bool) -> Result<Read, ObserveError> {
    let list = DeviceList::get().map_err(verbs_failed)?;
    let listed = list.names();
    let before = open.names();
    let gone = || -> Vec<String> {
        open.expected
            .iter()
            .filter(|name| !listed.contains(name))
            .cloned()
            .collect()
    };
    if !stale && listed == before {
        let gone = gone();
        if !gone.is_empty() {
            return Err(ReadError::DevicesGone { devices: gone }.into());
        }
        match read_inventory(&open.devices) {
            Ok(inventory) => return Ok(Read::Current(inventory)),
            Err(e) => tracing::warn!(
                error = %e,
                "verbs read failed; reopening the device list (a device may have been removed)"
            ),
        }
    }
    let devices: Vec<Arc<Device>> = list
        .open_all()
        .map_err(verbs_failed)?
        .into_iter()
        .map(Arc::new)
        .collect();
    let gone = gone();
    let mut expected = open.expected.clone();
    expected.extend(
        listed
            .iter()
            .filter(|n| !open.expected.contains(n))
            .cloned(),
    );
    tracing::info!(?before, now = ?listed, ?gone, "verbs: devices reopened");
    let inventory = if gone.is_empty() {
        read_inventory(&devices)
    } else {
        Err(ReadError::DevicesGone { devices: gone }.into())
    };
    Ok(Read::Reopened {
        devices,
        expected,
        inventory,
    })
}

/// One unreadable port fails the whole inventory: leaving it out could make a key look absent
/// from every fabric port (a false RELEASED).
fn read_inventory(devices: &[Arc<Device>]) -> Result<Inventory, ObserveError> {
    let io = verbs_failed;
    let mut ports = Vec::new();
    for device in devices {
        let attributes = device.query_device().map_err(io)?;
        for port_number in 1..=attributes.phys_port_cnt {
            let port = device.query_port(port_number).map_err(io)?;
            // GID 0's interface id is the port GUID on InfiniBand (the MAC-derived EUI-64 on
            // RoCE), the same value sysfs and ibstat show.
            let gid = device.query_gid(port_number, 0).map_err(io)?;
            let pkeys = device
                .pkey_table(port_number, port.pkey_tbl_len)
                .map_err(io)?;
            ports.push(PortInfo {
                device: device.name().to_owned(),
                port_number,
                port_guid: Guid(gid.interface_id()),
                node_guid: Guid(device.node_guid()),
                lid: port.lid,
                sm_lid: port.sm_lid,
                state: port_state(port.state),
                link_layer: link_layer(port.link_layer),
                pkeys: pkeys.into_iter().map(PKeyValue).collect(),
                fabric_port: false,
            });
        }
    }
    Ok(Inventory { ports })
}

/// Maps `enum ibv_port_state` (0 NOP, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER; the
/// IBA numbering). NOP and unknown codes are [`PortState::Unknown`].
fn port_state(code: u32) -> PortState {
    u8::try_from(code).map_or(PortState::Unknown, PortState::from_iba)
}

/// Maps `IBV_LINK_LAYER_*`. UNSPECIFIED (0) comes from providers older than the field, which
/// were all InfiniBand; `ibv_devinfo` prints it as InfiniBand too.
fn link_layer(code: u8) -> LinkLayer {
    match code {
        0 | 1 => LinkLayer::Infiniband,
        2 => LinkLayer::Ethernet,
        _ => LinkLayer::Unknown,
    }
}

/// Logs the events; true when one says the device must be reopened (DEVICE_FATAL).
fn log_events(device: &str, events: &[AsyncEvent]) -> bool {
    let mut fatal = false;
    for event in events {
        match event.kind {
            AsyncEventKind::DeviceFatal => {
                tracing::warn!(device, "DEVICE_FATAL: the devices are reopened");
                fatal = true;
            }
            kind if kind.affects_ports() => {
                tracing::debug!(device, ?kind, port = event.port, "port event")
            }
            kind => tracing::trace!(device, ?kind, "async event ignored"),
        }
    }
    fatal
}

#[async_trait]
impl PortObserver for VerbsObserver {
    fn kind(&self) -> &'static str {
        "verbs"
    }

    async fn inventory(&self) -> Result<Inventory, ObserveError> {
        let open = self.current();
        let stale = self.stale.swap(false, Ordering::SeqCst);
        let read = read_blocking("verbs", move || read_or_reopen(&open, stale)).await;
        match read {
            Ok(Read::Current(inventory)) => Ok(inventory),
            Ok(Read::Reopened {
                devices,
                expected,
                inventory,
            }) => {
                // Registered here, on the runtime: the event fds join its reactor. The old
                // contexts close when the last reference to their generation goes.
                let reopened = Arc::new(OpenDevices::new(devices, expected));
                *self.open.lock().unwrap_or_else(|p| p.into_inner()) = reopened;
                inventory
            }
            Err(e) => {
                // Try again from a fresh list next time, unless the open set is already the
                // listed one and only waits for a device to return.
                if !matches!(e, ObserveError::Read(ReadError::DevicesGone { .. })) {
                    self.stale.store(true, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    async fn fabric_presence(&self, guids: &[Guid]) -> Vec<Presence> {
        sa_presence::ask_optional(self.presence.as_ref(), "verbs", guids).await
    }

    async fn changed(&self, pending: bool) {
        let interval = poll_interval(pending, self.fast_poll, self.slow_poll);
        let open = self.current();
        let deadline = tokio::time::Instant::now() + interval;
        // Waiting is cancel-safe: an event is only taken (and acknowledged) after its fd
        // became readable, and returned without another await.
        let events = async {
            if open.events.is_empty() {
                return std::future::pending().await;
            }
            let waits = open
                .events
                .iter()
                .map(|e| e.next_batch().map(move |r| (e.device().name(), r)).boxed());
            select_all(waits).await.0
        };
        let reopen = tokio::select! {
            _ = tokio::time::sleep_until(deadline) => false,
            () = list_changed(&open) => {
                tracing::info!("verbs: the device list changed; reopening");
                true
            }
            (device, read) = events => match read {
                Ok(events) => log_events(device, &events),
                Err(e) => {
                    // A removed device's context fails here; the next inventory reopens.
                    tracing::warn!(device, error = %e, "reading async events failed; reopening");
                    // Not at once: a fd that keeps failing must not turn this into a busy loop.
                    tokio::time::sleep_until(
                        deadline.min(tokio::time::Instant::now() + self.fast_poll),
                    )
                    .await;
                    true
                }
            },
        };
        if reopen {
            self.stale.store(true, Ordering::SeqCst);
        }
    }
}

/// How often a waiting observer lists the devices. A device whose driver cannot disassociate
/// its users (rxe) tells them nothing when it is removed: `rdma link delete` just waits until
/// every open context is closed. Listing notices it, and the reopen closes the old contexts.
const DEVICE_LIST_POLL: Duration = Duration::from_secs(1);

/// Resolves when libibverbs lists other devices than `open` (or cannot list them).
async fn list_changed(open: &OpenDevices) {
    let names = open.names();
    loop {
        tokio::time::sleep(DEVICE_LIST_POLL).await;
        let listed = read_blocking("verbs", || {
            DeviceList::get().map(|l| l.names()).map_err(verbs_failed)
        })
        .await;
        if !matches!(listed, Ok(ref l) if *l == names) {
            return;
        }
    }
}

fn verbs_failed(e: crate::sys::verbs::VerbsError) -> ObserveError {
    ReadError::Verbs(Arc::new(e)).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::ibv_port_state;

    #[test]
    fn port_states_follow_the_bindings() {
        assert_eq!(port_state(ibv_port_state::IBV_PORT_NOP), PortState::Unknown);
        assert_eq!(port_state(ibv_port_state::IBV_PORT_DOWN), PortState::Down);
        assert_eq!(port_state(ibv_port_state::IBV_PORT_INIT), PortState::Init);
        assert_eq!(port_state(ibv_port_state::IBV_PORT_ARMED), PortState::Armed);
        assert_eq!(
            port_state(ibv_port_state::IBV_PORT_ACTIVE),
            PortState::Active
        );
        assert_eq!(
            port_state(ibv_port_state::IBV_PORT_ACTIVE_DEFER),
            PortState::ActiveDefer
        );
        assert_eq!(port_state(6), PortState::Unknown);
        assert_eq!(port_state(0x1_0004), PortState::Unknown);
    }

    #[test]
    fn link_layers() {
        assert_eq!(link_layer(0), LinkLayer::Infiniband);
        assert_eq!(link_layer(1), LinkLayer::Infiniband);
        assert_eq!(link_layer(2), LinkLayer::Ethernet);
        assert_eq!(link_layer(3), LinkLayer::Unknown);
    }
}
