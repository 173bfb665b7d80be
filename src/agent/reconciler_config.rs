//! The reconciler's own settings (`[reconciler]` in the agent's configuration).

use serde::Deserialize;

/// Reconciler timing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcilerConfig {
    /// First retry delay after a failed apply, milliseconds.
    #[serde(default = "default_backoff_initial")]
    pub backoff_initial_ms: u64,
    /// Retry delay cap, milliseconds; also the retry pace after a refusal. A new request (a
    /// desired set other than the one that failed) or a changed embedded fault file is tried at
    /// once.
    #[serde(default = "default_backoff_max")]
    pub backoff_max_ms: u64,
    /// Re-apply the desired set this often even when nothing changed (heals SM-side loss), seconds.
    #[serde(default = "default_resync")]
    pub resync_secs: u64,
    /// Each resync comes after `resync_secs` plus or minus up to this percentage (uniform,
    /// drawn per node and round), so a fleet restarted at once does not re-check at once.
    /// 0-50.
    #[serde(default = "default_resync_jitter_pct")]
    pub resync_jitter_pct: u32,
}

/// A `[reconciler]` setting its rules refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReconcilerConfigError {
    /// The backoff is zero, or its cap is below its start.
    #[error("backoff must be > 0 and backoff_max_ms >= backoff_initial_ms")]
    Backoff,
    /// The resync jitter is over 50 percent.
    #[error("resync jitter must be 0-50 (percent of resync_secs)")]
    Jitter,
}

impl ReconcilerConfigError {
    /// The dotted configuration key the error is about.
    pub fn key(self) -> &'static str {
        match self {
            ReconcilerConfigError::Backoff => "reconciler.backoff_max_ms",
            ReconcilerConfigError::Jitter => "reconciler.resync_jitter_pct",
        }
    }
}

fn default_resync_jitter_pct() -> u32 {
    10
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
            resync_jitter_pct: default_resync_jitter_pct(),
        }
    }
}

impl ReconcilerConfig {
    /// Checks the backoff (`backoff_initial_ms > 0` and `backoff_max_ms >= backoff_initial_ms`)
    /// and the jitter (at most 50 percent).
    pub fn validate(&self) -> Result<(), ReconcilerConfigError> {
        if self.backoff_initial_ms == 0 || self.backoff_max_ms < self.backoff_initial_ms {
            return Err(ReconcilerConfigError::Backoff);
        }
        if self.resync_jitter_pct > 50 {
            return Err(ReconcilerConfigError::Jitter);
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
            assert_eq!(
                c.validate(),
                Err(ReconcilerConfigError::Backoff),
                "{backoff_initial_ms} {backoff_max_ms}"
            );
        }
        let c = ReconcilerConfig {
            resync_jitter_pct: 51,
            ..ReconcilerConfig::default()
        };
        assert_eq!(c.validate(), Err(ReconcilerConfigError::Jitter));
    }
}
