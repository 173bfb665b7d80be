//! The standing conditions of an SM host among several that come from its start and its own
//! OpenSM: `SM_HOST_NOT_CAUGHT_UP` while a peer has not answered since the agent started (READY
//! came after the catch-up's timeout, not after the catch-up), and `OPENSM_NOT_RUNNING` while
//! its OpenSM is seen dead ([`super::sminfo::SmRole::not_running`]).

use super::peer_state::SyncStatus;
use super::sminfo::SmRole;
use crate::domain::{Condition, ConditionKind};
use std::collections::BTreeMap;

/// The conditions of a host with sync state `status`, whose OpenSM role is read by `role`,
/// holding the sets of `nodes` (node -> generation): the nodes whose applies wait on it.
pub fn standing(
    status: &SyncStatus,
    role: Option<&SmRole>,
    nodes: BTreeMap<String, u64>,
) -> Vec<Condition> {
    let mut out = Vec::new();
    if !status.caught_up {
        let waiting_for = &status.waiting_for;
        let peers = if waiting_for.is_empty() {
            "the first pull has not finished".to_owned()
        } else {
            format!("no answer yet from {}", waiting_for.join(", "))
        };
        out.push(Condition {
            kind: ConditionKind::SmHostNotCaughtUp,
            detail: format!(
                "not caught up with every peer SM host since start ({peers}): the sets it holds back stay as they were until the node or a peer confirms them"
            ),
        });
    }
    if let Some(why) = role.and_then(SmRole::not_running) {
        let blocked = if nodes.is_empty() {
            "no node has sent it a set yet".to_owned()
        } else {
            format!(
                "it blocks ACTIVE and RELEASED on {} (their applies wait for this host's acknowledgement; stop and fence it, or start OpenSM)",
                nodes.into_keys().collect::<Vec<_>>().join(", ")
            )
        };
        out.push(Condition {
            kind: ConditionKind::OpenSmNotRunning,
            detail: format!("this host's OpenSM is not running ({why}): {blocked}"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sm::opensm::opensm_state::LogStateReader;
    use std::sync::Arc;

    #[test]
    fn not_caught_up_names_the_peers() {
        let status = SyncStatus {
            waiting_for: vec!["https://smhost2:7443".into()],
            ..SyncStatus::default()
        };
        let c = standing(&status, None, BTreeMap::new());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ConditionKind::SmHostNotCaughtUp);
        assert!(c[0].detail.contains("https://smhost2:7443"));
        let caught_up = SyncStatus {
            caught_up: true,
            ..SyncStatus::default()
        };
        assert!(standing(&caught_up, None, BTreeMap::new()).is_empty());
    }

    #[test]
    fn opensm_not_running_names_the_nodes_it_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let role = SmRole::from_log(Arc::new(LogStateReader::new(dir.path().join("log"))))
            .with_pid_check(Some(Box::new(|| Err("OpenSM's pid 9 is gone".into()))));
        let caught_up = SyncStatus {
            caught_up: true,
            ..SyncStatus::default()
        };
        let nodes = BTreeMap::from([("node1".to_owned(), 3), ("node2".to_owned(), 1)]);
        let c = standing(&caught_up, Some(&role), nodes);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ConditionKind::OpenSmNotRunning);
        assert!(
            c[0].detail.contains("pid 9 is gone") && c[0].detail.contains("node1, node2"),
            "{}",
            c[0].detail
        );
    }
}
