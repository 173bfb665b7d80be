//! The parts of an in-process SM host: the OpenSM backend on a partitions file of the test's,
//! with an in-memory node store and OpenSM's reload stood in for.

use async_trait::async_trait;
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader};
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend, OpenSmConfig, OwnershipConfig};
use std::path::Path;
use std::sync::Arc;

/// A reload that always succeeds and reports the file read (no OpenSM runs).
pub struct AcceptingReloader;

#[async_trait]
impl Reloader for AcceptingReloader {
    fn checkpoint(&self) -> u64 {
        0
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        Ok(ReloadReport { file_read: true })
    }
}

/// The OpenSM backend of SM host `smhost` on `partitions_file`, every reload accepted, without
/// port-ownership checks (made-up GUIDs: who may claim which port is the ownership tests'
/// subject, tests/opensm_ownership*.rs).
pub fn opensm_backend(partitions_file: &Path) -> OpenSmBackend {
    OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: partitions_file.to_owned(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::new(InMemoryNodeStore::default()),
        Arc::new(AcceptingReloader),
    )
    .unwrap()
}
