//! The UFM backend against the in-process fake UFM: exact requests, attach/release through
//! `apply`, UFM's quirks, retries, refusals, credentials handling and outages.

use testkit::fake_ufm;

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, TokenScheme, UfmConfig, UfmLedgerStore, UfmSm};
use fabric_agent::sm::ufm::{NoAnswer, UfmConfigError, UfmError};
use fabric_agent::sm::{SmError, SmFailure, SubnetManager};
use fake_ufm::{FakeAuth, FakeMember, FakePartition, FakeUfm, LoggedRequest, Quirks};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const G1: u64 = 0x0002_c903_000e_0b72;
const G2: u64 = 0x0002_c903_000e_0b73;
const OTHER: u64 = 0x0002_c903_00ff_0001;
const PASSWORD: &str = "S3cr3t-Pa55word";

fn fresh_ledger() -> Arc<dyn UfmLedgerStore> {
    Arc::new(MemoryLedgerStore::new())
}

struct Rig {
    fake: FakeUfm,
    dir: tempfile::TempDir,
    cred: PathBuf,
    /// The node's store for the ledger: every backend built by [`Rig::sm`] shares it, like
    /// agent processes restarted on one node.
    ledger: MemoryLedgerStore,
}

impl Rig {
    async fn new() -> Rig {
        let fake = FakeUfm::start_with(FakeAuth::Basic {
            user: "admin".into(),
            password: PASSWORD.into(),
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let cred = dir.path().join("ufm.cred");
        std::fs::write(&cred, format!("admin:{PASSWORD}\n")).unwrap();
        Rig {
            fake,
            dir,
            cred,
            ledger: MemoryLedgerStore::new(),
        }
    }

    fn config(&self) -> UfmConfig {
        // No stamp read: these tests pin each apply's exact partition reads
        // (tests/ufm/fleet.rs covers skipping).
        self.fake.test_config(self.cred.clone(), 3)
    }

    fn sm(&self) -> UfmSm {
        UfmSm::new(&self.config(), Arc::new(self.ledger.clone())).unwrap()
    }
}

fn node(guids: &[u64], keys: &[(u16, Membership)]) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse("node-a").unwrap(),
        port_guids: guids.iter().map(|g| Guid(*g)).collect(),
        keys: keys
            .iter()
            .map(|(k, m)| {
                (
                    PKey::new(u32::from(*k)).unwrap(),
                    KeySetting {
                        membership: *m,
                        name: format!("part-{k:x}"),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}

fn calls(log: &[LoggedRequest]) -> Vec<String> {
    log.iter()
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect()
}

fn members(pairs: &[(u64, Membership)]) -> BTreeMap<u64, Membership> {
    pairs.iter().copied().collect()
}

#[tokio::test]
async fn first_apply_sends_the_documented_requests() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    let outcome = sm
        .apply(&node(&[G1, G2], &[(0x0a12, Membership::Full)]), 1)
        .await
        .unwrap();
    let log = rig.fake.requests();
    assert_eq!(
        calls(&log),
        [
            "GET /ufmRest/resources/pkeys?guids_data=true 200",
            "POST /ufmRest/resources/pkeys 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
    assert_eq!(
        log[1].body,
        Some(json!({
            "pkey": "0x0a12",
            "guids": ["0002c903000e0b72", "0002c903000e0b73"],
            "membership": "full",
            "index0": false,
            "ip_over_ib": true
        }))
    );
    assert!(log[0].body.is_none() && log[2].body.is_none());
    assert_eq!(
        rig.fake.members(0x0a12),
        members(&[(G1, Membership::Full), (G2, Membership::Full)])
    );
    assert!(
        outcome.detail.contains("1 key(s) programmed"),
        "{}",
        outcome.detail
    );
    assert!(outcome.detail.contains("3 requests"), "{}", outcome.detail);
}

#[tokio::test]
async fn partition_settings_come_from_the_config() {
    let rig = Rig::new().await;
    let mut config = rig.config();
    config.index0 = true;
    config.ip_over_ib = false;
    let sm = UfmSm::new(&config, fresh_ledger()).unwrap();
    sm.apply(&node(&[G1], &[(0x0005, Membership::Limited)]), 2)
        .await
        .unwrap();
    let post = &rig.fake.requests()[1];
    assert_eq!(
        post.body,
        Some(
            json!({"pkey":"0x0005","guids":["0002c903000e0b72"],"membership":"limited","index0":true,"ip_over_ib":false})
        )
    );
    let p = rig.fake.partition(5).unwrap();
    assert!(!p.ip_over_ib);
    assert!(p.members[&G1].index0);
}

#[tokio::test]
async fn unchanged_reapply_only_reads() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    let desired = node(
        &[G1, G2],
        &[(0x0a12, Membership::Full), (0x0a13, Membership::Limited)],
    );
    sm.apply(&desired, 3).await.unwrap();
    rig.fake.clear_requests();
    let outcome = sm.apply(&desired, 4).await.unwrap();
    // Two keys to read: one GET of the list answers for both.
    assert_eq!(
        calls(&rig.fake.requests()),
        ["GET /ufmRest/resources/pkeys?guids_data=true 200"]
    );
    assert!(
        outcome.detail.contains("2 already right"),
        "{}",
        outcome.detail
    );
}

#[tokio::test]
async fn membership_change_is_reprogrammed() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 5)
        .await
        .unwrap();
    rig.fake.clear_requests();
    sm.apply(&node(&[G1], &[(0x0a12, Membership::Limited)]), 6)
        .await
        .unwrap();
    let log = rig.fake.requests();
    assert_eq!(log.len(), 3, "{:?}", calls(&log));
    assert_eq!(log[1].body.as_ref().unwrap()["membership"], "limited");
    assert_eq!(
        rig.fake.members(0x0a12),
        members(&[(G1, Membership::Limited)])
    );
}

#[tokio::test]
async fn release_removes_only_this_nodes_guids_with_the_action_form() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1, G2], &[(0x0a12, Membership::Full)]), 7)
        .await
        .unwrap();
    // Another node shares the partition.
    let mut p = rig.fake.partition(0x0a12).unwrap();
    p.members.insert(
        OTHER,
        FakeMember {
            membership: Membership::Full,
            index0: false,
        },
    );
    rig.fake.insert_partition(0x0a12, p);
    rig.fake.clear_requests();

    let outcome = sm.apply(&node(&[G1, G2], &[]), 8).await.unwrap();
    let log = rig.fake.requests();
    assert_eq!(
        calls(&log),
        [
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
            "POST /ufmRest/actions/remove_guids_from_pkey 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
    assert_eq!(
        log[1].body,
        Some(json!({"pkey": "0x0a12", "guids": ["0002c903000e0b72", "0002c903000e0b73"]}))
    );
    assert_eq!(
        rig.fake.members(0x0a12),
        members(&[(OTHER, Membership::Full)])
    );
    assert!(outcome.detail.contains("1 released"), "{}", outcome.detail);

    // Released keys are forgotten: the next apply asks nothing.
    rig.fake.clear_requests();
    sm.apply(&node(&[G1, G2], &[]), 9).await.unwrap();
    assert!(rig.fake.requests().is_empty());
}

#[tokio::test]
async fn removal_falls_back_to_the_delete_form_and_remembers_it() {
    let rig = Rig::new().await;
    rig.fake.set_quirks(Quirks {
        remove_action_gone: true,
        ..Quirks::default()
    });
    let sm = rig.sm();
    sm.apply(
        &node(
            &[G1, G2],
            &[(0x0a12, Membership::Full), (0x0b00, Membership::Full)],
        ),
        10,
    )
    .await
    .unwrap();
    rig.fake.clear_requests();
    sm.apply(&node(&[G1, G2], &[(0x0b00, Membership::Full)]), 11)
        .await
        .unwrap();
    let log = calls(&rig.fake.requests());
    assert!(
        log.contains(&"POST /ufmRest/actions/remove_guids_from_pkey 404".to_string()),
        "{log:?}"
    );
    assert!(
        log.contains(
            &"DELETE /ufmRest/resources/pkeys/0x0a12/guids/0002c903000e0b72,0002c903000e0b73 200"
                .to_string()
        ),
        "{log:?}"
    );
    assert!(rig.fake.members(0x0a12).is_empty());

    rig.fake.clear_requests();
    sm.apply(&node(&[G1, G2], &[]), 12).await.unwrap();
    let log = calls(&rig.fake.requests());
    assert_eq!(
        log,
        [
            "GET /ufmRest/resources/pkeys/0x0b00?guids_data=true 200",
            "DELETE /ufmRest/resources/pkeys/0x0b00/guids/0002c903000e0b72,0002c903000e0b73 200",
            "GET /ufmRest/resources/pkeys/0x0b00?guids_data=true 200",
        ],
        "the old form is not tried again"
    );
}

#[tokio::test]
async fn empty_object_answer_means_no_such_key() {
    let rig = Rig::new().await;
    rig.fake.set_quirks(Quirks {
        missing_key_empty_object: true,
        delete_emptied_partitions: true,
        ..Quirks::default()
    });
    let sm = rig.sm();
    sm.apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 13)
        .await
        .unwrap();
    sm.apply(&node(&[G1], &[]), 14).await.unwrap();
    assert!(
        rig.fake.partition(0x0a12).is_none(),
        "UFM dropped the emptied partition"
    );
    rig.fake.clear_requests();
    sm.apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 15)
        .await
        .unwrap();
    assert_eq!(
        calls(&rig.fake.requests()),
        [
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
            "POST /ufmRest/resources/pkeys 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
    assert_eq!(rig.fake.members(0x0a12), members(&[(G1, Membership::Full)]));
}

#[tokio::test]
async fn a_partition_ufm_dropped_is_recreated_while_desired() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    let desired = node(&[G1, G2], &[(0x0a12, Membership::Full)]);
    sm.apply(&desired, 16).await.unwrap();
    rig.fake.drop_partition(0x0a12);
    rig.fake.clear_requests();
    sm.apply(&desired, 17).await.unwrap();
    assert_eq!(
        calls(&rig.fake.requests()),
        [
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 404",
            "POST /ufmRest/resources/pkeys 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
    assert_eq!(
        rig.fake.members(0x0a12),
        members(&[(G1, Membership::Full), (G2, Membership::Full)])
    );
}

#[tokio::test]
async fn after_a_restart_keys_found_by_the_scan_are_released() {
    let rig = Rig::new().await;
    rig.fake.insert_partition(
        0x0a12,
        FakePartition {
            name: "other".into(),
            ip_over_ib: true,
            members: [(
                OTHER,
                FakeMember {
                    membership: Membership::Full,
                    index0: false,
                },
            )]
            .into(),
        },
    );
    rig.fake.insert_partition(
        0x7fff,
        FakePartition {
            name: "management".into(),
            ip_over_ib: true,
            members: [(
                G1,
                FakeMember {
                    membership: Membership::Full,
                    index0: false,
                },
            )]
            .into(),
        },
    );
    let before = rig.sm();
    before
        .apply(
            &node(
                &[G1, G2],
                &[(0x0010, Membership::Full), (0x0011, Membership::Limited)],
            ),
            18,
        )
        .await
        .unwrap();
    drop(before);

    // A new process with an empty store (no ledger) knows nothing but what UFM says.
    let after = UfmSm::new(&rig.config(), fresh_ledger()).unwrap();
    rig.fake.clear_requests();
    after
        .apply(&node(&[G1, G2], &[(0x0010, Membership::Full)]), 19)
        .await
        .unwrap();
    assert_eq!(
        calls(&rig.fake.requests()),
        [
            "GET /ufmRest/resources/pkeys?guids_data=true 200",
            "POST /ufmRest/actions/remove_guids_from_pkey 200",
            "GET /ufmRest/resources/pkeys/0x0011?guids_data=true 200",
        ]
    );
    assert!(rig.fake.members(0x0011).is_empty());
    assert_eq!(
        rig.fake.keys_of(G1),
        [(0x0010, Membership::Full), (0x7fff, Membership::Full)]
    );
    assert_eq!(
        rig.fake.members(0x0a12),
        members(&[(OTHER, Membership::Full)])
    );
}

#[tokio::test]
async fn a_burst_of_503_is_retried() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    rig.fake.fail_next(2);
    sm.apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 20)
        .await
        .unwrap();
    assert_eq!(
        calls(&rig.fake.requests()),
        [
            "GET /ufmRest/resources/pkeys?guids_data=true 503",
            "GET /ufmRest/resources/pkeys?guids_data=true 503",
            "GET /ufmRest/resources/pkeys?guids_data=true 200",
            "POST /ufmRest/resources/pkeys 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
}

#[tokio::test]
async fn endless_503_is_unavailable_after_the_configured_retries() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    rig.fake.outage_503(Duration::from_secs(30));
    let err = sm
        .apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 21)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("503"), "{err}");
    assert_eq!(rig.fake.request_count(), 4, "1 attempt + 3 retries");
}

/// Why UFM gave no usable answer to a failed apply.
fn no_answer(err: &SmError) -> &NoAnswer {
    match err {
        SmError::Unreachable(SmFailure::Ufm(UfmError::NoAnswer(e))) => e,
        other => panic!("expected no answer from UFM, got {other:?}"),
    }
}

/// The UFM failure of a refused apply.
fn ufm_refusal(err: &SmError) -> &UfmError {
    match err {
        SmError::Refused(SmFailure::Ufm(e)) => e,
        other => panic!("expected a UFM refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_4xx_is_refused_at_once() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    rig.fake.inject_status(1, 400);
    let err = sm
        .apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 22)
        .await
        .unwrap_err();
    assert!(
        matches!(ufm_refusal(&err), UfmError::Refused { status, text, .. }
            if *status == 400 && text.contains("injected 400")),
        "UFM's code and words are kept: {err:?}"
    );
    assert_eq!(rig.fake.request_count(), 1, "no retry on 4xx");
}

#[tokio::test]
async fn wrong_credentials_stop_calls_until_the_file_changes() {
    let rig = Rig::new().await;
    std::fs::write(&rig.cred, "admin:not-the-password\n").unwrap();
    let sm = rig.sm();
    let desired = node(&[G1], &[(0x0a12, Membership::Full)]);
    let err = sm.apply(&desired, 23).await.unwrap_err();
    assert!(
        matches!(ufm_refusal(&err), UfmError::CredentialsRejected { status, source_file }
            if *status == 401 && *source_file == rig.cred),
        "names the status and the file: {err:?}"
    );
    assert_eq!(rig.fake.request_count(), 1);

    for _ in 0..3 {
        let again = sm.apply(&desired, 24).await.unwrap_err();
        assert!(
            matches!(ufm_refusal(&again), UfmError::CredentialsRejected { status, source_file }
                if *status == 401 && *source_file == rig.cred),
            "{again:?}"
        );
    }
    assert_eq!(
        rig.fake.request_count(),
        1,
        "no call with known-bad credentials"
    );

    std::fs::write(&rig.cred, format!("admin:{PASSWORD}\n")).unwrap();
    sm.apply(&desired, 25).await.unwrap();
    assert_eq!(rig.fake.members(0x0a12), members(&[(G1, Membership::Full)]));
}

fn assert_secret_free(text: &str) {
    assert!(!text.contains(PASSWORD), "credential leaked: {text}");
    assert!(
        !text.contains("not-the-password"),
        "credential leaked: {text}"
    );
    // base64("admin:" + ...) would start like this.
    assert!(
        !text.contains("YWRtaW46"),
        "encoded credential leaked: {text}"
    );
}

#[tokio::test]
async fn credentials_never_appear_in_errors_or_debug_output() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    assert_secret_free(&format!("{sm:?}"));
    let desired = node(&[G1], &[(0x0a12, Membership::Full)]);
    let mut errors = Vec::new();

    // A refusal with a body.
    rig.fake.inject_status(1, 418);
    errors.push(sm.apply(&desired, 26).await.unwrap_err());
    // Outage.
    rig.fake.outage_503(Duration::from_secs(30));
    errors.push(sm.apply(&desired, 27).await.unwrap_err());
    rig.fake.outage_503(Duration::ZERO);
    // Wrong password, and again while refused.
    std::fs::write(&rig.cred, "admin:not-the-password\n").unwrap();
    errors.push(sm.apply(&desired, 28).await.unwrap_err());
    errors.push(sm.apply(&desired, 29).await.unwrap_err());
    // Unreadable credentials line.
    std::fs::write(&rig.cred, format!("{PASSWORD}\n")).unwrap();
    errors.push(sm.apply(&desired, 30).await.unwrap_err());

    for e in &errors {
        assert_secret_free(&e.to_string());
        assert_secret_free(&format!("{e:?}"));
    }
    assert_secret_free(&format!("{sm:?}"));
    assert_secret_free(&format!("{:?}", rig.config()));
}

#[tokio::test]
async fn a_token_echoed_by_the_server_is_redacted() {
    let fake = FakeUfm::start_with(FakeAuth::Token {
        scheme: "Basic".into(),
        token: "tok-9f8e7d6c".into(),
    })
    .await;
    fake.set_echo_auth(true);
    fake.inject_status(1, 400);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "tok-9f8e7d6c\n").unwrap();
    let mut config = UfmConfig::with_credentials_file(fake.url(), PathBuf::new());
    config.credentials_file = None;
    config.token_file = Some(token);
    // The injected 400 must meet a partition read (a 400 to the stamp read only turns
    // skipping off).
    config.max_skipped_rechecks = 0;
    let sm = UfmSm::new(&config, fresh_ledger()).unwrap();
    let err = sm
        .apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 31)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("<redacted>"),
        "the echo reached the message, redacted: {text}"
    );
    assert!(!text.contains("tok-9f8e7d6c"), "{text}");
}

#[tokio::test]
async fn token_authentication_uses_ufm_rest_v3() {
    for (scheme, word) in [
        (TokenScheme::Basic, "Basic"),
        (TokenScheme::Bearer, "Bearer"),
    ] {
        let fake = FakeUfm::start_with(FakeAuth::Token {
            scheme: word.into(),
            token: "tok-abc123".into(),
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok-abc123\n").unwrap();
        let mut config = UfmConfig::with_credentials_file(fake.url(), PathBuf::new());
        config.credentials_file = None;
        config.token_file = Some(token);
        config.token_scheme = scheme;
        let sm = UfmSm::new(&config, fresh_ledger()).unwrap();
        sm.apply(&node(&[G1], &[(0x0a12, Membership::Full)]), 32)
            .await
            .unwrap();
        let log = fake.requests();
        assert!(
            log.iter().all(|r| r.path.starts_with("/ufmRestV3/")),
            "{:?}",
            calls(&log)
        );
        assert!(log.iter().all(|r| r.status == 200), "{:?}", calls(&log));
    }
}

#[tokio::test]
async fn connection_refused_is_unavailable_then_recovers() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    let desired = node(&[G1], &[(0x0a12, Membership::Full)]);
    rig.fake.outage_refused(Duration::from_millis(400)).await;
    let started = Instant::now();
    let err = sm.apply(&desired, 33).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        matches!(no_answer(&err), NoAnswer::Transport { source, .. } if source.is_connect()),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "fails fast: {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    sm.apply(&desired, 34).await.unwrap();
    assert_eq!(rig.fake.members(0x0a12), members(&[(G1, Membership::Full)]));
}

#[tokio::test]
async fn a_slow_ufm_times_out_then_recovers() {
    let rig = Rig::new().await;
    let mut config = rig.config();
    config.request_timeout_ms = 100;
    config.retries = 1;
    let sm = UfmSm::new(&config, fresh_ledger()).unwrap();
    let desired = node(&[G1], &[(0x0a12, Membership::Full)]);
    rig.fake.set_delay(Duration::from_millis(300));
    let err = sm.apply(&desired, 35).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        matches!(no_answer(&err), NoAnswer::Transport { source, attempts: 2, .. } if source.is_timeout()),
        "{err:?}"
    );
    rig.fake.set_delay(Duration::ZERO);
    sm.apply(&desired, 36).await.unwrap();
}

#[tokio::test]
async fn membership_changes_are_reported_to_subscribers() {
    let rig = Rig::new().await;
    let mut changes = rig.fake.subscribe();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    rig.fake.on_change(Duration::from_millis(20), move |c| {
        sink.lock().unwrap().push(c.clone())
    });
    let sm = rig.sm();
    sm.apply(&node(&[G1, G2], &[(0x0a12, Membership::Full)]), 37)
        .await
        .unwrap();
    let change = tokio::time::timeout(Duration::from_secs(2), changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(change.pkey, 0x0a12);
    assert_eq!(change.guid_keys[&G1], [(0x0a12, Membership::Full)]);
    assert_eq!(change.guid_keys[&G2], [(0x0a12, Membership::Full)]);
    assert_eq!(seen.lock().unwrap().len(), 1, "the callback ran too");
    sm.apply(&node(&[G1, G2], &[]), 38).await.unwrap();
    let change = tokio::time::timeout(Duration::from_secs(2), changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(change.guid_keys[&G1].is_empty());
}

#[tokio::test]
async fn keys_without_ports_are_refused_and_nothing_is_sent() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    let err = sm
        .apply(&node(&[], &[(0x0a12, Membership::Full)]), 39)
        .await
        .unwrap_err();
    assert!(matches!(err, SmError::Refused(_)), "{err:?}");
    sm.apply(&node(&[], &[]), 40).await.unwrap();
    assert_eq!(rig.fake.request_count(), 0);
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test]
async fn constructor_checks_config_and_certificate_files() {
    let rig = Rig::new().await;
    let mut bad = rig.config();
    bad.url = "http://ufm.example.net".into();
    let err = UfmSm::new(&bad, fresh_ledger()).unwrap_err();
    assert!(
        matches!(
            ufm_refusal(&err),
            UfmError::Config(UfmConfigError::PlainHttp(_))
        ),
        "{err:?}"
    );

    let cert = rcgen::generate_simple_self_signed(vec!["agent.example".into()]).unwrap();
    let dir = rig.dir.path();
    let mut c = rig.config();
    c.credentials_file = None;
    c.client_cert = Some(write(dir, "agent.pem", &cert.cert.pem()));
    c.client_key = Some(write(dir, "agent.key", &cert.signing_key.serialize_pem()));
    c.ca_file = Some(write(dir, "ca.pem", &cert.cert.pem()));
    let sm = UfmSm::new(&c, fresh_ledger()).unwrap();
    assert!(format!("{sm:?}").contains("/ufmRestV2"));
    assert!(!format!("{sm:?}").contains("PRIVATE KEY"));

    c.client_key = Some(write(dir, "garbage.key", "not a key"));
    let err = UfmSm::new(&c, fresh_ledger()).unwrap_err();
    assert!(
        matches!(ufm_refusal(&err), UfmError::BadFile { what: "client_key", path, .. }
            if path.ends_with("garbage.key")),
        "{err:?}"
    );
    c.client_key = Some(write(dir, "agent.key", &cert.signing_key.serialize_pem()));
    c.ca_file = Some(write(dir, "empty-ca.pem", "nothing here"));
    let err = UfmSm::new(&c, fresh_ledger()).unwrap_err();
    assert!(
        matches!(ufm_refusal(&err), UfmError::BadFile { what: "ca_file", path, .. } | UfmError::CaBundle { path, .. }
            if path.ends_with("empty-ca.pem")),
        "{err:?}"
    );
}

#[tokio::test]
async fn guids_of_a_replaced_port_are_removed() {
    const G3: u64 = 0x0002_c903_000e_0b99;
    let rig = Rig::new().await;
    let sm = rig.sm();
    sm.apply(&node(&[G1, G2], &[(0x0a12, Membership::Full)]), 41)
        .await
        .unwrap();
    rig.fake.clear_requests();
    // The HCA behind G2 was replaced by one with G3.
    sm.apply(&node(&[G1, G3], &[(0x0a12, Membership::Full)]), 42)
        .await
        .unwrap();
    let log = rig.fake.requests();
    assert_eq!(
        calls(&log),
        [
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
            "POST /ufmRest/resources/pkeys 200",
            "POST /ufmRest/actions/remove_guids_from_pkey 200",
            "GET /ufmRest/resources/pkeys/0x0a12?guids_data=true 200",
        ]
    );
    assert_eq!(
        log[1].body.as_ref().unwrap()["guids"],
        json!(["0002c903000e0b99"])
    );
    assert_eq!(
        log[2].body.as_ref().unwrap()["guids"],
        json!(["0002c903000e0b73"])
    );
    assert_eq!(
        rig.fake.members(0x0a12),
        members(&[(G1, Membership::Full), (G3, Membership::Full)])
    );
}

#[tokio::test]
async fn forbidden_counts_as_rejected_credentials() {
    let rig = Rig::new().await;
    let sm = rig.sm();
    rig.fake.inject_status(1, 403);
    let desired = node(&[G1], &[(0x0a12, Membership::Full)]);
    let err = sm.apply(&desired, 43).await.unwrap_err();
    for err in [err, sm.apply(&desired, 44).await.unwrap_err()] {
        assert!(
            matches!(ufm_refusal(&err), UfmError::CredentialsRejected { status, .. } if *status == 403),
            "{err:?}"
        );
    }
    assert_eq!(rig.fake.request_count(), 1);
}

#[tokio::test]
async fn a_change_ufm_did_not_make_fails_the_read_back() {
    let rig = Rig::new().await;
    rig.fake.set_quirks(Quirks {
        ignore_writes: true,
        ..Quirks::default()
    });
    let sm = rig.sm();
    let desired = node(&[G1, G2], &[(0x0a12, Membership::Full)]);
    let err = sm.apply(&desired, 45).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        err.to_string()
            .contains("reading it back shows 2 GUID(s) still to add"),
        "{err}"
    );
    rig.fake.set_quirks(Quirks::default());
    sm.apply(&desired, 46).await.unwrap();
    assert_eq!(rig.fake.members(0x0a12).len(), 2);
}

#[tokio::test]
async fn the_startup_scan_is_retried_until_it_succeeds() {
    let rig = Rig::new().await;
    rig.fake.insert_partition(
        0x0011,
        FakePartition {
            name: "left over".into(),
            ip_over_ib: true,
            members: [(
                G1,
                FakeMember {
                    membership: Membership::Full,
                    index0: false,
                },
            )]
            .into(),
        },
    );
    let sm = rig.sm();
    rig.fake.outage_503(Duration::from_secs(30));
    assert!(sm
        .apply(&node(&[G1], &[]), 47)
        .await
        .unwrap_err()
        .is_transient());
    rig.fake.outage_503(Duration::ZERO);
    rig.fake.clear_requests();
    sm.apply(&node(&[G1], &[]), 48).await.unwrap();
    let log = calls(&rig.fake.requests());
    assert_eq!(log[0], "GET /ufmRest/resources/pkeys?guids_data=true 200");
    assert!(rig.fake.members(0x0011).is_empty(), "{log:?}");
}
