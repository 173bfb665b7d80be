//! An SM host down never stops the fabric, on ibsim with two real OpenSMs (priorities 15 and
//! 10, polling 1 s x 2) and an SM-host agent beside each, both under the umad shim as the HCA
//! their OpenSM is bound to (they read SMInfo and fence on it), and two node agents sending every
//! apply to both. Checked with `smpquery`:
//! 1. the standby's agent stopped while its OpenSM runs: a release is not RELEASED (its key
//!    leaves the port: the master programs it), and the reason names smhost2 and says its SM
//!    still answers SMInfo; `fabric-agent fence-sm-host smhost2` on the master's host refuses
//!    (exit 65); that OpenSM stopped: smhost fences smhost2 and the release is RELEASED; the
//!    agent back and caught up lifts the fence, then its OpenSM starts again as standby;
//! 2. the master SM host killed whole (its OpenSM and its agent SIGKILLed): the standby's agent
//!    fences it (its agent silent, its SM port silent to SMInfo), and a new attach becomes
//!    ACTIVE and a release RELEASED with no node agent restarted or reconfigured. The times from
//!    the kill are printed (docs/OPENSM.md). Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::process::BIN;
use common::{attach, attach_now, free_port, get, has_base, partition, release, state, wait_until};
use fabric_agent::proto::agent as pb;
use rig::agents::Agent;
use rig::ha::{
    conditions_of, ha_node_config, ha_sm_config, is_master, start_two_sms, with_fencing,
    SmHostAgent, TwoSmFiles,
};
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::process::Command;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const SWEEP_LIMIT: Duration = Duration::from_secs(20);
/// Three pulls of 500 ms.
const FENCE_AFTER_MS: u64 = 1500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by scripts/test.sh with the other two-SM-host failover tests (tries): OpenSM \
            3.3.23 under ibsim sometimes stops sweeping after a handover"]
async fn a_dead_sm_host_is_fenced_and_the_fabric_goes_on_but_a_live_sm_without_its_agent_is_not() {
    let Some((mut fabric, mut standby)) =
        start_two_sms(&FabricSpec::new(1, 3), LIMITED_DEFAULT_PARTITIONS, "node3")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let (pa, pb_) = (free_port(), free_port());
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (a_files, b_files) = (files.sm_a(), files.sm_b());
    let guid_a = fabric.node_info("smhost").port_guid;
    let guid_b = fabric.node_info("node3").port_guid;
    let mut sm_a = SmHostAgent::start_as(
        &fabric,
        "smhost",
        "smhost",
        &with_fencing(
            ha_sm_config(&fabric, "smhost", pa, &a_files, &[pb_]),
            "smhost",
            "smhost2",
            guid_b,
            FENCE_AFTER_MS,
        ),
    );
    let mut sm_b = SmHostAgent::start_as(
        &fabric,
        "smhost2",
        "node3",
        &with_fencing(
            ha_sm_config(&fabric, "smhost2", pb_, &b_files, &[pa]),
            "smhost2",
            "smhost",
            guid_a,
            FENCE_AFTER_MS,
        ),
    );
    let n1 = Agent::start(
        &fabric,
        "node1",
        &ha_node_config(&fabric, "node1", &[pa, pb_]),
    );
    let n2 = Agent::start(
        &fabric,
        "node2",
        &ha_node_config(&fabric, "node2", &[pa, pb_]),
    );
    let (mut c1, mut c2) = (n1.client().await, n2.client().await);
    let (k1, k2, k3) = (0x0c11u16, 0x0c12u16, 0x0c13u16);
    for (c, i, k) in [(&mut c1, "i-1", k1), (&mut c2, "i-2", k2)] {
        let a = attach_now(
            c,
            attach(
                i,
                partition(&format!("ibpart_{}", &i[2..]), u32::from(k)),
                Some(30_000),
            ),
        )
        .await;
        assert_eq!(
            state(&a),
            pb::AttachmentState::Active,
            "{a:?}\n--- A ---\n{}\n--- B ---\n{}",
            tail(&sm_a.log_text(), 30),
            tail(&sm_b.log_text(), 30)
        );
    }
    assert!(fabric.pkeys("node1").contains(&(0x8000 | k1)));
    assert!(fabric.pkeys("node2").contains(&(0x8000 | k2)));

    // 1. The standby's agent stops while its OpenSM (standby) runs.
    assert!(sm_b.stop().success());
    release(&mut c2, "i-2", None).await;
    wait_until(
        "node2's key off its port (the master programs it)",
        LONG,
        || async { !has_base(&fabric.pkeys("node2"), k2) },
    )
    .await;
    wait_until(
        "the release's reason names smhost2 and its live SM",
        LONG,
        || {
            let mut c = c2.clone();
            async move {
                let a = get(&mut c, "i-2").await;
                state(&a) != pb::AttachmentState::Released
                    && a.reason.contains("smhost2 is not fenced")
                    && a.reason.contains("answers SMInfo")
            }
        },
    )
    .await;
    let a = get(&mut c2, "i-2").await;
    eprintln!(
        "release with the standby's agent down: {:?}: {}",
        state(&a),
        a.reason
    );
    assert_eq!(state(&a), pb::AttachmentState::Releasing, "{a:?}");
    wait_until(
        "smhost's SM_HOST_AGENT_SILENT names smhost2 (and nothing is fenced)",
        LONG,
        || async {
            let c = conditions_of(&sm_a.socket).await;
            c.iter()
                .any(|(k, d)| k == "SM_HOST_AGENT_SILENT" && d.contains("smhost2"))
                && !c.iter().any(|(k, _)| k == "SM_HOST_FENCED")
        },
    )
    .await;
    let refused = Command::new(BIN)
        .arg("--config")
        .arg(&sm_a.config)
        .args(["fence-sm-host", "smhost2"])
        .output()
        .expect("run fence-sm-host");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    eprintln!(
        "fence-sm-host smhost2 (its SM alive): {:?} {stderr}",
        refused.status.code()
    );
    assert_eq!(refused.status.code(), Some(65), "{stderr}");
    assert!(stderr.contains("answers SMInfo"), "{stderr}");
    // Still not RELEASED after all that: nothing excused the live SM.
    assert_eq!(
        state(&get(&mut c2, "i-2").await),
        pb::AttachmentState::Releasing
    );
    // The operator stops that OpenSM, as the reason says: its port stops answering SMInfo, so
    // smhost fences smhost2 on its own evidence and the release is RELEASED.
    let stopped = Instant::now();
    standby.stop(false);
    wait_until("i-2 RELEASED once smhost2's SM is stopped", LONG, || {
        let mut c = c2.clone();
        async move { state(&get(&mut c, "i-2").await) == pb::AttachmentState::Released }
    })
    .await;
    eprintln!(
        "standby's OpenSM stopped (its agent already down): RELEASED after {:?}",
        stopped.elapsed()
    );
    wait_until("smhost holds smhost2 fenced", LONG, || async {
        conditions_of(&sm_a.socket)
            .await
            .iter()
            .any(|(k, d)| k == "SM_HOST_FENCED" && d.contains("smhost2"))
    })
    .await;
    // It rejoins through its agent first (its OpenSM is ordered after it): caught up, the fence
    // is lifted; then its OpenSM starts again (standby: the master has the higher priority).
    sm_b.spawn();
    wait_until("smhost2 caught up", LONG, || async {
        rig::ha::sm_host_status(&sm_b).await.caught_up
    })
    .await;
    wait_until("smhost lifts smhost2's fence", LONG, || async {
        !conditions_of(&sm_a.socket)
            .await
            .iter()
            .any(|(k, _)| k == "SM_HOST_FENCED")
    })
    .await;
    standby.restart();
    wait_until("the standby OpenSM is back as standby", LONG, || async {
        rig::ha::sminfo_state(&fabric, "node3").as_deref() == Ok("standby")
    })
    .await;

    // 2. The master SM host dies whole.
    let died = Instant::now();
    let died_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    fabric.stop_opensm(true);
    sm_a.crash();
    let a = attach_now(
        &mut c2,
        attach("i-3", partition("ibpart_3", u32::from(k3)), None),
    )
    .await;
    eprintln!("attach right after the kill answered {:?}", state(&a));
    release(&mut c1, "i-1", None).await;
    let mut fenced_at = None;
    let mut active_at = None;
    let mut released_at = None;
    let mut restarted = false;
    let mut master_at = None;
    while active_at.is_none() || released_at.is_none() || fenced_at.is_none() {
        if master_at.is_none() && is_master(&standby.log_path()) {
            master_at = Some(died.elapsed());
        }
        if fenced_at.is_none()
            && conditions_of(&sm_b.socket)
                .await
                .iter()
                .any(|(k, d)| k == "SM_HOST_FENCED" && d.contains("smhost"))
        {
            fenced_at = Some(died.elapsed());
        }
        if active_at.is_none() && state(&get(&mut c2, "i-3").await) == pb::AttachmentState::Active {
            active_at = Some(died.elapsed());
        }
        if released_at.is_none()
            && state(&get(&mut c1, "i-1").await) == pb::AttachmentState::Released
        {
            released_at = Some(died.elapsed());
        }
        // Under ibsim the new master sometimes stops sweeping for good right after the
        // takeover: it is then started again (tests/opensm/ha.rs).
        if !restarted && is_master(&standby.log_path()) && died.elapsed() > Duration::from_secs(8) {
            rig::ha::await_new_master_sweep(&mut standby, SWEEP_LIMIT).await;
            restarted = true;
        }
        assert!(
            died.elapsed() < LONG,
            "after the master's death: fenced {fenced_at:?}, ACTIVE {active_at:?}, RELEASED {released_at:?}\ni-3: {:?}\ni-1: {:?}\n--- B ---\n{}",
            get(&mut c2, "i-3").await,
            get(&mut c1, "i-1").await,
            tail(&sm_b.log_text(), 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "master SM host killed whole: standby MASTER after {master_at:?}, fence seen in GetNode after {:?}, new attach ACTIVE after {:?}, release RELEASED after {:?}",
        fenced_at.unwrap(),
        active_at.unwrap(),
        released_at.unwrap(),
    );
    // The budget: the OpenSM handover, then two sweeps and a pull interval (0.5 s). A sweep
    // here takes well under a second; 5 s leaves room for a loaded 2-core machine.
    let master_at = master_at.expect("the standby became master");
    for (what, at) in [("ACTIVE", active_at), ("RELEASED", released_at)] {
        let after = at.unwrap().saturating_sub(master_at);
        assert!(
            after < Duration::from_secs(5),
            "{what} {after:?} after the handover"
        );
    }
    assert!(fabric.pkeys("node2").contains(&(0x8000 | k3)));
    assert!(!has_base(&fabric.pkeys("node1"), k1));
    let detail = conditions_of(&sm_b.socket)
        .await
        .into_iter()
        .find(|(k, _)| k == "SM_HOST_FENCED")
        .map(|(_, d)| d)
        .unwrap_or_default();
    eprintln!("smhost2's condition: {detail}");
    let since: u64 = detail
        .split("fenced since ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .expect("the fence's time in the condition");
    eprintln!(
        "fence decision: {} ms after the kill",
        since.saturating_sub(died_unix_ms)
    );
    assert!(
        detail.contains("SMInfo") || detail.contains("not in the SA"),
        "{detail}"
    );
    let metrics = rig::ha::scrape(b_files.metrics);
    assert!(
        metrics.contains("fabric_agent_condition{kind=\"SM_HOST_FENCED\"} 1")
            && metrics.contains("fabric_agent_sm_peer_fenced{peer=\"smhost\"} 1"),
        "{metrics}"
    );
    let log_b = sm_b.log_text();
    if let Some(line) = log_b
        .lines()
        .find(|l| l.contains("fenced the peer SM host"))
    {
        eprintln!("{line}");
    }
    let released = get(&mut c1, "i-1").await;
    eprintln!("RELEASED evidence: {}", released.reason);
    drop((c1, c2));
    let (mut n1, mut n2) = (n1, n2);
    assert!(n1.stop().success());
    assert!(n2.stop().success());
    assert!(sm_b.stop().success());
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
