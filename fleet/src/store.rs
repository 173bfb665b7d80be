//! The fleet client's embedded store (redb, one file): every node's durable view record (cursor
//! and what it summarises, written together so they never disagree) and the ledger of attaches
//! the control plane made (written before the attach is sent).

use crate::view::NodeDurable;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const ATTACHES: TableDefinition<&str, &[u8]> = TableDefinition::new("attaches");

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("fleet store: {0}")]
    Db(#[from] redb::Error),
    /// A record did not decode (written by another version?).
    #[error("fleet store record {key}: {source}")]
    Decode {
        /// The record's key.
        key: String,
        /// Why.
        source: serde_json::Error,
    },
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// One attach the control plane made through the fleet client (recorded before sending).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachRecord {
    /// The node.
    pub node_id: String,
    /// The instance.
    pub instance_id: String,
    /// The partition id (`ibpart_...`).
    pub partition_id: String,
    /// The partition's fabric.
    pub fabric: String,
    /// P_Key base.
    pub pkey: u32,
    /// The grant sent with the attach.
    pub grant_id: String,
    /// When it was recorded (ms since the Unix epoch).
    pub recorded_at_ms: u64,
    /// When the view already showed this instance RELEASED on this node at attach time (a
    /// re-attach after the node's state directory was wiped): that record's (epoch, seq). The
    /// guard does not count that old RELEASED for this attach; only a newer one.
    #[serde(default)]
    pub released_before: Option<(String, u64)>,
}

fn attach_key(node_id: &str, instance_id: &str) -> String {
    format!("{node_id}\n{instance_id}")
}

/// The store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
}

impl Store {
    /// Opens or creates the store file.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = Database::create(path)?;
        let tx = db.begin_write()?;
        tx.open_table(NODES)?;
        tx.open_table(ATTACHES)?;
        tx.commit()?;
        Ok(Store { db: Arc::new(db) })
    }

    /// Every node's durable record.
    pub fn nodes(&self) -> Result<Vec<(String, NodeDurable)>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(NODES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            let key = k.value().to_owned();
            let record =
                serde_json::from_slice(v.value()).map_err(|source| StoreError::Decode {
                    key: key.clone(),
                    source,
                })?;
            out.push((key, record));
        }
        Ok(out)
    }

    /// Writes node records in one durable transaction.
    pub fn put_nodes<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a str, &'a NodeDurable)>,
    ) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut table = tx.open_table(NODES)?;
            for (node, record) in records {
                let bytes = serde_json::to_vec(record).expect("a node record serialises");
                table.insert(node, bytes.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Records an attach durably.
    pub fn record_attach(&self, record: &AttachRecord) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut table = tx.open_table(ATTACHES)?;
            let bytes = serde_json::to_vec(record).expect("an attach record serialises");
            table.insert(
                attach_key(&record.node_id, &record.instance_id).as_str(),
                bytes.as_slice(),
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every attach recorded for one partition.
    pub fn attaches(&self, partition_id: &str) -> Result<Vec<AttachRecord>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(ATTACHES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            let record: AttachRecord =
                serde_json::from_slice(v.value()).map_err(|source| StoreError::Decode {
                    key: k.value().to_owned(),
                    source,
                })?;
            if record.partition_id == partition_id {
                out.push(record);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_records_and_attaches_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.redb");
        let record = NodeDurable {
            epoch: "e".into(),
            seq: 9,
            ..Default::default()
        };
        let attach = AttachRecord {
            node_id: "n1".into(),
            instance_id: "i1".into(),
            partition_id: "ibpart_a".into(),
            fabric: "f".into(),
            pkey: 0x10,
            grant_id: "g".into(),
            recorded_at_ms: 1,
            released_before: Some(("e".into(), 3)),
        };
        {
            let s = Store::open(&path).unwrap();
            s.put_nodes([("n1", &record)]).unwrap();
            s.record_attach(&attach).unwrap();
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.nodes().unwrap(), vec![("n1".to_owned(), record)]);
        assert_eq!(s.attaches("ibpart_a").unwrap(), vec![attach]);
        assert!(s.attaches("ibpart_b").unwrap().is_empty());
    }
}
