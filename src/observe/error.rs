//! Why ports could not be read: typed, with causes.

use super::sysfs::AttrError;
use super::ObserverKind;
use crate::sys::verbs::VerbsError;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;

/// Why the ports could not be read.
#[derive(Debug, Clone, Error)]
pub enum ObserveError {
    /// No RDMA device was found.
    #[error("no RDMA devices: {0}")]
    NoDevices(#[source] NoDevices),
    /// Reading a device or file failed.
    #[error("reading ports failed: {0}")]
    Read(#[source] ReadError),
}

/// Why no RDMA device was found.
#[derive(Debug, Clone, Error)]
pub enum NoDevices {
    /// libibverbs says the kernel has no RDMA.
    #[error("libibverbs found no devices (ENOSYS: the kernel has no RDMA)")]
    KernelWithoutRdma,
    /// The kernel has RDMA but libibverbs lists no device.
    #[error("libibverbs found no devices (RDMA is in the kernel, but no device is registered or no provider matches: install ibverbs-providers)")]
    NoProvider,
    /// The sysfs class directory does not exist.
    #[error("{} does not exist (no RDMA device is registered, or the kernel has no RDMA)", .0.display())]
    NoSysfsRoot(PathBuf),
    /// The umad device could not be opened.
    #[error(transparent)]
    Umad(Arc<super::smp::SmpError>),
}

/// Why reading the ports failed.
#[derive(Debug, Clone, Error)]
pub enum ReadError {
    /// A libibverbs call failed.
    #[error(transparent)]
    Verbs(Arc<VerbsError>),
    /// Devices the verbs observer read before are no longer listed by libibverbs. Their ports
    /// are unknown, not absent: leaving them out could make a key look released. Clears when
    /// they come back; a device removed for good needs an agent restart.
    #[error("RDMA device(s) {} gone (removed or being re-registered); their ports are unknown until they return", devices.join(", "))]
    DevicesGone {
        /// The missing device names.
        devices: Vec<String>,
    },
    /// The verbs observer was created outside a tokio runtime.
    #[error("the verbs observer must be created inside a tokio runtime")]
    NoRuntime,
    /// The blocking task that reads the ports failed.
    #[error("{observer} reader task failed: {source}")]
    Task {
        /// Which observer.
        observer: &'static str,
        /// Why.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
    /// A file or directory could not be read.
    #[error("{}: {source}", path.display())]
    File {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// An attribute file's text does not parse.
    #[error("{}: {source}", path.display())]
    Attr {
        /// The file.
        path: PathBuf,
        /// What is wrong with its text.
        #[source]
        source: AttrError,
    },
    /// A port directory's number does not fit a port number.
    #[error("{}: port number {number} is above 255", dir.display())]
    PortNumber {
        /// The `ports` directory.
        dir: PathBuf,
        /// The number.
        number: usize,
    },
    /// The P_Key table's entries are not 0..n.
    #[error("{}: P_Key table has a gap: entry {position} is missing (found {index})", dir.display())]
    PKeyGap {
        /// The `pkeys` directory.
        dir: PathBuf,
        /// The missing entry.
        position: usize,
        /// The entry found in its place.
        index: usize,
    },
    /// A directory of numbered entries holds something else.
    #[error("{}: unexpected entry {name:?} (only numbered entries belong here)", dir.display())]
    UnexpectedEntry {
        /// The directory.
        dir: PathBuf,
        /// The entry's name.
        name: String,
    },
    /// The SMP path failed.
    #[error(transparent)]
    Smp(Arc<super::smp::SmpError>),
    /// This kind of observer is not built by `observe::auto::select`.
    #[error("observer kind {0:?} is built by the agent, not by observe::auto::select")]
    NotSelectable(ObserverKind),
}

impl From<ReadError> for ObserveError {
    fn from(e: ReadError) -> Self {
        ObserveError::Read(e)
    }
}

/// Runs a blocking inventory read on tokio's blocking pool.
pub(crate) async fn read_blocking<T: Send + 'static>(
    observer: &'static str,
    read: impl FnOnce() -> Result<T, ObserveError> + Send + 'static,
) -> Result<T, ObserveError> {
    tokio::task::spawn_blocking(read).await.map_err(|e| {
        ObserveError::Read(ReadError::Task {
            observer,
            source: Arc::new(e),
        })
    })?
}
