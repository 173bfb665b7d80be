//! Adding and removing an SM host without restarting a node, on ibsim with two real OpenSMs
//! (priorities 15 and 10, polling 1 s x 2): the rig's own OpenSM with its agent (`smhost`,
//! `[subnet_manager.opensm_ha]` with no peers yet) and a node agent (node1) sending to it alone;
//! a second OpenSM runs on node3 as standby. Every change is a config edit and a SIGHUP:
//! 1. Adding `smhost2` in the documented order: its agent starts with smhost as its peer and
//!    catches up; smhost's peers gain it (SIGHUP): a release on node1, whose `endpoints` still
//!    lack smhost2, is not RELEASED (`SM_HOST_SET_INCOMPLETE` names smhost2); node1's
//!    `endpoints` gain it (SIGHUP) while smhost2's agent is down: still not RELEASED, the reason
//!    names smhost2's endpoint; smhost2's agent back: RELEASED once it acknowledged.
//! 2. Removing it: node1's `endpoints` dropped first (the wrong order) never make a release
//!    RELEASED while smhost still names smhost2; smhost refuses to drop a peer it does not hold
//!    fenced (SIGHUP refused, peers kept); in the documented order (stop smhost2's OpenSM and
//!    agent, smhost fences it on SMInfo, smhost's peers then node1's `endpoints` edited, SIGHUP
//!    each) attaches and releases go on with smhost alone.
//!
//! Throughout, a RELEASED is checked against every running OpenSM's partitions file: none holds
//! the released key. Without the reload (SIGHUP re-reading neither `endpoints` nor `peers`) step
//! 1 fails: node1 never sends to smhost2 and its release never ends. Skipped when ibsim/OpenSM
//! are not installed.

use testkit::common;
use testkit::rig;

use common::{attach, attach_now, free_port, get, has_base, partition, release, state, wait_until};
use fabric_agent::proto::agent as pb;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rig::agents::Agent;
use rig::ha::{
    conditions_of, ha_node_config, ha_sm_config, region_of, sm_host_status, start_two_sms,
    SecondSm, SmHostAgent, TwoSmFiles,
};
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::path::Path;

type Client = pb::fabric_agent_client::FabricAgentClient<tonic::transport::Channel>;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
/// Three pulls of 500 ms.
const FENCE_AFTER_MS: u64 = 1500;

/// `[subnet_manager.opensm_ha]` of `base` (an [`ha_sm_config`]) with `peers` (port, name, GUID),
/// this host's name, SMInfo read on the shim's umad0 and fencing after [`FENCE_AFTER_MS`].
fn with_peers(base: &str, host: &str, peers: &[(u16, &str, u64)]) -> String {
    let start = base.find("peers = [").expect("peers");
    let end = start + base[start..].find('\n').expect("line");
    let list = |f: &dyn Fn(&(u16, &str, u64)) -> String| {
        peers.iter().map(f).collect::<Vec<_>>().join(", ")
    };
    format!(
        "{}peers = [{}]\npeer_host_names = [{}]\npeer_sm_port_guids = [{}]\nhost_name = \"{host}\"\n\
         sminfo_umad_device = \"/dev/infiniband/umad0\"\nfence_after_ms = {FENCE_AFTER_MS}{}",
        &base[..start],
        list(&|p| format!("\"http://127.0.0.1:{}\"", p.0)),
        list(&|p| format!("\"{}\"", p.1)),
        list(&|p| format!("\"{:#018x}\"", p.2)),
        &base[end..]
    )
}

/// Rewrites `path` with `text` and sends SIGHUP to `pid`; waits until its log (`log`) shows the
/// reload's report.
async fn edit_and_hup(path: &Path, text: &str, pid: u32, log: &Path) {
    let before = std::fs::read_to_string(log).unwrap_or_default().len();
    std::fs::write(path, text).expect("config");
    kill(Pid::from_raw(pid as i32), Signal::SIGHUP).expect("SIGHUP");
    wait_until("the SIGHUP's report in the log", LONG, || async {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .get(before..)
            .is_some_and(|t| t.contains("SIGHUP: changed") || t.contains("SIGHUP: no setting"))
    })
    .await;
}

/// The log since `offset`.
fn since(log: &Path, offset: usize) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .get(offset..)
        .unwrap_or_default()
        .to_owned()
}

/// The oracle: a RELEASED key is in no running OpenSM's partitions file.
fn check_released(a: &pb::Attachment, key: u16, files: &[(&Path, bool)]) {
    if state(a) != pb::AttachmentState::Released {
        return;
    }
    for (file, running) in files {
        if *running {
            assert!(
                !region_of(file).contains(&format!("{key:#06x}")),
                "FALSE RELEASED: {key:#06x} is still in {} while {} says RELEASED",
                file.display(),
                a.instance_id
            );
        }
    }
}

/// Watches `instance` for `limit`: it must never be RELEASED (nor a key in a running file).
async fn never_released(c: &mut Client, instance: &str, limit: Duration) -> pb::Attachment {
    let end = Instant::now() + limit;
    loop {
        let a = get(c, instance).await;
        assert_ne!(
            state(&a),
            pb::AttachmentState::Released,
            "{instance} RELEASED too early: {}",
            a.reason
        );
        if Instant::now() >= end {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `instance` is RELEASED, checking the oracle at every look.
async fn await_released(
    c: &mut Client,
    instance: &str,
    key: u16,
    files: &[(&Path, bool)],
) -> Duration {
    let start = Instant::now();
    loop {
        let a = get(c, instance).await;
        check_released(&a, key, files);
        if state(&a) == pb::AttachmentState::Released {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < LONG,
            "{instance} never RELEASED: {:?}: {}",
            state(&a),
            a.reason
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sm_host_is_added_and_removed_with_sighup_and_no_release_is_claimed_early() {
    let Some((fabric, mut standby)) =
        start_two_sms(&FabricSpec::new(1, 3), LIMITED_DEFAULT_PARTITIONS, "node3")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let (pa, pb_) = (free_port(), free_port());
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (a_files, b_files) = (files.sm_a(), files.sm_b());
    let (a_region, b_region) = (files.a.0.clone(), files.b.0.clone());
    let guid_a = fabric.node_info("smhost").port_guid;
    let guid_b = fabric.node_info("node3").port_guid;
    let a_base = ha_sm_config(&fabric, "smhost", pa, &a_files, &[]);
    let mut sm_a = SmHostAgent::start_as(
        &fabric,
        "smhost",
        "smhost",
        &with_peers(&a_base, "smhost", &[]),
    );
    let n1 = Agent::start(&fabric, "node1", &ha_node_config(&fabric, "node1", &[pa]));
    let mut c1 = n1.client().await;
    // A port carries one partition at a time: node1's instances follow one another.
    let keys: [u16; 4] = [0x0d11, 0x0d12, 0x0d13, 0x0d14];
    let active = |c: &mut Client, n: usize| {
        let mut c = c.clone();
        async move {
            let a = attach_now(
                &mut c,
                attach(
                    &format!("i-{n}"),
                    partition(&format!("ibpart_{n}"), u32::from(keys[n - 1])),
                    Some(30_000),
                ),
            )
            .await;
            assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
        }
    };
    active(&mut c1, 1).await;
    let running = |sm: &SecondSm| {
        [
            (a_region.as_path(), true),
            (b_region.as_path(), sm.pid().is_some()),
        ]
    };

    // 1. Adding smhost2: its agent first, with smhost as its peer; it catches up before READY.
    let b_config = with_peers(
        &ha_sm_config(&fabric, "smhost2", pb_, &b_files, &[pa]),
        "smhost2",
        &[(pa, "smhost", guid_a)],
    );
    let mut sm_b = SmHostAgent::start_as(&fabric, "smhost2", "node3", &b_config);
    wait_until("smhost2 caught up, holding node1's keys", LONG, || async {
        sm_host_status(&sm_b).await.caught_up && region_of(&b_region).contains("0x0d11")
    })
    .await;
    // smhost's peers gain smhost2 (SIGHUP): from now on smhost names it to the nodes.
    let a_two = with_peers(&a_base, "smhost", &[(pb_, "smhost2", guid_b)]);
    edit_and_hup(&sm_a.config, &a_two, sm_a.pid(), &sm_a.log).await;
    assert!(
        sm_a.log_text().contains("peers now http://127.0.0.1:"),
        "{}",
        sm_a.log_text()
    );
    wait_until("smhost pulls smhost2", LONG, || async {
        sm_host_status(&sm_a)
            .await
            .peers
            .iter()
            .any(|p| p.host == "smhost2")
    })
    .await;
    // node1's endpoints still lack smhost2: its release is not RELEASED, and it says why.
    release(&mut c1, "i-1", None).await;
    wait_until(
        "node1's SM_HOST_SET_INCOMPLETE names smhost2",
        LONG,
        || async {
            conditions_of(&n1.socket)
                .await
                .iter()
                .any(|(k, d)| k == "SM_HOST_SET_INCOMPLETE" && d.contains("smhost2"))
        },
    )
    .await;
    let a = never_released(&mut c1, "i-1", Duration::from_secs(3)).await;
    eprintln!(
        "release with smhost2 known to smhost but not among node1's endpoints: {}",
        a.reason
    );
    // node1's endpoints gain smhost2 (SIGHUP) while smhost2's agent is down: its acknowledgement
    // is what the release waits for.
    assert!(sm_b.stop().success());
    let n1_log = n1.log.clone();
    let offset = std::fs::read_to_string(&n1_log).unwrap_or_default().len();
    edit_and_hup(
        &n1.config,
        &ha_node_config(&fabric, "node1", &[pa, pb_]),
        n1.pid(),
        &n1_log,
    )
    .await;
    let hup = since(&n1_log, offset);
    assert!(
        hup.contains("subnet_manager.remote") && !hup.contains("NOT applied until a restart"),
        "{hup}"
    );
    let a = never_released(&mut c1, "i-1", Duration::from_secs(3)).await;
    assert!(
        a.reason.contains(&format!("127.0.0.1:{pb_}")),
        "{}",
        a.reason
    );
    eprintln!(
        "release with smhost2 among the endpoints, its agent down: {}",
        a.reason
    );
    // Its agent back: RELEASED once it acknowledged.
    let back = Instant::now();
    sm_b.spawn();
    let took = await_released(&mut c1, "i-1", keys[0], &running(&standby)).await;
    eprintln!(
        "smhost2's agent back: i-1 RELEASED {took:?} later ({:?} after its start)",
        back.elapsed()
    );
    assert!(!has_base(&fabric.pkeys("node1"), keys[0]));
    assert!(
        !region_of(&b_region).contains("0x0d11"),
        "{}",
        region_of(&b_region)
    );
    // A new attach is ACTIVE with both hosts' acknowledgement.
    active(&mut c1, 2).await;
    assert!(region_of(&b_region).contains("0x0d12"));

    // 2. Removing smhost2. The wrong order first: node1 drops it while smhost still names it.
    edit_and_hup(
        &n1.config,
        &ha_node_config(&fabric, "node1", &[pa]),
        n1.pid(),
        &n1_log,
    )
    .await;
    release(&mut c1, "i-2", None).await;
    let a = never_released(&mut c1, "i-2", Duration::from_secs(5)).await;
    assert!(a.reason.contains("smhost2"), "{}", a.reason);
    eprintln!("node1 without smhost2 while smhost names it: {}", a.reason);
    // Put back, the release ends with both.
    edit_and_hup(
        &n1.config,
        &ha_node_config(&fabric, "node1", &[pa, pb_]),
        n1.pid(),
        &n1_log,
    )
    .await;
    await_released(&mut c1, "i-2", keys[1], &running(&standby)).await;
    // smhost refuses to drop a peer it does not hold fenced.
    let offset = sm_a.log_text().len();
    edit_and_hup(
        &sm_a.config,
        &with_peers(&a_base, "smhost", &[]),
        sm_a.pid(),
        &sm_a.log,
    )
    .await;
    let hup = since(&sm_a.log, offset);
    assert!(
        hup.contains("cannot be removed while this host does not hold it fenced"),
        "{hup}"
    );
    assert_eq!(sm_host_status(&sm_a).await.peers.len(), 1);
    std::fs::write(&sm_a.config, &a_two).expect("config");
    active(&mut c1, 3).await;
    // The documented order: smhost2's OpenSM and agent stopped; smhost fences it on SMInfo.
    standby.stop(false);
    assert!(sm_b.stop().success());
    wait_until("smhost holds smhost2 fenced", LONG, || async {
        conditions_of(&sm_a.socket)
            .await
            .iter()
            .any(|(k, d)| k == "SM_HOST_FENCED" && d.contains("smhost2"))
    })
    .await;
    release(&mut c1, "i-3", None).await;
    await_released(&mut c1, "i-3", keys[2], &running(&standby)).await;
    // smhost's peers, then node1's endpoints.
    let offset = sm_a.log_text().len();
    edit_and_hup(
        &sm_a.config,
        &with_peers(&a_base, "smhost", &[]),
        sm_a.pid(),
        &sm_a.log,
    )
    .await;
    let hup = since(&sm_a.log, offset);
    assert!(hup.contains("removed: smhost2"), "{hup}");
    assert!(sm_host_status(&sm_a).await.peers.is_empty());
    edit_and_hup(
        &n1.config,
        &ha_node_config(&fabric, "node1", &[pa]),
        n1.pid(),
        &n1_log,
    )
    .await;
    active(&mut c1, 4).await;
    release(&mut c1, "i-4", None).await;
    await_released(&mut c1, "i-4", keys[3], &running(&standby)).await;
    assert!(
        conditions_of(&n1.socket)
            .await
            .iter()
            .all(|(k, _)| k != "SM_HOST_SET_INCOMPLETE"),
        "{:?}",
        conditions_of(&n1.socket).await
    );
    drop(c1);
    let mut n1 = n1;
    assert!(n1.stop().success());
    assert!(sm_a.stop().success());
}
