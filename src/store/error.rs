use thiserror::Error;

/// Why the store could not do what was asked.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The database reported an error (I/O, corruption detected by redb, lock held by another
    /// process).
    #[error("store: {0}")]
    Db(String),
    /// A stored value does not decode.
    #[error("store holds an undecodable value: {0}")]
    Corrupt(String),
    /// Another process (another fabric-agent) has the store open.
    #[error("another fabric-agent holds the state directory {0} (its store is locked); stop it, or give this agent another state_dir")]
    Locked(String),
    /// Creating the state directory failed.
    #[error("store directory: {0}")]
    Io(String),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(e.to_string())
            }
        }
    )*};
}

from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
