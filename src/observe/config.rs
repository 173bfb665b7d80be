//! The port observer's own settings (`[observer]` in the agent's configuration).

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Port observer settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserverConfig {
    /// "auto" (verbs, then sysfs), "embedded", "smp", "sysfs" or "verbs". Default: "embedded"
    /// with the embedded backend, else "auto".
    #[serde(default)]
    pub kind: Option<ObserverKind>,
    /// Poll interval while a transition is pending, milliseconds.
    #[serde(default = "default_fast_poll")]
    pub fast_poll_ms: u64,
    /// Poll interval when idle (a safety net for event-driven observers), milliseconds.
    #[serde(default = "default_slow_poll")]
    pub slow_poll_ms: u64,
    /// sysfs root (default `/sys/class/infiniband`).
    #[serde(default = "default_sysfs_root")]
    pub sysfs_root: PathBuf,
    /// umad device for the smp observer.
    #[serde(default = "default_umad")]
    pub umad_device: PathBuf,
    /// SMP reply timeout, milliseconds.
    #[serde(default = "default_smp_timeout")]
    pub smp_timeout_ms: u64,
    /// SMP retries after a timeout.
    #[serde(default = "default_smp_retries")]
    pub smp_retries: u32,
    /// umad device through which the sysfs and verbs observers ask the subnet administrator
    /// whether a covered port missing from the read is still in the fabric (a port expected to
    /// stay up, e.g. another HCA's). None: they cannot ask, and such a port blocks RELEASED
    /// until it is back. The smp observer asks through its own `umad_device`.
    #[serde(default)]
    pub sa_umad_device: Option<PathBuf>,
}

fn default_fast_poll() -> u64 {
    50
}
fn default_slow_poll() -> u64 {
    5_000
}
fn default_sysfs_root() -> PathBuf {
    PathBuf::from("/sys/class/infiniband")
}
fn default_umad() -> PathBuf {
    PathBuf::from("/dev/infiniband/umad0")
}
fn default_smp_timeout() -> u64 {
    200
}
fn default_smp_retries() -> u32 {
    3
}

impl Default for ObserverConfig {
    fn default() -> Self {
        ObserverConfig {
            kind: None,
            fast_poll_ms: default_fast_poll(),
            slow_poll_ms: default_slow_poll(),
            sysfs_root: default_sysfs_root(),
            umad_device: default_umad(),
            smp_timeout_ms: default_smp_timeout(),
            smp_retries: default_smp_retries(),
            sa_umad_device: None,
        }
    }
}

impl ObserverConfig {
    /// Fast poll interval.
    pub fn fast_poll(&self) -> Duration {
        Duration::from_millis(self.fast_poll_ms)
    }
    /// Slow poll interval.
    pub fn slow_poll(&self) -> Duration {
        Duration::from_millis(self.slow_poll_ms)
    }
}

/// Observer names.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ObserverKind {
    /// verbs when devices are found, else sysfs.
    Auto,
    /// The embedded fabric's tables.
    Embedded,
    /// SMPs over umad.
    Smp,
    /// sysfs polling.
    Sysfs,
    /// libibverbs queries and async events.
    Verbs,
}

impl ObserverConfig {
    /// Checks the poll intervals: both > 0 and `slow_poll_ms >= fast_poll_ms`.
    pub fn validate(&self) -> Result<(), ObserverConfigError> {
        if self.fast_poll_ms == 0 || self.slow_poll_ms < self.fast_poll_ms {
            return Err(ObserverConfigError::PollIntervals {
                fast_poll_ms: self.fast_poll_ms,
                slow_poll_ms: self.slow_poll_ms,
            });
        }
        Ok(())
    }
}

/// Why `[observer]` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObserverConfigError {
    /// A poll interval is 0, or the slow one is shorter than the fast one.
    #[error("poll intervals must be > 0 and slow_poll_ms >= fast_poll_ms (got fast_poll_ms {fast_poll_ms}, slow_poll_ms {slow_poll_ms})")]
    PollIntervals {
        /// The configured fast interval.
        fast_poll_ms: u64,
        /// The configured slow interval.
        slow_poll_ms: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_intervals_are_checked() {
        assert!(ObserverConfig::default().validate().is_ok());
        for (fast_poll_ms, slow_poll_ms) in [(0, 10), (100, 50)] {
            let c = ObserverConfig {
                fast_poll_ms,
                slow_poll_ms,
                ..ObserverConfig::default()
            };
            assert_eq!(
                c.validate(),
                Err(ObserverConfigError::PollIntervals {
                    fast_poll_ms,
                    slow_poll_ms
                })
            );
        }
    }
}
