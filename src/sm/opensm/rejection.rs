//! What OpenSM rejected, and what the SM host did about it: the payload of
//! [`super::OpenSmError::Rejected`]. OpenSM's own error lines are kept as it wrote them.

use super::backend::OpenSmError;
use super::reload::ReloadError;
use thiserror::Error;

/// A partitions file OpenSM rejected.
#[derive(Debug, Clone, Error)]
pub enum Rejection {
    /// OpenSM rejected the file the agent had just written; `restored`: what was put back.
    #[error("{}; {restored}", Rejection::written_before_restore(.lines))]
    Written {
        /// OpenSM's error lines.
        lines: String,
        /// What the agent put back.
        restored: Restored,
    },
    /// OpenSM rejected these exact bytes before and they add to the accepted file: they are
    /// not written again before `wait_s` seconds have passed (the hold doubles with each
    /// rejection of the same bytes; see [`super::backend`]).
    #[error(
        "OpenSM rejected this exact partitions file before; it is not written again for {wait_s} s ({earlier})"
    )]
    Repeated {
        /// The earlier rejection, as recorded in the commit state.
        earlier: String,
        /// Seconds until the bytes may be written again.
        wait_s: u64,
    },
    /// A reload that wrote nothing found OpenSM rejecting the file on disk.
    #[error("OpenSM rejected the partitions file: {lines}")]
    Reread {
        /// OpenSM's error lines.
        lines: String,
    },
}

impl Rejection {
    /// How a rejection of the agent's write is recorded before anything is restored: the start
    /// of [`Rejection::Written`]'s text.
    pub fn written_before_restore(lines: &str) -> String {
        format!("OpenSM rejected the partitions file the agent wrote ({lines})")
    }
}

/// What putting the last accepted file back achieved.
#[derive(Debug, Clone, Error)]
pub enum Restored {
    /// Restored, and OpenSM re-read it.
    #[error("the last accepted file was restored and OpenSM re-read it")]
    Reread,
    /// Restored, but OpenSM was not seen re-reading it in time.
    #[error("the last accepted file was restored; OpenSM was not seen re-reading it within {waited_ms} ms")]
    Unseen {
        /// How long it was watched (`reload_check_ms`).
        waited_ms: u64,
    },
    /// Restored, but OpenSM could not be made to re-read it, or rejected it too.
    #[error("the last accepted file was restored; {0}")]
    NotReread(#[source] ReloadError),
    /// The accepted file could not be written back.
    #[error("the last accepted file could not be restored: {0}")]
    Failed(#[source] Box<OpenSmError>),
    /// No accepted file is kept (nothing was ever accepted, or it is the rejected one).
    #[error("no accepted file is kept to restore")]
    NothingKept,
}

impl Restored {
    /// Whether OpenSM is known to be serving the restored file.
    pub fn reread(&self) -> bool {
        matches!(self, Restored::Reread)
    }
}
