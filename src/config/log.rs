//! `[log]`: the daemon's log filter.

use super::error::{invalid, ConfigError};
use serde::Deserialize;

/// `[log]`: the daemon's log filter, re-read on SIGHUP.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter such as `info` or `info,fabric_agent::agent=debug` (default `info`;
    /// the `FABRIC_AGENT_LOG` environment variable overrides it).
    #[serde(default)]
    pub filter: Option<String>,
}

impl LogConfig {
    /// The filter, when given, parses as a tracing filter.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(filter) = &self.filter {
            tracing_subscriber::EnvFilter::builder()
                .parse(filter)
                .map_err(|e| {
                    invalid("log.filter", format!("{filter:?} is not a log filter: {e}"))
                })?;
        }
        Ok(())
    }
}
