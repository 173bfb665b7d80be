//! The oracle's side of a store put back from a snapshot: what the reopened store must show,
//! which acknowledged commands the rollback took away, and the attachments read again.

use super::super::core::constants::{PORTS, PORT_GUID_BASE};
use super::{Known, Oracle};
use fabric_agent::domain::AttachmentState;
use std::collections::BTreeSet;

impl Oracle {
    /// The store was put back from a snapshot taken when the log ended at `snapshot_seq` and
    /// `attached`/`released` were the acknowledged commands. Judges the reopened store: when
    /// only the database file went back (not `whole`) and events were committed after the
    /// snapshot, the log must be under a new epoch and every event in it above every seq
    /// handed out before (none reused). When the whole state directory went back the store
    /// cannot see it: the oracle reads the log again from the snapshot's end, and every event
    /// after it must come under an (epoch, seq) never handed out before. Then the acknowledged
    /// commands the rollback lost, exactly those acknowledged after the snapshot, are exempt
    /// from check 3 (a rollback is an operator's act), and the attachments are read again from
    /// the store. A key reported RELEASED stays guarded: a restored attachment of it must not
    /// put it back before the control plane attaches it again ([`Oracle::reattached`]).
    /// Returns the lost releases.
    pub fn restored(
        &mut self,
        snapshot_seq: u64,
        attached: &BTreeSet<String>,
        released: &BTreeSet<String>,
        whole: bool,
        now_ms: u64,
    ) -> Vec<String> {
        let lost: Vec<String> = self.acked_release.difference(released).cloned().collect();
        self.acked_attach.retain(|i| attached.contains(i));
        self.acked_release.retain(|i| released.contains(i));
        if whole {
            // The log is the snapshot's again, under the epoch it had then; what the lost
            // writes logged is no longer in it.
            match self.store.last_seq() {
                Ok(last) => {
                    self.last_seq = last;
                    self.logged.split_off(&(last + 1));
                }
                Err(e) => self.fail(now_ms, format!("reading the restored log failed: {e}")),
            }
            self.epoch = self.store.epoch();
        } else {
            if self.last_seq > snapshot_seq {
                self.judge_reopened(snapshot_seq, now_ms);
            }
            self.epoch = self.store.epoch();
            self.reopened_above = true;
        }
        self.reload_instances();
        lost
    }

    /// A database file put back after events were committed past the snapshot's
    /// `snapshot_seq`: its open must have started a new epoch above every seq handed out.
    fn judge_reopened(&mut self, snapshot_seq: u64, now_ms: u64) {
        {
            if self.store.epoch() == self.epoch {
                let what = format!(
                    "the store went back from seq {} to the snapshot's {snapshot_seq} and kept its epoch {}",
                    self.last_seq, self.epoch
                );
                self.fail(now_ms, what);
            }
            match self.store.events_after(0, 1) {
                Ok(e) if e.first().is_some_and(|e| e.seq <= self.last_seq) => {
                    let what = format!(
                        "the restored log reuses seq {} (seqs up to {} were handed out)",
                        e[0].seq, self.last_seq
                    );
                    self.fail(now_ms, what);
                }
                Ok(_) => {}
                Err(e) => self.fail(now_ms, format!("reading the restored log failed: {e}")),
            }
        }
    }

    /// Reads the attachments again from the store put back, and the prune checks with them.
    fn reload_instances(&mut self) {
        let stored = self.store.attachments().unwrap_or_default();
        self.instances = stored
            .iter()
            .map(|a| {
                let ports = if a.ports.is_empty() {
                    (0..PORTS).map(|i| PORT_GUID_BASE + i as u64).collect()
                } else {
                    a.ports.iter().map(|p| p.port_guid.0).collect()
                };
                let known = Known {
                    value: a.pkey_value().0,
                    state: a.state,
                    ports,
                    released_ns: (a.state == AttachmentState::Released)
                        .then_some(a.updated_unix_ns),
                };
                (a.instance_id.as_str().to_owned(), known)
            })
            .collect();
        // Check 9 goes on from the restored attachments: what the rollback took away was not
        // pruned, and a restored RELEASED one is kept for its retain from its release.
        self.prune_due.clear();
        if let Some(p) = self.pruning.clone() {
            let now_ns = p.now_ns();
            for (id, k) in &self.instances {
                let due = k.released_ns.map(|r| r.saturating_add(p.retain_ns));
                if let Some(due) = due.filter(|d| *d > now_ns) {
                    self.prune_due.insert((due, id.clone()));
                }
            }
            self.released_seen.notify_one();
        }
    }

    /// The control plane sent the attach of a restored attachment again and it was
    /// acknowledged: its key is asked for again, as by a new attachment.
    pub fn reattached(&mut self, instance: &str) {
        if let Some(k) = self.instances.get(instance) {
            self.guard.remove(&(k.value & 0x7FFF));
        }
    }
}
