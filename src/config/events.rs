//! `[events]`: the event log's retention.

use super::error::{invalid, ConfigError};
use serde::Deserialize;

/// Event log retention.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsConfig {
    /// Keep at most this many newest events (older ones are pruned).
    #[serde(default = "default_retention")]
    pub retain: u64,
    /// Keep RELEASED attachments listed for this many seconds.
    #[serde(default = "default_released_retention")]
    pub released_retain_secs: u64,
}

fn default_retention() -> u64 {
    100_000
}
fn default_released_retention() -> u64 {
    7 * 24 * 3600
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            retain: default_retention(),
            released_retain_secs: default_released_retention(),
        }
    }
}

impl EventsConfig {
    /// The log keeps enough events for a client to resume.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.retain < 1000 {
            return Err(invalid("events.retain", "keep at least 1000 events"));
        }
        Ok(())
    }
}
