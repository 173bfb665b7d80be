//! A WatchEvents consumer's plan ([`WatcherPlan`]): where it starts, its pace and pauses
//! (`sim::watcher` draws and runs them).

use std::fmt;

/// Where a consumer's first watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// After seq 0, with no epoch (the whole retained log, or OUT_OF_RANGE once pruned).
    Beginning,
    /// After the newest event, with the log's epoch (`GetNode` first).
    Newest,
    /// After this seq, with no epoch (it may be pruned already or beyond the newest).
    Seq(u64),
}

/// One consumer of a schedule.
#[derive(Debug, Clone)]
pub struct WatcherPlan {
    /// Its own random stream (paces, pauses, backoffs).
    pub seed: u64,
    /// Where its first watch starts.
    pub start: StartAt,
    /// When it first connects, ms after the start.
    pub first_ms: u64,
    /// Events the stream reads from the log at a time.
    pub batch: usize,
    /// Follow live events after the replay (else it replays, ends, and polls again later).
    pub follow: bool,
    /// The stream's maximum age, ms.
    pub max_age_ms: Option<u64>,
    /// Its pause after each event, ms.
    pub pace_ms: u64,
    /// One event in this many, on average, is followed by a pause of 1 to 10 minutes (0:
    /// never).
    pub pause_one_in: u32,
    /// After OUT_OF_RANGE, watch from the oldest retained event (else from the newest).
    pub resync_from_oldest: bool,
}

impl fmt::Display for WatcherPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let start = match self.start {
            StartAt::Beginning => "the beginning".to_owned(),
            StartAt::Newest => "the newest event".to_owned(),
            StartAt::Seq(s) => format!("after seq {s}"),
        };
        write!(
            f,
            "from {start} at t={} ms, batch {}, {}, pace {} ms",
            self.first_ms,
            self.batch,
            if self.follow {
                "follows"
            } else {
                "replays only"
            },
            self.pace_ms
        )?;
        if let Some(a) = self.max_age_ms {
            write!(f, ", max age {a} ms")?;
        }
        if self.pause_one_in > 0 {
            write!(f, ", pauses minutes 1 in {}", self.pause_one_in)?;
        }
        write!(
            f,
            ", resyncs from the {}",
            if self.resync_from_oldest {
                "oldest retained event"
            } else {
                "newest event"
            }
        )
    }
}
