//! A run's files: the temp directory they live in, and how a store put back from a copy opened.

use fabric_agent::store::Store;
use std::path::Path;

/// A temp directory for a run's files: in memory when the host has `/dev/shm` (the stores
/// fsync every commit; the simulation is about orderings, not disks).
pub fn temp_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("temp dir")
}

/// Whether a store put back from a copy opened as restored, for the trace.
pub fn seen(store: &Store) -> String {
    store
        .rolled_back()
        .map_or("not seen as a rollback".to_owned(), |why| {
            format!("seen: {why}")
        })
}
