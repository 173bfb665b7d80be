//! A late add UFM executes for a port the node no longer gives a key that it still holds on
//! another port (one instance released while another keeps the partition): the watch covers
//! each (key, GUID) the node may have sent, not only keys released as a whole. The release of
//! the port is not acknowledged until the window is over, and the re-appearance is removed at
//! once and reported.

use testkit::common;
use testkit::fake_ufm;

use common::cred::CredFile;
use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, UfmError, UfmSm};
use fabric_agent::sm::{SmError, SmFailure, SubnetManager};
use fake_ufm::FakeUfm;
use std::sync::Arc;
use std::time::{Duration, Instant};

const G1: u64 = 0x0002_c903_000e_0b72;
const G2: u64 = 0x0002_c903_000e_0b73;
const K: u16 = 0x0a12;

/// The node's two ports, with `K` given to `on` only.
fn node(on: &[u64]) -> NodeMemberships {
    let key = PKey::new(u32::from(K)).unwrap();
    let mut set = common::memberships::memberships(
        "node-a",
        [G1, G2],
        [(u32::from(K), Membership::Full)],
        |k| format!("part-{k:x}"),
    );
    set.keys.insert(
        key,
        KeySetting {
            membership: Membership::Full,
            name: format!("part-{K:x}"),
            ports: Some(on.iter().map(|g| Guid(*g)).collect()),
        },
    );
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_add_for_a_port_released_from_a_key_still_held_elsewhere_is_caught() {
    let fake = FakeUfm::start().await;
    let cred = CredFile::new("admin:123456");
    let store = MemoryLedgerStore::new();
    let mut config = fake.test_config(cred.path().to_owned(), 1);
    // Time-scaled: the late add lands 0.8 s after it was sent, inside this 2 s window.
    config.late_write_window_ms = 2_000;
    let sm = UfmSm::new(&config, Arc::new(store.clone())).unwrap();
    let key = PKey::new(u32::from(K)).unwrap();

    // Both ports get K; the first attempt of the add is answered 503 and executed late.
    fake.execute_adds_late(1, Duration::from_millis(800));
    let sent = Instant::now();
    sm.apply(&node(&[G1, G2]), 1).await.unwrap();
    assert!(fake.members(K).contains_key(&G2));

    // G2's instance is released; G1's keeps K. UFM shows G2 gone, yet the late add can still
    // bring it back: not acknowledged (no RELEASED for G2's instance).
    let late_window = |r: Result<_, SmError>| match r {
        Err(SmError::Unreachable(SmFailure::Ufm(UfmError::LateWriteWindow { key: k, .. }))) => {
            assert_eq!(k, key)
        }
        other => panic!("a watched GUID must not be acknowledged as released: {other:?}"),
    };
    late_window(sm.apply(&node(&[G1]), 2).await);
    assert!(!fake.members(K).contains_key(&G2));
    assert!(fake.members(K).contains_key(&G1));

    // UFM executes the stale add: G2 is back in K.
    let deadline = sent + Duration::from_millis(1_800);
    while !fake.members(K).contains_key(&G2) {
        assert!(Instant::now() < deadline, "the late add never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next apply removes it at once and reports the late write.
    late_window(sm.apply(&node(&[G1]), 3).await);
    assert!(!fake.members(K).contains_key(&G2), "removed at once");
    assert!(fake.members(K).contains_key(&G1));
    let conditions = sm.conditions();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0].kind.name(), "UFM_LATE_WRITE");

    // Past the window a read shows G2 clear: acknowledged, G1 kept, condition cleared.
    tokio::time::sleep(
        (sent + Duration::from_millis(2_100)).saturating_duration_since(Instant::now()),
    )
    .await;
    sm.apply(&node(&[G1]), 4).await.unwrap();
    assert!(sm.conditions().is_empty());
    assert!(!fake.members(K).contains_key(&G2));
    assert!(fake.members(K).contains_key(&G1));
    let ledger = store.ledger().unwrap();
    assert_eq!(ledger.guids(key), [Guid(G1)].into_iter().collect());
}
