//! Safe wrappers over libibverbs (through `rdma-sys`): the device list, device contexts, port,
//! GID and P_Key queries, and the async event channel.
//!
//! - [`convert`] — pure conversions (byte order, GIDs, event codes), unit-tested without RDMA
//! - [`device`]  — the device list and open devices (RAII), attribute, port, GID and P_Key queries
//! - [`events`]  — the async event channel on tokio, every event acknowledged
//!
//! Only this module calls libibverbs; callers never see a raw pointer.

pub mod convert;
pub mod device;
pub mod events;

pub use convert::{AsyncEvent, AsyncEventKind, Gid};
pub use device::{Device, DeviceAttributes, DeviceList, PortAttributes};
pub use events::AsyncEvents;

use thiserror::Error;

/// A failed libibverbs call, with the errno it left.
#[derive(Debug, Error)]
pub enum VerbsError {
    /// A call that concerns no particular device (listing devices).
    #[error("{call}: {source}")]
    Library {
        /// The libibverbs function.
        call: &'static str,
        /// The OS error (errno).
        source: std::io::Error,
    },
    /// A call on one device.
    #[error("{call} on {device}: {source}")]
    Device {
        /// The libibverbs function (and its arguments, where they matter).
        call: String,
        /// The device name, e.g. `mlx5_0`.
        device: String,
        /// The OS error (errno).
        source: std::io::Error,
    },
}

impl VerbsError {
    /// The errno of the failed call, when the OS reported one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Library { source, .. } | VerbsError::Device { source, .. } => {
                source.raw_os_error()
            }
        }
    }
}

/// Turns a libibverbs return code into a result. libibverbs uses two conventions: most calls
/// (`ibv_query_port`, `ibv_query_device`) return the errno value itself, others
/// (`ibv_query_gid`, `ibv_query_pkey`, `ibv_get_async_event`) return -1 and set `errno`. Must be
/// called right after the call, before anything else can overwrite `errno`.
fn check_rc(rc: libc::c_int) -> Result<(), std::io::Error> {
    match rc {
        0 => Ok(()),
        r if r > 0 => Err(std::io::Error::from_raw_os_error(r)),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_codes_keep_errno() {
        assert!(check_rc(0).is_ok());
        assert_eq!(
            check_rc(libc::EINVAL).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        nix::errno::Errno::ENODEV.set();
        assert_eq!(check_rc(-1).unwrap_err().raw_os_error(), Some(libc::ENODEV));
    }
}
