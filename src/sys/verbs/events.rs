//! The async event channel of one device on tokio: the context's `async_fd` made non-blocking,
//! registered with [`AsyncFd`], drained until EAGAIN, every event acknowledged.

use super::convert::AsyncEvent;
use super::device::Device;
use super::VerbsError;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;

/// The context's async fd, borrowed: the context owns and closes it.
struct ContextFd(RawFd);

impl AsRawFd for ContextFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Async events of one open device.
pub struct AsyncEvents {
    // Declared before `device` (fields drop in order) so the fd is deregistered from the
    // reactor before the context that owns the fd can be closed: a safety invariant.
    fd: AsyncFd<ContextFd>,
    device: Arc<Device>,
}

impl AsyncEvents {
    /// Sets the device's async fd non-blocking and registers it with the current tokio
    /// runtime (must be called inside one).
    pub fn new(device: Arc<Device>) -> Result<AsyncEvents, VerbsError> {
        let raw = device.async_fd();
        let fail = |call: &str, source: std::io::Error| VerbsError::Device {
            call: call.to_owned(),
            device: device.name().to_owned(),
            source,
        };
        // SAFETY: `raw` is the context's async fd, open as long as `device` lives, which
        // outlives this borrow (it is used only for the two fcntl calls below).
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        let flags = fcntl(borrowed, FcntlArg::F_GETFL)
            .map_err(|e| fail("fcntl(async_fd, F_GETFL)", e.into()))?;
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        fcntl(borrowed, FcntlArg::F_SETFL(flags))
            .map_err(|e| fail("fcntl(async_fd, F_SETFL O_NONBLOCK)", e.into()))?;
        // SAFETY: the fd stays open, and is the same file description, for the AsyncFd's whole
        // life: the context owning it is closed only when the last `Arc<Device>` goes, and this
        // struct drops `fd` before its own `device` (field order); `ContextFd` always returns
        // the same number.
        let fd = unsafe {
            AsyncFd::register_with_interest(ContextFd(raw), tokio::io::Interest::READABLE)
        }
        .map_err(|e| fail("register async_fd with tokio", e.into_parts().1))?;
        Ok(AsyncEvents { fd, device })
    }

    /// The device these events come from.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Takes every queued event without waiting (each one acknowledged).
    pub fn drain(&self) -> Result<Vec<AsyncEvent>, VerbsError> {
        let mut events = Vec::new();
        while let Some(event) = self.device.take_async_event()? {
            events.push(event);
        }
        Ok(events)
    }

    /// Waits until at least one event arrives, then returns every queued event (each one
    /// acknowledged). Cancel-safe: events are only taken after the wait has completed, and
    /// returned without another await.
    pub async fn next_batch(&self) -> Result<Vec<AsyncEvent>, VerbsError> {
        loop {
            let mut guard = self.fd.readable().await.map_err(|e| VerbsError::Device {
                call: "wait for async_fd".to_owned(),
                device: self.device.name().to_owned(),
                source: e,
            })?;
            let events = self.drain()?;
            // The drain ran until EAGAIN, so the readiness is stale now.
            guard.clear_ready();
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }
}
