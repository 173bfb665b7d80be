//! The settings the listeners own: `[listen]` (the unix socket, the TCP listener and its mTLS)
//! and `[limits]` (what one client may hold). Each section validates itself with its own error
//! into the typed values the listeners use; `config` composes them into the whole
//! configuration.

pub mod limits;
pub mod listen;

pub use limits::LimitsConfig;
pub use listen::{
    BadSocketMode, ListenConfig, ListenSection, SocketMode, TlsConfig, TlsSection, DEFAULT_SOCKET,
};

use thiserror::Error;

/// Why a `[listen]` or `[limits]` setting was refused, under its dotted key.
#[derive(Debug, Error)]
pub enum SettingsError {
    /// A value that parses but makes no sense.
    #[error("invalid {key}: {reason}")]
    Invalid {
        /// The dotted key.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// A value its own type refused (an allowlist entry, the node mapping), with that type's
    /// error.
    #[error("invalid {key}: {source}")]
    Rejected {
        /// The dotted key.
        key: &'static str,
        /// The type's own error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A value its own type refused, under its dotted key.
fn rejected_by<E: std::error::Error + Send + Sync + 'static>(
    key: &'static str,
) -> impl Fn(E) -> SettingsError {
    move |e| SettingsError::Rejected {
        key,
        source: Box::new(e),
    }
}

/// A value that parses but makes no sense, under its dotted key.
fn invalid(key: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key,
        reason: reason.into(),
    }
}
