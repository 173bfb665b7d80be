//! A name-only change costs no sweep: a node that renames a key it holds (same keys,
//! memberships and ports, a newer generation) gets its set stored and answered, while the
//! partitions file stays byte for byte what OpenSM last accepted (no write, no sweep); a real
//! change afterwards is written and swept once, still without the name.

use testkit::common;

use common::memberships::memberships;
use common::sm_host::opensm_backend;
use fabric_agent::domain::{Membership, NodeMemberships};

fn named(name: &str, keys: &[u32]) -> NodeMemberships {
    memberships(
        "node1",
        [0x10],
        keys.iter().map(|k| (*k, Membership::Full)),
        |_| name.to_owned(),
    )
}

#[tokio::test]
async fn renaming_a_held_key_writes_nothing_and_sweeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partitions.conf");
    std::fs::write(&path, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let backend = opensm_backend(&path);
    backend
        .set_node(named("train", &[0x0a11]), 1)
        .await
        .unwrap();
    let (sweeps, writes) = (backend.sweeps(), backend.writes());
    let accepted = std::fs::read(&path).unwrap();
    assert!(String::from_utf8_lossy(&accepted).contains("fa.0a11=0x0a11"));

    for (generation, name) in (2..12).zip(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]) {
        backend
            .set_node(named(name, &[0x0a11]), generation)
            .await
            .unwrap();
    }
    assert_eq!(backend.sweeps(), sweeps, "a rename made OpenSM sweep");
    assert_eq!(backend.writes(), writes, "a rename wrote the file");
    assert_eq!(std::fs::read(&path).unwrap(), accepted);
    let stored = backend.node("node1").unwrap();
    assert_eq!(stored.generation, 11);
    assert!(stored.memberships.keys.values().all(|k| k.name == "j"));

    // A real change is written and swept once.
    backend
        .set_node(named("j", &[0x0a11, 0x0a12]), 12)
        .await
        .unwrap();
    assert_eq!(backend.sweeps(), sweeps + 1);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("fa.0a12=0x0a12") && !text.contains(".j"),
        "{text}"
    );
}
