//! Three SM hosts on one ibsim fabric, one of them killed whole: three real OpenSMs (priorities
//! 15, 10 and 5, polling 1 s x 2), an SM-host agent beside each (peers of both others, reading
//! SMInfo and fencing on it, under the umad shim as the HCA its OpenSM is bound to) and two node
//! agents whose `endpoints` list all three. The master SM host (its OpenSM and its agent) is
//! SIGKILLed by pid; an attach and a release are sent at once. Both live agents fence the dead
//! host, the priority-10 OpenSM takes over, and the new attach is ACTIVE and the release RELEASED
//! with no node agent restarted or reconfigured; checked with `smpquery` (the new key on its port,
//! the released one off). The times from the kill are printed
//! (docs/OPENSM.md). Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::{attach, attach_now, free_port, get, has_base, partition, release, state};
use fabric_agent::proto::agent as pb;
use rig::agents::Agent;
use rig::ha::{
    conditions_of, ha_node_config, ha_sm_config, is_master, region_of, start_three_sms,
    with_fencing_peers, SmFiles, SmHostAgent,
};
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const SWEEP_LIMIT: Duration = Duration::from_secs(20);
/// Three pulls of 500 ms.
const FENCE_AFTER_MS: u64 = 1500;

/// Whether the agent on `socket` holds `host` fenced.
async fn holds_fenced(socket: &std::path::Path, host: &str) -> bool {
    conditions_of(socket)
        .await
        .iter()
        .any(|(k, d)| k == "SM_HOST_FENCED" && d.contains(&format!("peer SM host {host} ")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by scripts/test.sh with the other SM-host failover tests (tries): OpenSM 3.3.23 \
            under ibsim sometimes stops sweeping after a handover"]
async fn three_sm_hosts_one_killed_whole_attaches_and_releases_go_on() {
    // smhost: the rig's OpenSM (15); node3: the second (10); node4: the third (5).
    let Some((mut fabric, mut second, third)) = start_three_sms(
        &FabricSpec::new(1, 4),
        LIMITED_DEFAULT_PARTITIONS,
        "node3",
        "node4",
    ) else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    assert!(
        is_master(&fabric.opensm_log_path()),
        "{}",
        fabric.opensm_log()
    );
    let (pa, pb_, pc) = (free_port(), free_port(), free_port());
    let (a_part, a_log, a_pid) = (
        fabric.partitions_path(),
        fabric.opensm_log_path(),
        fabric.opensm_pid_path(),
    );
    let (b_part, b_log, b_pid) = (
        second.partitions_path(),
        second.log_path(),
        second.pid_path(),
    );
    let (c_part, c_log, c_pid) = (third.partitions_path(), third.log_path(), third.pid_path());
    let files = [
        SmFiles {
            partitions: &a_part,
            log: &a_log,
            pid: &a_pid,
            metrics: free_port(),
        },
        SmFiles {
            partitions: &b_part,
            log: &b_log,
            pid: &b_pid,
            metrics: free_port(),
        },
        SmFiles {
            partitions: &c_part,
            log: &c_log,
            pid: &c_pid,
            metrics: free_port(),
        },
    ];
    let guid = |hca: &str| fabric.node_info(hca).port_guid;
    // (name, HCA its OpenSM is bound to, its Partitions port, its port GUID)
    let hosts = [
        ("smhost", "smhost", pa, guid("smhost")),
        ("smhost2", "node3", pb_, guid("node3")),
        ("smhost3", "node4", pc, guid("node4")),
    ];
    let mut sms: Vec<SmHostAgent> = Vec::new();
    for (i, (name, hca, port, _)) in hosts.iter().enumerate() {
        let others: Vec<_> = hosts.iter().filter(|h| h.0 != *name).collect();
        let peer_ports: Vec<u16> = others.iter().map(|h| h.2).collect();
        let peer_ids: Vec<(&str, u64)> = others.iter().map(|h| (h.0, h.3)).collect();
        let config = with_fencing_peers(
            ha_sm_config(&fabric, name, *port, &files[i], &peer_ports),
            name,
            &peer_ids,
            FENCE_AFTER_MS,
        );
        sms.push(SmHostAgent::start_as(&fabric, name, hca, &config));
    }
    let n1 = Agent::start(
        &fabric,
        "node1",
        &ha_node_config(&fabric, "node1", &[pa, pb_, pc]),
    );
    let n2 = Agent::start(
        &fabric,
        "node2",
        &ha_node_config(&fabric, "node2", &[pa, pb_, pc]),
    );
    let node_pids = (n1.pid(), n2.pid());
    let (mut c1, mut c2) = (n1.client().await, n2.client().await);
    let (k1, k3) = (0x0c21u16, 0x0c23u16);
    // node1's tenant, acknowledged by all three; node2 attaches only after the kill (a port
    // carries one partition at a time; a third node agent would take ibsim's last client slot).
    {
        let a = attach_now(
            &mut c1,
            attach("i-1", partition("ibpart_1", u32::from(k1)), Some(30_000)),
        )
        .await;
        assert_eq!(
            state(&a),
            pb::AttachmentState::Active,
            "{a:?}\n--- smhost ---\n{}\n--- smhost2 ---\n{}\n--- smhost3 ---\n{}",
            tail(&sms[0].log_text(), 30),
            tail(&sms[1].log_text(), 30),
            tail(&sms[2].log_text(), 30)
        );
    }
    assert!(fabric.pkeys("node1").contains(&(0x8000 | k1)));
    // Every host's file gives node1 the key (the two standbys' for their takeover).
    for part in [&a_part, &b_part, &c_part] {
        let region = region_of(part);
        assert!(
            region.contains(&format!("{k1:#06x}")),
            "{}: {region}",
            part.display()
        );
    }

    // The master SM host dies whole: its OpenSM and its agent, SIGKILLed by pid.
    let died = Instant::now();
    let died_unix_ms = unix_ms();
    fabric.stop_opensm(true);
    sms[0].crash();
    let a = attach_now(
        &mut c2,
        attach("i-3", partition("ibpart_3", u32::from(k3)), None),
    )
    .await;
    eprintln!("attach right after the kill answered {:?}", state(&a));
    release(&mut c1, "i-1", None).await;
    let (mut master_at, mut fenced_at, mut active_at, mut released_at) = (None, None, None, None);
    let mut restarted = false;
    while master_at.is_none() || fenced_at.is_none() || active_at.is_none() || released_at.is_none()
    {
        if master_at.is_none() && is_master(&second.log_path()) {
            master_at = Some(died.elapsed());
        }
        if fenced_at.is_none()
            && holds_fenced(&sms[1].socket, "smhost").await
            && holds_fenced(&sms[2].socket, "smhost").await
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
        if !restarted && master_at.is_some() && died.elapsed() > Duration::from_secs(8) {
            rig::ha::await_new_master_sweep(&mut second, SWEEP_LIMIT).await;
            restarted = true;
        }
        assert!(
            died.elapsed() < LONG,
            "after the master's death: MASTER {master_at:?}, fenced by both {fenced_at:?}, ACTIVE {active_at:?}, RELEASED {released_at:?}\ni-3: {:?}\ni-1: {:?}\n--- smhost2 ---\n{}\n--- smhost3 ---\n{}",
            get(&mut c2, "i-3").await,
            get(&mut c1, "i-1").await,
            tail(&sms[1].log_text(), 40),
            tail(&sms[2].log_text(), 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let master_at = master_at.unwrap();
    let (fenced_at, active_at, released_at) =
        (fenced_at.unwrap(), active_at.unwrap(), released_at.unwrap());
    eprintln!(
        "three SM hosts, the master killed whole: smhost2's OpenSM MASTER after {master_at:?}, smhost fenced by both live hosts after {fenced_at:?}, new attach ACTIVE after {active_at:?}, release RELEASED after {released_at:?}"
    );
    // When each live host decided the fence (its condition's "fenced since", unix ms).
    for sm in &sms[1..] {
        let since = fenced_since(&sm.socket, "smhost").await;
        eprintln!(
            "{} fenced smhost {} ms after the kill",
            sm.name,
            since.saturating_sub(died_unix_ms)
        );
    }
    // The priority-10 OpenSM took over, not the priority-5 one.
    assert!(!is_master(&third.log_path()), "{}", tail(&third.log(), 20));
    assert_eq!(
        rig::ha::sminfo_state(&fabric, "node3").as_deref(),
        Ok("master")
    );
    // The budget: the OpenSM handover, then two sweeps and a pull interval (0.5 s). A sweep
    // here takes well under a second; 5 s leaves room for a loaded 2-core machine.
    for (what, at) in [("ACTIVE", active_at), ("RELEASED", released_at)] {
        let after = at.saturating_sub(master_at);
        assert!(
            after < Duration::from_secs(5),
            "{what} {after:?} after the handover"
        );
    }
    // On the ports (smpquery): the new key on node2's, the released one off node1's.
    let keys2 = fabric.pkeys("node2");
    assert!(keys2.contains(&(0x8000 | k3)), "{keys2:x?}");
    assert!(!has_base(&fabric.pkeys("node1"), k1));
    // What the node's events say of the release (the hosts that acknowledged, the one
    // excused), printed for docs/OPENSM.md.
    let first = c1
        .get_node(pb::GetNodeRequest {})
        .await
        .expect("GetNode")
        .into_inner()
        .first_event_seq;
    let log = common::events::events(&mut c1, first.saturating_sub(1)).await;
    for e in &log {
        if let Some(pb::event::Kind::AttachmentChanged(a)) = &e.kind {
            eprintln!(
                "event {}: {} {:?} -> {:?}: {} (evidence: {:?})",
                e.seq,
                a.instance_id,
                a.from(),
                a.to(),
                a.reason,
                a.evidence.as_ref().map(|v| v.sm_generation)
            );
        }
    }
    eprintln!("node1's events: {} (first seq {first})", log.len());
    // No node agent was restarted.
    assert_eq!((n1.pid(), n2.pid()), node_pids);
    drop((c1, c2));
    let (mut n1, mut n2) = (n1, n2);
    assert!(n1.stop().success());
    assert!(n2.stop().success());
    for sm in &mut sms[1..] {
        assert!(sm.stop().success());
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// The "fenced since" (unix ms) of `host` in the SM_HOST_FENCED condition of the agent on
/// `socket`.
async fn fenced_since(socket: &std::path::Path, host: &str) -> u64 {
    let detail = conditions_of(socket)
        .await
        .into_iter()
        .find(|(k, d)| k == "SM_HOST_FENCED" && d.contains(&format!("peer SM host {host} ")))
        .map(|(_, d)| d)
        .unwrap_or_default();
    detail
        .split("fenced since ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no fence time in {detail:?}"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
