//! The reconciler's own settings (`[reconciler]` in the agent's configuration).

use serde::Deserialize;

/// Reconciler timing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcilerConfig {
    /// First retry delay after a failed apply, milliseconds.
    #[serde(default = "default_backoff_initial")]
    pub backoff_initial_ms: u64,
    /// Retry delay cap, milliseconds.
    #[serde(default = "default_backoff_max")]
    pub backoff_max_ms: u64,
    /// Re-apply the desired set this often even when nothing changed (heals SM-side loss), seconds.
    #[serde(default = "default_resync")]
    pub resync_secs: u64,
}

fn default_backoff_initial() -> u64 {
    200
}
fn default_backoff_max() -> u64 {
    30_000
}
fn default_resync() -> u64 {
    300
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            backoff_initial_ms: default_backoff_initial(),
            backoff_max_ms: default_backoff_max(),
            resync_secs: default_resync(),
        }
    }
}

impl ReconcilerConfig {
    /// Checks the backoff: `backoff_initial_ms > 0` and `backoff_max_ms >= backoff_initial_ms`.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.backoff_initial_ms == 0 || self.backoff_max_ms < self.backoff_initial_ms {
            return Err("backoff must be > 0 and backoff_max_ms >= backoff_initial_ms");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_checked() {
        assert!(ReconcilerConfig::default().validate().is_ok());
        for (backoff_initial_ms, backoff_max_ms) in [(0, 10), (100, 50)] {
            let c = ReconcilerConfig {
                backoff_initial_ms,
                backoff_max_ms,
                ..ReconcilerConfig::default()
            };
            assert!(
                c.validate().is_err(),
                "{backoff_initial_ms} {backoff_max_ms}"
            );
        }
    }
}
