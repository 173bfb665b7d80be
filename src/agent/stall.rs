//! The bounded re-apply: a wait that no acknowledgement, port read or state change ends (a
//! RELEASING key still on a covered port after the subnet manager acknowledged a set without
//! it, with no master or the acting master not among the endpoints; PROGRAMMING with every port
//! up but without the key) re-sends the node's set once it has lasted [`REAPPLY_AFTER`], and
//! again every [`REAPPLY_AFTER`] while it lasts, instead of waiting for the periodic resync
//! (300 s by default). No I/O: the runner reads the time and passes it in.

use tokio::time::{Duration, Instant};

/// How long an attachment may wait, with the set acknowledged and nothing moving, before the
/// set is sent again: three of OpenSM's default sweep intervals (10 s), so a master that
/// programs the ports at its next sweeps is not disturbed, and well under the resync.
pub const REAPPLY_AFTER: Duration = Duration::from_secs(30);

/// Since when the node has waited without progress.
#[derive(Debug, Default)]
pub(super) struct Stall {
    since: Option<Instant>,
}

impl Stall {
    /// Sees one pass's outcome at `now`: `waiting` (some attachment waits while the set is
    /// acknowledged and no apply is pending), `progressed` (a state changed or an apply was
    /// acknowledged in this pass). Returns true when the set must be sent again now (the wait
    /// reached the bound; the next bound counts from now).
    pub(super) fn observe(&mut self, waiting: bool, progressed: bool, now: Instant) -> bool {
        if !waiting {
            self.since = None;
            return false;
        }
        if progressed {
            self.since = Some(now);
            return false;
        }
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) >= REAPPLY_AFTER {
            self.since = Some(now);
            return true;
        }
        false
    }

    /// When the current wait reaches the bound (None: no wait).
    pub(super) fn due_at(&self) -> Option<Instant> {
        self.since.map(|s| s + REAPPLY_AFTER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_without_progress_re_applies_at_the_bound_and_every_bound_after() {
        let t0 = Instant::now();
        let mut s = Stall::default();
        assert!(!s.observe(true, false, t0));
        assert_eq!(s.due_at(), Some(t0 + REAPPLY_AFTER));
        assert!(!s.observe(true, false, t0 + REAPPLY_AFTER - Duration::from_millis(1)));
        assert!(s.observe(true, false, t0 + REAPPLY_AFTER));
        // The next bound counts from the re-apply.
        assert!(!s.observe(true, false, t0 + REAPPLY_AFTER + Duration::from_secs(1)));
        assert!(s.observe(true, false, t0 + REAPPLY_AFTER * 2));
    }

    #[test]
    fn progress_restarts_the_wait_and_no_wait_clears_it() {
        let t0 = Instant::now();
        let mut s = Stall::default();
        assert!(!s.observe(true, false, t0));
        assert!(!s.observe(true, true, t0 + Duration::from_secs(29)));
        assert!(!s.observe(true, false, t0 + REAPPLY_AFTER));
        assert!(s.observe(true, false, t0 + Duration::from_secs(29) + REAPPLY_AFTER));
        assert!(!s.observe(false, false, t0 + REAPPLY_AFTER * 3));
        assert_eq!(s.due_at(), None);
        // A new wait counts from its own start.
        assert!(!s.observe(true, false, t0 + REAPPLY_AFTER * 3));
        assert!(!s.observe(
            true,
            false,
            t0 + REAPPLY_AFTER * 3 + Duration::from_secs(29)
        ));
    }
}
