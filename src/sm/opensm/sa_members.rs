//! Which ports the subnet manager actually holds in a partition, asked of the SA: for each
//! candidate port GUID, its LID (NodeRecord) and then its P_KeyTableRecords block by block
//! (one record per GetTable answer) until the key shows up or the table ends. What
//! `ListPartitionMembers` answers on the SM host (`source = "sa"`).
//!
//! The candidates are the ports the SM host knows of (every stored node's ports and every port
//! the accepted partitions file names for the key): a port of the fabric that no node claimed
//! and the file does not name is not asked about.

use super::ownership::{DirectoryError, OwnershipConfig};
use super::sa_client::{SaError, SaSession, SaTiming};
use crate::domain::{Guid, PKey};
use crate::mad::pkey_table::blocks_for;
use std::path::PathBuf;
use std::sync::Arc;

/// Where the SA is asked, and how long a table may be.
#[derive(Debug, Clone)]
pub struct SaMembers {
    device: PathBuf,
    timing: SaTiming,
    table_size: u16,
    sa_key: u64,
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
}

impl SaMembers {
    /// Asks through `ownership.umad_device` with its timing; tables of `table_size` entries.
    pub fn new(ownership: &OwnershipConfig, table_size: usize) -> SaMembers {
        SaMembers {
            device: ownership.umad_device.clone(),
            timing: ownership.timing(),
            table_size: u16::try_from(table_size).unwrap_or(u16::MAX),
            sa_key: ownership.sa_key,
            one_at_a_time: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The candidates the SA shows holding `pkey`, with full membership or not. An error
    /// means the SA could not be asked (or answered something that does not decode).
    pub async fn members(
        &self,
        pkey: PKey,
        candidates: Vec<Guid>,
    ) -> Result<Vec<(Guid, bool)>, DirectoryError> {
        let _turn = self.one_at_a_time.lock().await;
        let (device, timing, blocks, sa_key) = (
            self.device.clone(),
            self.timing,
            blocks_for(self.table_size),
            self.sa_key,
        );
        tokio::task::spawn_blocking(move || -> Result<Vec<(Guid, bool)>, SaError> {
            let mut session = SaSession::open(&device, timing)?;
            let local = session.local_port()?;
            let mut out = Vec::new();
            for g in candidates {
                let Some(record) = session.node_record(local.sm_lid, g.0)? else {
                    continue;
                };
                for block in 0..blocks {
                    let Some(r) =
                        session.pkey_table_record(local.sm_lid, sa_key, record.lid, block)?
                    else {
                        break;
                    };
                    if let Some(full) = r.membership_of(pkey.base()) {
                        out.push((g, full));
                        break;
                    }
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| DirectoryError::Thread(Arc::new(e)))?
        .map_err(|e| DirectoryError::Sa {
            device: self.device.clone(),
            source: Arc::new(e),
        })
    }
}
