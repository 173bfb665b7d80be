//! The SM host's OpenSM role read from the SM's own SMInfo, on ibsim with two real OpenSMs
//! (priorities 15 and 10, polling 1 s x 2) and an SM-host agent beside each, both run under the
//! umad shim as the HCA their OpenSM is bound to (`sminfo_umad_device`). At every stage the role
//! each agent's `GetNode` shows (labelled `sminfo`) is the one infiniband-diags' `sminfo -D 0`
//! reads on that host's port: master and standby at start; after the master OpenSM is SIGKILLed,
//! the standby's agent says master and the dead host's agent says `not running` (its pid is
//! gone, SMInfo gets no answer), with the condition OPENSM_NOT_RUNNING naming node1; after the old master returns, both agree with `sminfo`
//! again. A set sent to the standby's agent alone is confirmed there on SMInfo's STANDBY, and
//! its key is on the node's port once that OpenSM is master. Skipped when ibsim/OpenSM are not
//! installed.

use testkit::common;
use testkit::rig;

use common::sm_requests::set_memberships;
use common::{free_port, wait_until};
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::ha::{
    ha_sm_config, is_master, region_of, scrape, sm_host_status, sminfo_state, start_two_sms,
    SmHostAgent, TwoSmFiles,
};
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const SWEEP_LIMIT: Duration = Duration::from_secs(20);
const UMAD: &str = "/dev/infiniband/umad0";

/// A config of [`ha_sm_config`] that reads the role over SMInfo.
fn with_sminfo(config: String) -> String {
    let out = config.replace(
        "sync_interval_ms = 500\n",
        &format!("sync_interval_ms = 500\nsminfo_umad_device = \"{UMAD}\"\n"),
    );
    assert!(out.contains("sminfo_umad_device"), "{config}");
    out
}

/// Waits until the agent's role is read over SMInfo and equals what `sminfo -D 0` reads on
/// `hca`'s port (both read again each round), and returns it.
async fn role_agrees_with_sminfo(
    fabric: &rig::Fabric,
    agent: &SmHostAgent,
    hca: &str,
    what: &str,
) -> String {
    let deadline = Instant::now() + LONG;
    loop {
        let status = sm_host_status(agent).await;
        let tool = sminfo_state(fabric, hca);
        if status.role_source == "sminfo" && tool.as_deref() == Ok(status.role.as_str()) {
            eprintln!(
                "{what}: {} says {} (SMInfo); sminfo -D 0 as {hca} says {}",
                agent.name,
                status.role,
                tool.unwrap_or_default()
            );
            return status.role;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} says {:?} from {:?} ({}); sminfo as {hca}: {tool:?}",
            agent.name,
            status.role,
            status.role_source,
            status.role_fallback_reason
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_read_over_sminfo_matches_sminfo_through_a_failover() {
    // node2 is the second SM host; node1 a node whose set is sent to the standby alone.
    let Some((mut fabric, mut standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let (pa, pb_) = (free_port(), free_port());
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (a_files, b_files) = (files.sm_a(), files.sm_b());
    let (b_part, b_log) = (&files.b.0, &files.b.1);
    let guid1 = fabric.node_info("node1").port_guid;
    let sm_a = SmHostAgent::start_as(
        &fabric,
        "smhost",
        "smhost",
        &with_sminfo(ha_sm_config(&fabric, "smhost", pa, &a_files, &[pb_])),
    );
    let sm_b = SmHostAgent::start_as(
        &fabric,
        "smhost2",
        "node2",
        &with_sminfo(ha_sm_config(&fabric, "smhost2", pb_, &b_files, &[pa])),
    );

    // At start: master and standby, as sminfo reads them.
    assert_eq!(
        role_agrees_with_sminfo(&fabric, &sm_a, "smhost", "at start").await,
        "master"
    );
    assert_eq!(
        role_agrees_with_sminfo(&fabric, &sm_b, "node2", "at start").await,
        "standby"
    );
    for port in [a_files.metrics, b_files.metrics] {
        let m = scrape(port);
        assert!(m.contains("fabric_agent_sm_host_role_from_sminfo 1"), "{m}");
    }

    // A set sent to the standby's agent alone: confirmed there because SMInfo said STANDBY
    // after the write (a standby logs no sweep to confirm by).
    let key = 0x0a31u32;
    let mut to_b = PartitionsClient::connect(format!("http://127.0.0.1:{pb_}"))
        .await
        .expect("connect to the standby's agent");
    to_b.set_node_memberships(set_memberships("node1", &[guid1], &[key], 1))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", sm_b.log_text()));
    assert!(region_of(b_part).contains(&format!("{key:#06x}")));
    let log_b = sm_b.log_text();
    assert!(
        log_b.contains("OpenSM is standby") && log_b.contains("by_sminfo=true"),
        "{log_b}"
    );

    // The master OpenSM dies: its host's agent falls back to the log, labelled; the standby's
    // agent reads master over SMInfo, as sminfo does.
    fabric.stop_opensm(true);
    wait_until("the standby OpenSM becomes master", LONG, || async {
        is_master(b_log)
    })
    .await;
    assert_eq!(
        role_agrees_with_sminfo(&fabric, &sm_b, "node2", "after the failover").await,
        "master"
    );
    wait_until(
        "the dead master's agent says its OpenSM is not running",
        LONG,
        || async {
            let s = sm_host_status(&sm_a).await;
            s.role == "not running"
                && s.role_source == "not-running"
                && s.role_fallback_reason.contains("gone")
                && s.role_fallback_reason.contains(UMAD)
        },
    )
    .await;
    wait_until(
        "the dead master's agent raises OPENSM_NOT_RUNNING naming node1",
        LONG,
        || async {
            let node = rig::process::client(&sm_a.socket)
                .await
                .get_node(fabric_agent::proto::agent::GetNodeRequest {})
                .await
                .expect("GetNode")
                .into_inner();
            node.conditions
                .iter()
                .any(|c| c.kind == "OPENSM_NOT_RUNNING" && c.detail.contains("node1"))
        },
    )
    .await;
    assert!(
        scrape(a_files.metrics).contains("fabric_agent_condition{kind=\"OPENSM_NOT_RUNNING\"} 1")
    );
    let a = sm_host_status(&sm_a).await;
    eprintln!(
        "after the failover: smhost says {} from {} ({}); sminfo as smhost: {:?}",
        a.role,
        a.role_source,
        a.role_fallback_reason,
        sminfo_state(&fabric, "smhost")
    );
    assert!(sminfo_state(&fabric, "smhost").is_err());
    assert!(scrape(a_files.metrics).contains("fabric_agent_sm_host_role_from_sminfo 0"));
    // The new master programs the file its agent kept as a standby's (restarted when it stops
    // sweeping after the takeover under ibsim, as in tests/opensm/ha.rs).
    rig::ha::await_new_master_sweep(&mut standby, SWEEP_LIMIT).await;
    wait_until(
        "node1's key, set on the standby only, on its port",
        LONG,
        || async { fabric.pkeys("node1").contains(&(0x8000 | key as u16)) },
    )
    .await;

    // The old master returns: both agents agree with sminfo again.
    rig::ha::restart_rig_opensm(&mut fabric);
    let deadline = Instant::now() + LONG;
    let (ra, rb) = loop {
        let ra = role_agrees_with_sminfo(&fabric, &sm_a, "smhost", "after the return").await;
        let rb = role_agrees_with_sminfo(&fabric, &sm_b, "node2", "after the return").await;
        let mut pair = [ra.as_str(), rb.as_str()];
        pair.sort_unstable();
        if pair == ["master", "standby"] {
            break (ra, rb);
        }
        assert!(Instant::now() < deadline, "roles {ra} / {rb}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    eprintln!("after the old master returned: smhost {ra}, smhost2 {rb}");
    assert!(scrape(a_files.metrics).contains("fabric_agent_sm_host_role_from_sminfo 1"));
    drop(to_b);
    let mut sm_a = sm_a;
    let mut sm_b = sm_b;
    assert!(sm_a.stop().success());
    assert!(sm_b.stop().success());
}
