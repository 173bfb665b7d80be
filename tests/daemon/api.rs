//! The daemon over its unix socket: the attachment life cycle, idempotency and every rejection.

use testkit::common;

use common::*;
use fabric_agent::proto::agent as pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_goes_active_and_release_goes_released_idempotently() {
    let d = Daemon::start("");
    let mut c = d.client().await;
    let r = c
        .attach_partition(attach("i-1", partition("ibpart_a", 0x12), Some(5000)))
        .await
        .unwrap()
        .into_inner();
    assert!(r.created);
    let a = r.attachment.unwrap();
    assert_eq!(state(&a), pb::AttachmentState::Active);
    assert_eq!(a.pkey_value, 0x8012);
    let node = common::node(&mut c).await;
    assert!(
        node.ports.iter().all(|p| p.pkeys.contains(&0x8012)),
        "{:?}",
        node.ports
    );
    assert_eq!(node.attachment_counts["ACTIVE"], 1);

    let again = c
        .attach_partition(attach("i-1", partition("ibpart_a", 0x12), None))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created, "re-attach is idempotent");
    assert_eq!(
        state(&again.attachment.unwrap()),
        pb::AttachmentState::Active
    );

    let rel = c
        .release_instance(release_request("i-1", Some(5000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state(&rel.attachment.unwrap()),
        pb::AttachmentState::Released
    );
    let node = common::node(&mut c).await;
    assert!(node
        .ports
        .iter()
        .all(|p| !p.pkeys.iter().any(|k| k & 0x7fff == 0x12)));
    let before = node.last_event_seq;
    let rel2 = c
        .release_instance(release_request("i-1", None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state(&rel2.attachment.unwrap()),
        pb::AttachmentState::Released
    );
    let after = c
        .get_node(pb::GetNodeRequest {})
        .await
        .unwrap()
        .into_inner()
        .last_event_seq;
    assert_eq!(before, after, "re-release records nothing");

    let evs = events(&mut c, 0).await;
    assert_gap_free(&evs);
    let states: Vec<i32> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::AttachmentChanged(a)) => Some(a.to),
            _ => None,
        })
        .collect();
    use pb::AttachmentState::*;
    assert_eq!(
        states,
        [Pending, Programming, Active, Releasing, Released]
            .map(|s| s as i32)
            .to_vec()
    );
    let list = c
        .list_attachments(pb::ListAttachmentsRequest {
            state: Some(Released as i32),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.attachments.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_have_clear_codes_and_persist_nothing() {
    // Three slots per port: the default partition plus two tenant keys.
    let d = Daemon::start("[subnet_manager.embedded]\npkey_table_size = 3\n");
    let mut c = d.client().await;
    // One partition per port: a on port 1, b on port 2.
    let on = |i: &str, id: &str, pkey: u32, port: &str| {
        attach_on(i, partition(id, pkey), &[port], Some(5000))
    };
    attach_now(&mut c, on("i-1", "ibpart_a", 0x12, "sim0/1")).await;
    attach_now(&mut c, on("i-9", "ibpart_b", 0x13, "sim0/2")).await;
    attach_now(&mut c, on("i-gone", "ibpart_b", 0x13, "sim0/2")).await;
    release(&mut c, "i-gone", None).await;
    let node = common::node(&mut c).await;
    let count = |c: &pb::GetNodeResponse| c.attachment_counts.values().sum::<u64>();
    let (seq, n) = (node.last_event_seq, count(&node));

    let mut other_fabric = partition("ibpart_c", 0x20);
    other_fabric.fabric = "fab2".into();
    let mut bad_id = partition("ibpart_c", 0x20);
    bad_id.id = "part_c".into();
    let mut empty_name = partition("ibpart_c", 0x20);
    empty_name.name = String::new();
    let mut long_ws = partition("ibpart_c", 0x20);
    long_ws.workspace = "w".repeat(64);
    let cases: Vec<(pb::AttachPartitionRequest, Code, &str)> = vec![
        (
            attach("i-2", partition("ibpart_c", 0), None),
            Code::InvalidArgument,
            "0x0000",
        ),
        (
            attach("i-2", partition("ibpart_c", 0x7fff), None),
            Code::InvalidArgument,
            "default partition",
        ),
        (
            attach("i-2", partition("ibpart_c", 0x8012), None),
            Code::InvalidArgument,
            "above 0x7fff",
        ),
        (
            attach("i-2", bad_id, None),
            Code::InvalidArgument,
            "partition.id",
        ),
        (
            attach("i-2", empty_name, None),
            Code::InvalidArgument,
            "partition.name",
        ),
        (
            attach("i-2", long_ws, None),
            Code::InvalidArgument,
            "partition.workspace",
        ),
        (
            attach("", partition("ibpart_c", 0x20), None),
            Code::InvalidArgument,
            "instance_id",
        ),
        (
            attach("i 2", partition("ibpart_c", 0x20), None),
            Code::InvalidArgument,
            "instance_id",
        ),
        (
            attach("i-2", other_fabric, None),
            Code::FailedPrecondition,
            "WRONG_FABRIC",
        ),
        (
            attach("i-1", partition("ibpart_c", 0x20), None),
            Code::FailedPrecondition,
            "INSTANCE_IN_OTHER_PARTITION",
        ),
        (
            attach("i-1", partition("ibpart_a", 0x21), None),
            Code::AlreadyExists,
            "INSTANCE_KEY_DIFFERS",
        ),
        (
            attach("i-3", partition("ibpart_a", 0x21), None),
            Code::AlreadyExists,
            "PARTITION_KEY_DIFFERS",
        ),
        (
            attach("i-3", partition("ibpart_z", 0x12), None),
            Code::FailedPrecondition,
            "KEY_HELD_BY_OTHER_PARTITION",
        ),
        (
            attach_on("i-gone", partition("ibpart_b", 0x13), &["sim0/2"], None),
            Code::FailedPrecondition,
            "INSTANCE_RELEASED",
        ),
        (
            // Every port carries another partition already.
            attach("i-4", partition("ibpart_d", 0x30), None),
            Code::FailedPrecondition,
            "PORT_HELD_BY_OTHER_PARTITION",
        ),
        (
            attach("i-2", partition("ibpart_c", 0x20), Some(600_001)),
            Code::InvalidArgument,
            "wait_ms",
        ),
    ];
    for (req, code, needle) in cases {
        let what = format!("{req:?}");
        let err = c.attach_partition(req).await.expect_err(&what);
        assert_eq!(err.code(), code, "{what}: {}", err.message());
        let reason = err
            .metadata()
            .get("fabric-error-reason")
            .and_then(|v| v.to_str().ok());
        if code == Code::InvalidArgument {
            // The field and the rule it broke are only in the message.
            assert_eq!(reason, Some("INVALID"), "{what}");
            assert!(
                err.message().contains(needle),
                "{what}: message {:?} lacks {needle:?}",
                err.message()
            );
        } else {
            assert_eq!(reason, Some(needle), "{what}: {}", err.message());
        }
    }
    let mut limited = attach("i-1", partition("ibpart_a", 0x12), None);
    limited.membership = pb::Membership::Limited as i32;
    assert_eq!(
        c.attach_partition(limited).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    let nf = c
        .release_instance(pb::ReleaseInstanceRequest {
            instance_id: "nobody".into(),
            wait_ms: None,
        })
        .await
        .unwrap_err();
    assert_eq!(nf.code(), Code::NotFound);
    let bad = c
        .release_instance(pb::ReleaseInstanceRequest {
            instance_id: "a/b".into(),
            wait_ms: None,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(
        c.get_attachment(pb::GetAttachmentRequest {
            instance_id: "nobody".into()
        })
        .await
        .unwrap_err()
        .code(),
        Code::NotFound
    );

    let node = common::node(&mut c).await;
    assert_eq!(node.last_event_seq, seq, "a rejection must record no event");
    assert_eq!(count(&node), n, "a rejection must persist no attachment");
}

#[test]
fn a_bad_config_exits_64_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "fabric = \"fab1\"\nbogus = true\n").unwrap();
    for sub in ["serve", "check-config"] {
        let out = std::process::Command::new(BIN)
            .arg("--config")
            .arg(&cfg)
            .arg(sub)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{sub}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("bogus"), "{sub}: {err}");
    }
    std::fs::write(
        &cfg,
        "fabric = \"fab1\"\n[listen]\ntcp = \"0.0.0.0:1\"\ninsecure_plaintext_for_tests = true\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_subnet_manager_never_yields_a_false_state() {
    let d = Daemon::start_with_fault(
        None,
        "",
        "[reconciler]\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n",
    );
    let fault = d.fault_file();
    let mut c = d.client().await;
    attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;

    std::fs::write(&fault, "unreachable").unwrap();
    let r = c
        .release_instance(release_request("i-1", Some(1500)))
        .await
        .unwrap()
        .into_inner();
    let a = r.attachment.unwrap();
    assert_eq!(
        state(&a),
        pb::AttachmentState::Releasing,
        "no RELEASED while the SM cannot remove the key"
    );
    assert!(
        a.reason.contains("unavailable"),
        "reason shows the SM error: {:?}",
        a.reason
    );
    // A new tenant on the ports of a partition not yet RELEASED is refused.
    let e = c
        .attach_partition(attach("i-2", partition("ibpart_b", 0x13), Some(1000)))
        .await
        .expect_err("ports still carry ibpart_a");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("i-1"), "{}", e.message());
    let node = common::node(&mut c).await;
    let sm = node.subnet_manager.unwrap();
    assert!(!sm.reachable && sm.last_error.contains("outage"), "{sm:?}");

    std::fs::write(&fault, "").unwrap();
    let a = release(&mut c, "i-1", Some(5000)).await;
    assert_eq!(state(&a), pb::AttachmentState::Released);
    assert!(a.reason.is_empty());
    let b = c
        .attach_partition(attach("i-2", partition("ibpart_b", 0x13), Some(5000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&b.attachment.unwrap()), pb::AttachmentState::Active);
    let evs = events(&mut c, 0).await;
    let sm_events: Vec<bool> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::SubnetManagerChanged(s)) => Some(s.reachable),
            _ => None,
        })
        .collect();
    assert_eq!(
        sm_events,
        vec![false, true],
        "one event when lost, one when back"
    );
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: nix::unistd::Pid) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_change_leaves_the_reconciler_idle() {
    let d = Daemon::start_with_fault(
        None,
        "",
        "[reconciler]\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n",
    );
    let fault = d.fault_file();
    let mut c = d.client().await;
    // The SM fails the attach's apply, then the release withdraws the change before any retry
    // succeeds: nothing is left to apply, so nothing may keep the loop spinning.
    std::fs::write(&fault, "unreachable").unwrap();
    attach_now(
        &mut c,
        attach("i-1", partition("ibpart_a", 0x12), Some(300)),
    )
    .await;
    release(&mut c, "i-1", Some(2000)).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before = cpu_seconds(d.pid());
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let used = cpu_seconds(d.pid()) - before;
    assert!(
        used < 0.2,
        "the daemon used {used:.2} CPU seconds in 2 s while idle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_key_is_released_only_when_its_last_instance_leaves() {
    let d = Daemon::start("");
    let mut c = d.client().await;
    attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;
    attach_waiting(&mut c, "i-2", "ibpart_a", 0x12).await;
    // i-1 is terminated, but i-2 on this node still needs the key: the ports keep it, so
    // reporting i-1 RELEASED would be false.
    let r = c
        .release_instance(release_request("i-1", Some(1000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state(&r.attachment.unwrap()),
        pb::AttachmentState::Releasing
    );
    let node = common::node(&mut c).await;
    assert!(node.ports.iter().all(|p| p.pkeys.contains(&0x8012)));
    release(&mut c, "i-2", Some(5000)).await;
    for id in ["i-1", "i-2"] {
        let a = get(&mut c, id).await;
        assert_eq!(state(&a), pb::AttachmentState::Released, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_attachments_are_pruned_on_time_not_only_at_resync() {
    // Kept listed for 1 s after RELEASED; the resync (which also prunes) is 300 s away; other
    // attachments come and go all the while.
    let d = Daemon::start("[events]\nreleased_retain_secs = 1\n[reconciler]\nresync_secs = 300\n");
    let mut c = d.client().await;
    attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;
    let r = c
        .release_instance(release_request("i-1", Some(5000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&r.attachment.unwrap()), pb::AttachmentState::Released);
    let released = std::time::Instant::now();
    // Keep the reconciler busy meanwhile: a loop that wakes again and again must still prune.
    let mut busy = 0u32;
    let gone = loop {
        busy += 1;
        let other = format!("busy-{busy}");
        c.attach_partition(attach(&other, partition("ibpart_b", 0x13), Some(5000)))
            .await
            .unwrap();
        c.release_instance(pb::ReleaseInstanceRequest {
            instance_id: other,
            wait_ms: Some(5000),
        })
        .await
        .unwrap();
        let found = c
            .get_attachment(pb::GetAttachmentRequest {
                instance_id: "i-1".into(),
            })
            .await;
        match found {
            Err(s) if s.code() == tonic::Code::NotFound => break released.elapsed(),
            Ok(_) if released.elapsed() < std::time::Duration::from_secs(10) => {}
            other => panic!("still listed after {:?}: {other:?}", released.elapsed()),
        }
    };
    assert!(
        gone >= std::time::Duration::from_millis(900),
        "pruned before its retention: {gone:?}"
    );
}
