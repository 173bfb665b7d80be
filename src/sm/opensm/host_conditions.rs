//! The standing conditions of an SM host among several that come from its start and its own
//! OpenSM: `SM_HOST_NOT_CAUGHT_UP` while a peer has not answered since the agent started (READY
//! came after the catch-up's timeout, not after the catch-up), and `OPENSM_NOT_RUNNING` while
//! its OpenSM is seen dead ([`super::sminfo::SmRole::not_running`]). The latter says whether it
//! blocks the nodes: not while the death is proven
//! ([`super::sminfo::SmRole::proven_not_running`]: this host's writes are then confirmed without
//! OpenSM), otherwise every node's apply waits for this host's acknowledgement.

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
    if let Some(role) = role {
        if let Some(why) = role.not_running() {
            out.push(Condition {
                kind: ConditionKind::OpenSmNotRunning,
                detail: not_running_detail(&why, role.proven_not_running_last(), nodes),
            });
        }
    }
    out
}

/// What a dead OpenSM (`why`) means for the nodes holding sets here: nothing blocks while its
/// death is proven (`proven`: this host's writes are then confirmed without it,
/// [`super::standby`]); otherwise every node's applies wait for this host.
fn not_running_detail(why: &str, proven: Option<String>, nodes: BTreeMap<String, u64>) -> String {
    let names = nodes.into_keys().collect::<Vec<_>>().join(", ");
    if let Some(proof) = proven {
        let held = if names.is_empty() {
            "no node has sent it a set yet".to_owned()
        } else {
            format!("it holds the sets of {names}")
        };
        return format!(
            "this host's OpenSM is not running, proven ({proof}): this host still acknowledges writes (its partitions file is in place for the OpenSM that starts next), so it does not block ACTIVE or RELEASED; keys are programmed only while another SM host's OpenSM is master; start OpenSM to restore this host's SM ({held})"
        );
    }
    let blocked = if names.is_empty() {
        "no node has sent it a set yet".to_owned()
    } else {
        format!(
            "it blocks ACTIVE and RELEASED on {names} (their applies wait for this host's acknowledgement, which then needs OpenSM's own sweep; stop and fence it, or start OpenSM)"
        )
    };
    format!(
        "this host's OpenSM is not running ({why}), not proven (that needs both: no SMInfo answer on sminfo_umad_device and a configured pid that names no live OpenSM): {blocked}"
    )
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
            c[0].detail.contains("pid 9 is gone")
                && c[0].detail.contains("not proven")
                && c[0]
                    .detail
                    .contains("it blocks ACTIVE and RELEASED on node1, node2"),
            "{}",
            c[0].detail
        );
    }

    #[test]
    fn a_proven_dead_opensm_blocks_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let role = SmRole::with_sminfo(
            Arc::new(LogStateReader::new(dir.path().join("log"))),
            dir.path().join("umad0"),
        )
        .with_pid_check(Some(Box::new(|| {
            Err(crate::sm::opensm::sminfo::PidDown {
                reason: "OpenSM's pid 9 is gone (no such process)".into(),
                proven: true,
            })
        })));
        role.set_last_read(Err(crate::sm::opensm::sminfo::ReadFailure {
            message: "SMInfo on umad0: no answer".into(),
            no_answer: true,
        }));
        let caught_up = SyncStatus {
            caught_up: true,
            ..SyncStatus::default()
        };
        let nodes = BTreeMap::from([("node1".to_owned(), 3)]);
        let c = standing(&caught_up, Some(&role), nodes);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ConditionKind::OpenSmNotRunning);
        let d = &c[0].detail;
        assert!(
            d.contains("proven (OpenSM's pid 9 is gone")
                && d.contains("does not block ACTIVE or RELEASED")
                && d.contains("node1")
                && !d.contains("it blocks"),
            "{d}"
        );
    }
}
