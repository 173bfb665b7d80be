//! Failure isolation in the SM host's OpenSM backend, in process (no OpenSM: reloads
//! accepted): a set the operator's part now conflicts with is quarantined with a condition
//! naming the node while the other nodes' sets are written; a release always goes through
//! (also under an `ALL=full` Default that refuses new keys); a refused set still applies its
//! removals; a request admitted in part comes back with the same generation and is judged
//! again, not refused as another set. The fabric-level case: tests/opensm/isolation.rs.

use testkit::common;

use common::memberships;
use common::sm_host::opensm_backend;
use fabric_agent::domain::{ConditionKind, Guid, Membership, NodeMemberships};
use fabric_agent::sm::opensm::{OpenSmBackend, OpenSmError};
use std::path::{Path, PathBuf};

/// A backend on a fresh partitions file holding only the Default entry.
fn setup() -> (tempfile::TempDir, PathBuf, OpenSmBackend) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("partitions.conf");
    std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let sm = opensm_backend(&file);
    (dir, file, sm)
}

fn set(node: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    memberships(
        node,
        [guid],
        keys.iter().map(|k| (*k, Membership::Full)),
        |k| format!("t{k:x}"),
    )
}

fn holds(file: &Path, guid: u64, key: u32) -> bool {
    let text = std::fs::read_to_string(file).unwrap();
    let entry = format!("=0x{key:04x} :\n    0x{guid:016x}=full;");
    text.contains(&entry)
}

#[tokio::test]
async fn a_conflicting_stored_set_is_quarantined_and_the_others_are_written() {
    let (_dir, file, sm) = setup();
    sm.set_node(set("a", 0x10, &[0x0a01]), 1).await.unwrap();
    sm.set_node(set("b", 0x20, &[0x0a02]), 1).await.unwrap();
    sm.set_node(set("c", 0x30, &[0x0a03]), 1).await.unwrap();

    // The operator defines b's key outside the region (an in-place edit).
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("op=0x0a02 : ALL_SWITCHES=full ;\n{text}")).unwrap();

    // c's release is written; b's set is left out (its key gone from its port), a's stays.
    sm.set_node(set("c", 0x30, &[]), 2).await.unwrap();
    assert!(!holds(&file, 0x30, 0x0a03));
    assert!(!holds(&file, 0x20, 0x0a02));
    assert!(holds(&file, 0x10, 0x0a01));
    let quarantined: Vec<_> = sm
        .conditions_now()
        .into_iter()
        .filter(|c| c.kind == ConditionKind::NodeSetQuarantined)
        .collect();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert!(
        quarantined[0].detail.contains("node b:") && quarantined[0].detail.contains("0x0a02"),
        "{quarantined:?}"
    );
    // b's retry is answered with the quarantine, never OK.
    let e = sm.set_node(set("b", 0x20, &[0x0a02]), 1).await.unwrap_err();
    assert!(
        matches!(&e, OpenSmError::Quarantined { node, .. } if node.as_str() == "b"),
        "{e:?}"
    );
    // b's release goes through and ends the quarantine.
    sm.set_node(set("b", 0x20, &[]), 2).await.unwrap();
    assert!(sm
        .conditions_now()
        .iter()
        .all(|c| c.kind != ConditionKind::NodeSetQuarantined));
}

#[tokio::test]
async fn a_release_always_goes_through_and_a_refused_set_applies_its_removals() {
    let (_dir, file, sm) = setup();
    sm.set_node(set("a", 0x10, &[0x0a01, 0x0a02, 0x0a03]), 1)
        .await
        .unwrap();

    // The operator's Default now grants ALL=full: sets with keys are refused...
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("ALL=limited", "ALL=full")).unwrap();
    sm.resync().await.unwrap();
    // ...but a release that keeps other keys is served (it only takes away).
    sm.set_node(set("a", 0x10, &[0x0a01, 0x0a02]), 2)
        .await
        .unwrap();
    assert!(!holds(&file, 0x10, 0x0a03));
    // A set adding a key is refused; the removal it carries is applied all the same.
    let e = sm
        .set_node(set("a", 0x10, &[0x0a01, 0x0a04]), 3)
        .await
        .unwrap_err();
    assert!(matches!(e, OpenSmError::InsecureDefault(_)), "{e:?}");
    assert!(!holds(&file, 0x10, 0x0a02));
    assert!(!holds(&file, 0x10, 0x0a04));
    assert!(holds(&file, 0x10, 0x0a01));
    // The same request again (a transport retry, same generation) is judged again, not
    // refused as another set of that generation.
    let e = sm
        .set_node(set("a", 0x10, &[0x0a01, 0x0a04]), 3)
        .await
        .unwrap_err();
    assert!(matches!(e, OpenSmError::InsecureDefault(_)), "{e:?}");
    // An older generation is still fenced.
    let e = sm.set_node(set("a", 0x10, &[0x0a01]), 2).await.unwrap_err();
    assert!(
        matches!(e, OpenSmError::StaleGeneration { sent: 2, stored: 3 }),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_port_held_by_another_node_refuses_its_keys_only() {
    let (_dir, file, sm) = setup();
    sm.set_node(set("a", 0x10, &[0x0a01]), 1).await.unwrap();
    sm.set_node(set("b", 0x20, &[0x0a02]), 1).await.unwrap();
    // b releases 0x0a02 and claims a's port with 0x0a05: the claim is refused, the release
    // and 0x0a05 on b's own port go through, a's port gets nothing of b's.
    let mut claim = set("b", 0x20, &[0x0a05]);
    claim.port_guids.push(Guid(0x10));
    let e = sm.set_node(claim, 2).await.unwrap_err();
    assert!(
        matches!(&e, OpenSmError::PortHeld { port: Guid(0x10), owner } if owner.as_str() == "a"),
        "{e:?}"
    );
    assert!(!holds(&file, 0x20, 0x0a02));
    assert!(holds(&file, 0x20, 0x0a05));
    assert!(!holds(&file, 0x10, 0x0a05));
    assert_eq!(
        sm.node("b").unwrap().memberships.port_guids,
        vec![Guid(0x20)]
    );
}
