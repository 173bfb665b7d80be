//! What a commit does once OpenSM answered a write: accepted (the copy kept, the hold ended or
//! kept, the commit state cleared) or rejected (the bytes kept and held back, the last accepted
//! file restored, the rejection recorded), and the refusal of additions OpenSM rejected too
//! often, lifted when their node's set changes.

use super::{blocking, FileCommitter, Withheld};
use crate::domain::NodeId;
use crate::sm::opensm::error::{OpenSmError, Rejection, Restored};
use crate::sm::opensm::file::{accepted_copy_path, replace_atomically};
use crate::sm::opensm::repair::{operator_part, rejected_bytes_path, RejectedFile};
use crate::sm::opensm::store::StoredNode;
use std::collections::BTreeMap;

impl FileCommitter {
    /// OpenSM re-read `bytes` (carrying `keys` tenant keys) without error: keeps them as the
    /// accepted copy, ends the hold unless the file left an addition out (`withheld`), clears
    /// the commit state, and returns the commit's detail.
    pub(super) async fn accepted_write(
        &self,
        bytes: &[u8],
        withheld: &Withheld,
        keys: usize,
    ) -> Result<String, OpenSmError> {
        let path = &self.config.partitions_file;
        let copy = accepted_copy_path(path);
        let good = bytes.to_vec();
        blocking(move || replace_atomically(&copy, &good)).await?;
        // A file that held nothing back ends the hold; one written without a held addition
        // keeps it (and the rejected condition that explains it).
        let ends_hold = withheld.is_empty();
        if ends_hold {
            self.health().rejected = None;
            let gone = rejected_bytes_path(path);
            let _ = blocking(move || match std::fs::remove_file(&gone) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .await;
        }
        let written_part = operator_part(bytes);
        self.save_commit(|c| {
            c.unconfirmed = None;
            if ends_hold {
                c.rejected = None;
            }
            // The operator's rejected edit is cleared once the operator's part changed and
            // OpenSM accepted it; the restored part alone does not clear it.
            if c.operator_rejected
                .as_ref()
                .is_some_and(|o| o.restored_operator_part != written_part)
            {
                c.operator_rejected = None;
            }
        })
        .await?;
        let without = if withheld.is_empty() {
            String::new()
        } else {
            let nodes: Vec<String> = withheld.keys().map(ToString::to_string).collect();
            format!(
                " without the additions OpenSM rejected (held back for {})",
                nodes.join(", ")
            )
        };
        Ok(format!(
            "partitions file written ({keys} keys){without}, heavy sweep requested, OpenSM re-read it without error"
        ))
    }

    /// OpenSM rejected `bytes` (its log `lines`) while `accepted` was the last accepted file
    /// and `current` the file before the write: holds back what they add, keeps them, puts the
    /// last good file back and records the rejection. Returns the caller's error, the file put
    /// back (None: nothing was kept) and whether OpenSM was seen re-reading it.
    pub(super) async fn rejected_write(
        &self,
        lines: String,
        bytes: &[u8],
        accepted: Option<&[u8]>,
        current: &[u8],
    ) -> Result<(OpenSmError, Option<Vec<u8>>, bool), OpenSmError> {
        {
            let mut st = self.health();
            let earlier = st.rejected.take();
            st.rejected = Some(RejectedFile::after(earlier, bytes.to_vec(), accepted));
        }
        self.keep_rejected_bytes(bytes.to_vec()).await;
        // Raised before anything is restored: whoever sees the restored file sees why.
        let first = Rejection::written_before_restore(&lines);
        self.save_commit(|c| c.rejected = Some(first.clone()))
            .await?;
        let fallback = accepted
            .map(<[u8]>::to_vec)
            .or_else(|| (current != bytes).then(|| current.to_vec()));
        let restored = match fallback.clone() {
            Some(good) => self.restore(good).await,
            None => Restored::NothingKept,
        };
        let reread = restored.reread();
        let rejection = Rejection::Written { lines, restored };
        let why = rejection.to_string();
        tracing::error!(detail = %why, "partitions file rejected");
        self.save_commit(|c| {
            c.rejected = Some(why.clone());
            c.unconfirmed = (!reread).then(|| why.clone());
        })
        .await?;
        Ok((OpenSmError::Rejected(rejection), fallback, reread))
    }

    /// While OpenSM's rejections refuse an addition: notes the sets of the nodes it belongs
    /// to (once), and lifts the refusal of each node whose stored set changed since.
    pub(super) fn note_or_lift_refusal(&self, nodes: &BTreeMap<NodeId, StoredNode>) {
        let mut st = self.health();
        let Some(r) = st.rejected.as_mut().filter(|r| r.refused()) else {
            return;
        };
        for id in r.lift_changed(|id| nodes.get(id).map(|n| &n.memberships)) {
            tracing::info!(node_id = %id, "the node's set changed: its refused addition may be written once more");
        }
        r.note_sets(nodes.iter().map(|(id, n)| (id, &n.memberships)));
    }
}
