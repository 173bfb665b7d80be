//! The SM-host set changed in place (a SIGHUP changed the remote backend's `endpoints`,
//! `sm::remote::reload`): the last acknowledgement was given by the old set and no longer
//! counts, so nothing becomes ACTIVE or RELEASED until every host of the new set acknowledged
//! the current set, which is sent again at once.

use super::Loop;

impl Loop {
    /// Follows the backend's host-set epoch; returns whether it moved since the last look (the
    /// acknowledgement is then forgotten and the current set sent again).
    pub(super) fn follow_host_set(&mut self) -> bool {
        let now = self.agent.shared.parts.sm.host_set_epoch();
        if now == self.host_set_epoch {
            return false;
        }
        self.host_set_epoch = now;
        self.knows.host_set_changed();
        self.acked_at = None;
        self.force_apply = true;
        tracing::info!(
            epoch = now,
            "the SM-host set changed: the last acknowledgement no longer counts; sending the current set to every SM host (no ACTIVE or RELEASED until each acknowledged it)"
        );
        true
    }
}
