use std::path::PathBuf;
use thiserror::Error;

/// Why the store could not do what was asked. Each variant keeps its cause as `source`.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The database reported an error (I/O, corruption detected by redb, lock held by another
    /// process).
    #[error("store: {0}")]
    Db(#[from] redb::Error),
    /// A stored value does not decode (or a value does not encode).
    #[error("store holds an undecodable value: {0}")]
    Codec(#[from] serde_json::Error),
    /// A stored record contradicts another one or has the wrong shape.
    #[error("store holds an undecodable value: {0}")]
    Corrupt(Corruption),
    /// Another process (another fabric-agent) has the store open.
    #[error("another fabric-agent holds the state directory {} (its store is locked); stop it, or give this agent another state_dir", .0.display())]
    Locked(PathBuf),
    /// The store's mirror (its side file, see `mirror.rs`) is unreadable.
    #[error("store mirror {}: {why}", .path.display())]
    Mirror {
        /// The side file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Creating the state directory failed.
    #[error("store directory: {}: {source}", .path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What is wrong with a stored record.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Corruption {
    /// The event sequence counter reached its end.
    #[error("event sequence exhausted")]
    SequenceExhausted,
    /// A stored attachment key is not a valid instance id.
    #[error("{id:?}: {source}")]
    InstanceId {
        /// The stored key.
        id: String,
        /// Why it does not parse.
        source: crate::domain::DomainError,
    },
    /// The live index names an attachment that is not stored.
    #[error("live index names {0:?}, which is not stored")]
    LiveIndexDangling(String),
    /// A fixed-width value has the wrong length.
    #[error("{0} is not {1} bytes")]
    Width(&'static str, usize),
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
