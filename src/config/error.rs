//! Why a configuration was refused, and the two ways a section says so.

use std::path::PathBuf;
use thiserror::Error;

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key or a wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// What the TOML parser said (with line and column).
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("invalid {key}: {reason}")]
    Invalid {
        /// The dotted key.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// A section its own rules refuse.
    #[error("invalid {key}: {source}")]
    Section {
        /// The section's dotted key.
        key: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A section whose own rules (its typed error) refused it.
pub(super) fn rejected_by<E: std::error::Error + Send + Sync + 'static>(
    key: &'static str,
) -> impl Fn(E) -> ConfigError {
    move |e| ConfigError::Section {
        key,
        source: Box::new(e),
    }
}

/// A value that parses but makes no sense, under its dotted key.
pub(super) fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl From<crate::api::settings::ListenError> for ConfigError {
    fn from(e: crate::api::settings::ListenError) -> ConfigError {
        use crate::api::settings::ListenError;
        match e {
            ListenError::Invalid { key, reason } => ConfigError::Invalid { key, reason },
            ListenError::Rejected { key, source } => ConfigError::Section { key, source },
        }
    }
}

impl From<crate::api::settings::LimitsError> for ConfigError {
    fn from(e: crate::api::settings::LimitsError) -> ConfigError {
        ConfigError::Invalid {
            key: e.key,
            reason: e.reason,
        }
    }
}
