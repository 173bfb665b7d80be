//! A snapshot of a *running* node agent put back (what reverting a VM snapshot does), on an
//! ibsim fabric with a real OpenSM, polled with `smpquery`: the state directory is copied while
//! the agent serves (SIGSTOP, copy, SIGCONT), the tenant is released (RELEASED, key off the
//! port), the agent is SIGKILLed and the copy put back. The copy's next generation lies in the
//! same reserved block, above everything the SM host holds, so only the node's start check
//! (what the SM host stores against the last acknowledgement the copy recorded) can see that
//! the store went back: the released key must never return to the port, the log must start a
//! new epoch above every seq handed out, and the control plane's release sent again must
//! converge. Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::{attach, attach_now, free_port, get, has_base, node, partition, release, state};
use common::{current_log, wait_until, CONVERGE};
use fabric_agent::proto::agent as pb;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rig::agents::{node_config, sm_config, Agent};
use rig::{Fabric, FabricSpec};
use std::time::{Duration, Instant};

const OPERATOR: &str = "# operator's partitions\n\
Default=0x7fff : ALL=limited, SELF=full ;\n";

/// The tenant's key, released after the snapshot.
const KEY_A: u16 = 0x0a71;
/// How often and how long the port is read after the snapshot is put back.
const POLL: Duration = Duration::from_millis(50);
const WATCH: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_nodes_snapshot_put_back_never_puts_a_released_key_back() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let port = free_port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let mut n1 = Agent::start(&fabric, "node1", &node_config(&fabric, "node1", port));
    let mut c = n1.client().await;
    let a = partition("ibpart_a", KEY_A.into());
    let a = attach_now(&mut c, attach("tenant-a", a, Some(20_000))).await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    assert!(has_base(&fabric.pkeys("node1"), KEY_A));

    // The snapshot: the agent frozen while it serves, its state directory copied, thawed.
    let dir = fabric.dir().join("node1-state");
    let copy = fabric.dir().join("node1-state-snapshot");
    let pid = Pid::from_raw(i32::try_from(n1.pid()).expect("pid"));
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    common::copy_tree(&dir, &copy);
    kill(pid, Signal::SIGCONT).expect("SIGCONT");

    // The tenant is released: RELEASED, the key off the port; the control plane followed the
    // log up to here.
    let r = release(&mut c, "tenant-a", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    assert!(!has_base(&fabric.pkeys("node1"), KEY_A));
    let (followed, _) = current_log(&mut c).await;
    assert!(followed.last_event_seq > 0);

    // The snapshot is reverted: the agent dies and comes back on the copy.
    n1.crash();
    std::fs::remove_dir_all(&dir).expect("state dir removed");
    common::copy_tree(&copy, &dir);
    n1.spawn(&fabric);

    // The released key never returns to the port.
    let start = Instant::now();
    let mut reads = 0;
    while start.elapsed() < WATCH {
        let keys = fabric.pkeys("node1");
        reads += 1;
        assert!(
            !has_base(&keys, KEY_A),
            "the key released after the snapshot is back on the port after {:?} ({reads} reads): {keys:x?}",
            start.elapsed()
        );
        tokio::time::sleep(POLL).await;
    }
    eprintln!("smpquery reads of node1's port without the released key: {reads} in {WATCH:?}");

    // A new log epoch, starting above every seq the control plane saw; the rollback raised.
    let mut c = n1.client().await;
    let (after, events) = current_log(&mut c).await;
    assert_ne!(after.log_epoch, followed.log_epoch, "a new log epoch");
    assert!(
        after.first_event_seq > followed.last_event_seq,
        "seqs reused: the new log starts at {} after the followed {}",
        after.first_event_seq,
        followed.last_event_seq
    );
    assert!(
        events.iter().all(|e| e.seq > followed.last_event_seq),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(&e.kind,
            Some(pb::event::Kind::ConditionChanged(cc)) if cc.active
                && cc.condition.as_ref().is_some_and(|k| k.kind == "STORE_ROLLED_BACK"
                    && k.detail.contains("the store lost writes")))),
        "{events:?}"
    );
    // The restored attachment is withheld, with a reason.
    let a = get(&mut c, "tenant-a").await;
    assert_eq!(state(&a), pb::AttachmentState::Pending, "{a:?}");
    assert!(a.reason.contains("withheld"), "{a:?}");

    // The control plane sends its release again: it converges.
    let r = release(&mut c, "tenant-a", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    assert!(!has_base(&fabric.pkeys("node1"), KEY_A));
    wait_until("RESTORED_UNCONFIRMED cleared", CONVERGE, || {
        let mut c = c.clone();
        async move {
            !node(&mut c)
                .await
                .conditions
                .iter()
                .any(|k| k.kind == "RESTORED_UNCONFIRMED")
        }
    })
    .await;
    assert!(n1.stop().success());
    assert!(sm.stop().success());
}

/// The stored set's keys (P_Key bases) the SM host at `port` holds for node1.
async fn held_by_sm_host(port: u16) -> Vec<u32> {
    use fabric_agent::proto::sm::partitions_client::PartitionsClient;
    use fabric_agent::proto::sm::GetNodeMembershipsRequest;
    let mut sm = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("SM host");
    sm.get_node_memberships(GetNodeMembershipsRequest {
        node_id: "node1".into(),
    })
    .await
    .expect("node1's stored set")
    .into_inner()
    .keys
    .iter()
    .map(|k| k.pkey)
    .collect()
}

/// A node that restarts with one of its SM hosts silent adds no key until the start check's
/// bound (30 s): a new tenant's key reaches neither the answering SM host nor the port; after
/// the bound the condition START_CHECK_INCOMPLETE names the silent host and the key goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sm_host_holds_every_add_until_the_start_checks_bound() {
    const KEY_B: u16 = 0x0a72;
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let port = free_port();
    let silent = free_port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let config = node_config(&fabric, "node1", port);
    let mut n1 = Agent::start(&fabric, "node1", &config);
    let mut c = n1.client().await;
    let a = partition("ibpart_a", KEY_A.into());
    let a = attach_now(&mut c, attach("tenant-a", a, Some(20_000))).await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    let r = release(&mut c, "tenant-a", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");

    // Restarted with a second SM host that does not answer.
    assert!(n1.stop().success());
    let one = format!("endpoint = \"http://127.0.0.1:{port}\"");
    assert!(config.contains(&one), "{config}");
    let two = format!("endpoints = [\"http://127.0.0.1:{port}\", \"http://127.0.0.1:{silent}\"]");
    std::fs::write(fabric.dir().join("node1.toml"), config.replace(&one, &two)).unwrap();
    let started = Instant::now();
    n1.spawn(&fabric);
    let mut c = n1.client().await;
    let b = partition("ibpart_b", KEY_B.into());
    c.attach_partition(attach("tenant-b", b, None))
        .await
        .expect("attach tenant-b");

    // The add does not go out until the bound.
    let mut reads = 0;
    while started.elapsed() < Duration::from_secs(25) {
        let keys = fabric.pkeys("node1");
        assert!(
            !has_base(&keys, KEY_B),
            "a key added while an SM host has not answered the start check is on the port after {:?}",
            started.elapsed()
        );
        let held = held_by_sm_host(port).await;
        assert!(!held.contains(&u32::from(KEY_B)), "{held:x?}");
        reads += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("port and SM host read {reads} times in 25 s without the held-back key");
    let b = get(&mut c, "tenant-b").await;
    assert_eq!(state(&b), pb::AttachmentState::Pending, "{b:?}");
    assert!(
        b.reason.contains("start check") && b.reason.contains(&format!("127.0.0.1:{silent}")),
        "the wait says why: {b:?}"
    );

    // After the bound: the condition names the silent host, and the add goes out.
    wait_until(
        "START_CHECK_INCOMPLETE names the silent host",
        CONVERGE,
        || {
            let mut c = c.clone();
            let silent = format!("127.0.0.1:{silent}");
            async move {
                node(&mut c)
                    .await
                    .conditions
                    .iter()
                    .any(|k| k.kind == "START_CHECK_INCOMPLETE" && k.detail.contains(&silent))
            }
        },
    )
    .await;
    assert!(started.elapsed() >= Duration::from_secs(30));
    wait_until("tenant-b's key on the port", CONVERGE, || async {
        has_base(&fabric.pkeys("node1"), KEY_B)
    })
    .await;
    assert!(n1.stop().success());
    assert!(sm.stop().success());
}
