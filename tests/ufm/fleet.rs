//! The UFM backend's fleet-scale economy against the fake UFM, counted at the fake: one list
//! read for all keys, re-checks answered from UFM's `last_updated` stamp, changes made by
//! someone else still found, the bound on what a stuck stamp can hide, and the request budget.

use testkit::common;
use testkit::fake_ufm;

use common::cred::CredFile;
use fabric_agent::domain::{Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, UfmConfig, UfmSm};
use fabric_agent::sm::SubnetManager;
use fake_ufm::{FakeAuth, FakeMember, FakePartition, FakeUfm, LoggedRequest, Quirks};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const GUIDS: u64 = 8;
const KEYS: u16 = 32;
const FIRST_KEY: u16 = 0x0100;

struct Rig {
    fake: FakeUfm,
    cred: CredFile,
}

impl Rig {
    async fn new() -> Rig {
        Rig {
            fake: FakeUfm::start_with(FakeAuth::Open).await,
            cred: CredFile::new("admin:123456"),
        }
    }

    fn config(&self) -> UfmConfig {
        let mut c = self.fake.test_config(self.cred.path().to_owned(), 1);
        c.request_timeout_ms = 5_000;
        c.max_skipped_rechecks = 3;
        c.max_requests_per_sec = 10_000;
        c.request_burst = 10_000;
        c
    }

    fn sm(&self, config: &UfmConfig) -> UfmSm {
        UfmSm::new(config, Arc::new(MemoryLedgerStore::new())).unwrap()
    }

    /// Requests the fake saw while `f` ran.
    async fn count<F: std::future::Future>(&self, f: F) -> (F::Output, Vec<String>) {
        self.fake.clear_requests();
        let out = f.await;
        (out, calls(&self.fake.requests()))
    }
}

fn guid(i: u64) -> u64 {
    0x0002_c903_0000_0000 + i
}

fn node(keys: impl IntoIterator<Item = (u16, Membership)>) -> NodeMemberships {
    common::memberships(
        "node-a",
        (0..GUIDS).map(guid),
        keys.into_iter().map(|(k, m)| (u32::from(k), m)),
        |k| format!("p{k:x}"),
    )
}

fn all_keys() -> NodeMemberships {
    node((0..KEYS).map(|k| (FIRST_KEY + k, Membership::Full)))
}

fn calls(log: &[LoggedRequest]) -> Vec<String> {
    log.iter()
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect()
}

const STAMP: &str = "GET /ufmRest/resources/pkeys/last_updated 200";
const LIST: &str = "GET /ufmRest/resources/pkeys?guids_data=true 200";

/// Every desired key holds all 8 GUIDs, full.
fn assert_programmed(fake: &FakeUfm) {
    for k in 0..KEYS {
        let members = fake.members(FIRST_KEY + k);
        assert_eq!(members.len(), GUIDS as usize, "key {:#x}", FIRST_KEY + k);
        assert!(members.values().all(|m| *m == Membership::Full));
    }
}

#[tokio::test]
async fn a_no_change_recheck_costs_one_small_read_until_the_bound() {
    let rig = Rig::new().await;
    let sm = rig.sm(&rig.config());
    let (first, log) = rig.count(sm.apply(&all_keys(), 1)).await;
    first.unwrap();
    // Stamp, start-up list, 32 additions, one list read back: no per-key reads.
    assert_eq!(log.len(), 35, "{log:?}");
    assert_programmed(&rig.fake);
    // The first apply wrote, so its stamp vouches for nothing: the next one reads, once.
    let (second, log) = rig.count(sm.apply(&all_keys(), 2)).await;
    assert!(second.unwrap().detail.contains("32 already right"));
    assert_eq!(log, [STAMP, LIST]);
    // Then three re-checks (max_skipped_rechecks) cost the stamp alone ...
    for g in 3..6 {
        let (out, log) = rig.count(sm.apply(&all_keys(), g)).await;
        let detail = out.unwrap().detail;
        assert!(
            detail.contains("unchanged since the last confirming read"),
            "{detail}"
        );
        assert_eq!(log, [STAMP], "re-check {g}");
    }
    // ... and the fourth reads the partitions again.
    let (out, log) = rig.count(sm.apply(&all_keys(), 6)).await;
    assert!(out.unwrap().detail.contains("32 already right"));
    assert_eq!(log, [STAMP, LIST]);
}

#[tokio::test]
async fn a_change_made_at_ufm_by_someone_else_is_found_at_the_next_recheck() {
    let rig = Rig::new().await;
    let sm = rig.sm(&rig.config());
    sm.apply(&all_keys(), 1).await.unwrap();
    sm.apply(&all_keys(), 2).await.unwrap();
    let (_, log) = rig.count(sm.apply(&all_keys(), 3)).await;
    assert_eq!(
        log,
        [STAMP],
        "the re-check is skipped while nothing changes"
    );

    // An operator takes one of this node's GUIDs out of a key, through UFM.
    let key = FIRST_KEY + 7;
    let mut p = rig.fake.partition(key).unwrap();
    p.members.remove(&guid(3));
    rig.fake.insert_partition(key, p);

    let (out, log) = rig.count(sm.apply(&all_keys(), 4)).await;
    let detail = out.unwrap().detail;
    assert!(detail.contains("1 key(s) programmed"), "{detail}");
    assert_eq!(log[..2], [STAMP, LIST], "{log:?}");
    assert!(log.contains(&"POST /ufmRest/resources/pkeys 200".to_string()));
    assert_programmed(&rig.fake);
    sm.apply(&all_keys(), 5).await.unwrap();
    let (_, log) = rig.count(sm.apply(&all_keys(), 6)).await;
    assert_eq!(log, [STAMP]);

    // A change elsewhere in the fabric (another tenant's key) moves the stamp too: this node
    // reads again, finds its keys right, and writes nothing.
    rig.fake.insert_partition(
        0x0777,
        FakePartition {
            name: "other".into(),
            ip_over_ib: true,
            members: BTreeMap::from([(
                0x0002_c903_00ff_0001,
                FakeMember {
                    membership: Membership::Full,
                    index0: false,
                },
            )]),
        },
    );
    let (out, log) = rig.count(sm.apply(&all_keys(), 7)).await;
    assert!(out.unwrap().detail.contains("32 already right"));
    assert_eq!(log, [STAMP, LIST]);
}

#[tokio::test]
async fn a_stuck_stamp_hides_a_change_for_at_most_the_configured_rechecks() {
    let rig = Rig::new().await;
    let sm = rig.sm(&rig.config());
    sm.apply(&all_keys(), 1).await.unwrap();
    sm.apply(&all_keys(), 2).await.unwrap();
    // A UFM whose stamp does not move (coarse tick, restored state): the change below is
    // invisible to the stamp.
    rig.fake.set_quirks(Quirks {
        frozen_last_updated: true,
        ..Quirks::default()
    });
    rig.fake.drop_partition(FIRST_KEY);
    let mut skipped = 0;
    let mut healed_at = None;
    for g in 3..10 {
        let (out, log) = rig.count(sm.apply(&all_keys(), g)).await;
        out.unwrap();
        if log == [STAMP] {
            skipped += 1;
        } else {
            healed_at = Some(g);
            break;
        }
    }
    assert_eq!(
        skipped, 3,
        "max_skipped_rechecks = 3 re-checks trusted the stamp"
    );
    assert_eq!(healed_at, Some(6));
    assert_programmed(&rig.fake);
}

#[tokio::test]
async fn a_desired_change_forgets_the_stamp() {
    let rig = Rig::new().await;
    let sm = rig.sm(&rig.config());
    sm.apply(&all_keys(), 1).await.unwrap();
    sm.apply(&all_keys(), 2).await.unwrap();
    let mut limited = all_keys();
    limited
        .keys
        .get_mut(&PKey::new(u32::from(FIRST_KEY)).unwrap())
        .unwrap()
        .membership = Membership::Limited;
    let (out, log) = rig.count(sm.apply(&limited, 3)).await;
    assert!(out.unwrap().detail.contains("1 key(s) programmed"));
    assert_eq!(log[..2], [STAMP, LIST]);
    assert!(rig
        .fake
        .members(FIRST_KEY)
        .values()
        .all(|m| *m == Membership::Limited));
}

#[tokio::test]
async fn without_the_stamp_every_recheck_reads_the_list_once() {
    let rig = Rig::new().await;
    rig.fake.set_quirks(Quirks {
        no_last_updated: true,
        ..Quirks::default()
    });
    let sm = rig.sm(&rig.config());
    let (_, log) = rig.count(sm.apply(&all_keys(), 1)).await;
    assert_eq!(log[0], "GET /ufmRest/resources/pkeys/last_updated 404");
    for g in 2..5 {
        let (out, log) = rig.count(sm.apply(&all_keys(), g)).await;
        assert!(out.unwrap().detail.contains("32 already right"));
        assert_eq!(log, [LIST], "the stamp is not asked for again");
    }
}

#[tokio::test]
async fn per_key_reads_when_list_reads_are_off() {
    let rig = Rig::new().await;
    let mut config = rig.config();
    config.list_reads = false;
    config.max_skipped_rechecks = 0;
    let sm = rig.sm(&config);
    sm.apply(&all_keys(), 1).await.unwrap();
    let (_, log) = rig.count(sm.apply(&all_keys(), 2)).await;
    assert_eq!(log.len(), KEYS as usize, "one GET per key: {log:?}");
    assert!(log.iter().all(|c| c.contains("/resources/pkeys/0x01")));
}

#[tokio::test]
async fn a_list_over_the_answer_cap_falls_back_to_per_key_reads_for_good() {
    let rig = Rig::new().await;
    // Another ~10 MB of partitions in the fabric: the list answer exceeds the 8 MiB cap.
    for k in 0..1_600u16 {
        let members = (0..100u64)
            .map(|g| {
                (
                    0x0008_0000_0000_0000 + u64::from(k) * 1_000 + g,
                    FakeMember {
                        membership: Membership::Full,
                        index0: false,
                    },
                )
            })
            .collect();
        rig.fake.insert_partition(
            0x2000 + k,
            FakePartition {
                name: format!("big{k}"),
                ip_over_ib: true,
                members,
            },
        );
    }
    let sm = rig.sm(&rig.config());
    let desired = node([(0x0a12, Membership::Full), (0x0a13, Membership::Full)]);
    let (out, log) = rig.count(sm.apply(&desired, 1)).await;
    out.unwrap();
    assert_eq!(log[..2], [STAMP, LIST], "{log:?}");
    assert_eq!(
        log.iter()
            .filter(|c| c.contains("?guids_data=true"))
            .count(),
        1 + 2 + 2,
        "list, two per-key reads, two per-key reads back: {log:?}"
    );
    let (_, log) = rig.count(sm.apply(&desired, 2)).await;
    assert_eq!(
        log,
        [
            STAMP,
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
            "GET /ufmRest/resources/pkeys/0x0a13?guids_data=true 200",
        ],
        "the list is not asked for again"
    );
}

#[tokio::test]
async fn the_budget_caps_requests_per_second_and_never_fails_an_apply() {
    let rig = Rig::new().await;
    let mut config = rig.config();
    config.max_requests_per_sec = 20;
    config.request_burst = 5;
    let sm = rig.sm(&config);
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(30), sm.apply(&all_keys(), 1))
        .await
        .expect("the apply finishes within 30 s")
        .expect("the budget delays, never fails");
    assert!(outcome.detail.contains("32 key(s) programmed"));
    assert_programmed(&rig.fake);
    let log = rig.fake.requests();
    assert_eq!(log.len(), 35);
    // 35 requests, 5 at once, then 20/s: at least 1.5 s.
    let took = started.elapsed().as_secs_f64();
    assert!(
        took >= 1.45,
        "35 requests at 20/s (burst 5) took {took:.2}s"
    );
    // No one-second window at the fake holds more than burst + rate requests (+1 for the
    // window edges).
    for (i, r) in log.iter().enumerate() {
        let within = log[i..]
            .iter()
            .filter(|s| s.at.duration_since(r.at) < Duration::from_secs(1))
            .count();
        assert!(within <= 26, "{within} requests within 1 s of request {i}");
    }
}
