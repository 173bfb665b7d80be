//! Why the UFM backend did not apply a set: typed, with causes.

use super::config::UfmConfigError;
use super::http::NoAnswer;
use super::ledger::{LedgerDecodeError, LedgerStoreError};
use super::wire::WireError;
use crate::domain::PKey;
use reqwest::StatusCode;
use std::path::PathBuf;
use std::sync::Arc;

/// A UFM backend failure. [`crate::sm::SmError`] says whether it is worth retrying soon.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UfmError {
    /// `[subnet_manager.ufm]` is invalid.
    #[error("UFM configuration: {0}")]
    Config(#[source] UfmConfigError),
    /// A configured file could not be read.
    #[error("cannot read UFM {what} {}: {source}", path.display())]
    ReadFile {
        /// Which setting names the file (`ca_file`, `credentials_file`, ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A configured file holds nothing usable.
    #[error("UFM {what} {}: {problem}", path.display())]
    BadFile {
        /// Which setting names the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The CA bundle does not parse.
    #[error("UFM ca_file {}: {source}", path.display())]
    CaBundle {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<reqwest::Error>,
    },
    /// The client certificate and key do not make a TLS identity.
    #[error("UFM client_cert/client_key are not a usable PEM certificate and key: {0}")]
    Identity(#[source] Arc<reqwest::Error>),
    /// The HTTP client could not be built.
    #[error("UFM HTTP client: {0}")]
    Client(#[source] Arc<reqwest::Error>),
    /// A released key is still watched for a late add (one UFM may execute after the client
    /// gave up): not acknowledged until a read after the watch ends shows it absent.
    #[error("{key} is released at UFM, but an add this node sent may still land until {until_unix_ms} (unix ms); the key is watched and re-read until then")]
    LateWriteWindow {
        /// The watched key.
        key: PKey,
        /// When its watch ends.
        until_unix_ms: i64,
    },
    /// The node's store was restored from a copy: its ledger may lack adds sent after the copy
    /// was taken, which may be in any key or still land there. Not acknowledged until a read of
    /// UFM's whole partition list started after the restore watch ends shows every key right.
    #[error("this node's store was restored from a copy, so its UFM ledger may lack adds that may still land in any key until {until_unix_ms} (unix ms); UFM's whole partition list is read and cleaned of this node's GUIDs until then{}", if *.list_unread { " (the list could not be read in this apply)" } else { "" })]
    RestoreWatch {
        /// When the restore watch ends.
        until_unix_ms: i64,
        /// Whether this apply could not read the whole list (the watch cannot end without it).
        list_unread: bool,
    },
    /// Keys are desired but the node has no InfiniBand port.
    #[error("no InfiniBand port GUIDs on this node to program keys for")]
    NoPorts,
    /// The blocking task that reads or records the ledger failed.
    #[error("{} the UFM ledger: {source}", if *.saving { "recording" } else { "reading" })]
    LedgerTask {
        /// Whether it was recording (else reading).
        saving: bool,
        /// Why.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
    /// The ledger store could not be read.
    #[error("cannot read the UFM ledger from the store: {0}")]
    LedgerLoad(#[source] LedgerStoreError),
    /// The ledger store could not be written: nothing more is sent until it can.
    #[error(
        "cannot record the UFM ledger in the store ({0}); nothing more is sent to UFM until it can"
    )]
    LedgerSave(#[source] LedgerStoreError),
    /// The stored ledger does not decode.
    #[error("the UFM ledger in the store cannot be read ({0}); without it the GUIDs this node put in partitions are unknown")]
    LedgerDecode(#[source] Arc<LedgerDecodeError>),
    /// UFM gave no usable answer (timeouts, connection errors, 5xx, an answer over the cap).
    #[error(transparent)]
    NoAnswer(NoAnswer),
    /// UFM rejected the credentials; they are not tried again until the file changes.
    #[error("UFM rejected the credentials ({status}); not calling UFM again until {} changes", source_file.display())]
    CredentialsRejected {
        /// 401 or 403.
        status: StatusCode,
        /// The credentials (or certificate) file.
        source_file: PathBuf,
    },
    /// UFM refused a request (a 4xx other than 401/403), with its words (redacted, cut short).
    #[error("UFM refused {what} ({status}): {text}")]
    Refused {
        /// The request, e.g. "reading 0x0a12".
        what: String,
        /// UFM's status.
        status: StatusCode,
        /// UFM's words.
        text: String,
    },
    /// UFM's answer to a read is not understood.
    #[error("UFM's answer to GET {path} is not understood: {source}")]
    NotUnderstood {
        /// The path read.
        path: String,
        /// What is wrong with the answer.
        #[source]
        source: Arc<WireError>,
    },
    /// UFM accepted a change but reading it back shows it not (fully) made.
    #[error("UFM accepted the change to {key} but reading it back shows {to_add} GUID(s) still to add and {to_remove} to remove{}", if *.other_keys == 0 { String::new() } else { format!(" (and {} more key(s) not as asked)", .other_keys) })]
    NotApplied {
        /// The first key not as asked.
        key: PKey,
        /// GUIDs still to add to it.
        to_add: usize,
        /// GUIDs still to remove from it.
        to_remove: usize,
        /// Further keys not as asked.
        other_keys: usize,
    },
}
