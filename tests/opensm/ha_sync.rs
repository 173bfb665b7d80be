//! The SM hosts' anti-entropy on ibsim with two real OpenSMs (priorities 15 and 10) and an
//! SM-host agent beside each:
//! - **partitioned from each other**: the agents reach each other only through loopback links
//!   the test cuts (every live connection closed, new ones refused) while the nodes keep talking
//!   to both. What each agent says meanwhile (the peer's pull error, `caught_up`, the
//!   `fabric_agent_sm_peer_answering` metric, no `SM_HOSTS_DISAGREE`; a restarted agent that
//!   cannot catch up and holds its stored sets back); a release and a new attach on node1
//!   during the partition are acknowledged by both and programmed; after the links heal, the released key never comes back (node1's port
//!   polled with `smpquery` throughout, both regions checked) and the hosts agree again.
//! - **revocation exchange**: with grants required, `RevokeInstance` sent to the standby's agent
//!   alone reaches the master's agent by `PullNodeSets`, which takes the key out of its file,
//!   and its OpenSM takes the key off node1's port (`smpquery`); node1's set still carrying the
//!   revoked grant is then refused by both hosts.
//! - **a node reaching one SM host only**: its release is programmed by the master and stays
//!   RELEASING naming the unreachable host; the other host takes the node's new set from its
//!   peer; once the node reaches it again the release is RELEASED, and the key never came back.
//! - **consumption exchange**: a release sent to one SM host consumes its grant there; the other
//!   consumes it at its next pull (its file loses the key) and refuses the old grant replayed to
//!   it at a higher generation.
//!
//! Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::grants::{grant, GrantSigner};
use common::{attach, attach_now, free_port, get, has_base, partition, release, state, wait_until};
use fabric_agent::domain::Membership;
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::agents::Agent;
use rig::ha::{
    ha_node_config, ha_sm_config, region_of, scrape, sm_host_status, start_two_sms, SmHostAgent,
    TwoSmFiles,
};
use rig::link::CuttableLink;
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// The tests run two OpenSMs and several agents on their own fabric each: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The SM host agent's standing conditions (kinds) from its `GetNode`.
async fn conditions(agent: &SmHostAgent) -> Vec<String> {
    let mut c = rig::process::client(&agent.socket).await;
    let node = c
        .get_node(pb::GetNodeRequest {})
        .await
        .expect("GetNode")
        .into_inner();
    node.conditions.into_iter().map(|c| c.kind).collect()
}

/// Polls `node`'s port 1 P_Key table with `smpquery` until dropped, noting whether `base` was
/// ever seen.
struct Poller {
    seen: Arc<AtomicBool>,
    polls: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn start(fabric: &rig::Fabric, node: &'static str, base: u16) -> Poller {
        let seen = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, p, st) = (seen.clone(), polls.clone(), stop.clone());
        let sock = fabric.sock_name().to_owned();
        let dir = fabric.dir().to_owned();
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                if let Some(keys) = rig::ha::pkeys_of(&sock, &dir, node) {
                    p.fetch_add(1, Ordering::SeqCst);
                    if has_base(&keys, base) {
                        s.store(true, Ordering::SeqCst);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Poller {
            seen,
            polls,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops polling: (polls, whether the key was seen).
    fn finish(mut self) -> (usize, bool) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("poller");
        }
        (
            self.polls.load(Ordering::SeqCst),
            self.seen.load(Ordering::SeqCst),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // a lock between the two tests' own runtimes
async fn sm_hosts_partitioned_from_each_other_never_bring_a_released_key_back() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // node3 is the second SM host.
    let Some((fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 3), LIMITED_DEFAULT_PARTITIONS, "node3")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (pa, pb_) = (free_port(), free_port());
    // Each agent reaches its peer only through a link the test can cut.
    let (a_to_b, b_to_a) = (CuttableLink::start(pb_), CuttableLink::start(pa));
    let sm_a = SmHostAgent::start(
        &fabric,
        "smhost",
        &ha_sm_config(&fabric, "smhost", pa, &files.sm_a(), &[a_to_b.port()]),
    );
    let mut sm_b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &ha_sm_config(&fabric, "smhost2", pb_, &files.sm_b(), &[b_to_a.port()]),
    );
    let one = Agent::start(
        &fabric,
        "node1",
        &ha_node_config(&fabric, "node1", &[pa, pb_]),
    );
    let two = Agent::start(
        &fabric,
        "node2",
        &ha_node_config(&fabric, "node2", &[pa, pb_]),
    );
    let (mut c1, mut c2) = (one.client().await, two.client().await);
    let (k1, k2, k3) = (0x0a41u32, 0x0a42u32, 0x0a43u32);
    for (c, i, k) in [(&mut c1, "i-1", k1), (&mut c2, "i-2", k2)] {
        let a = attach_now(
            c,
            attach(i, partition(&format!("ibpart_{k:x}"), k), Some(30_000)),
        )
        .await;
        assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    }
    wait_until("both SM hosts caught up", LONG, || async {
        sm_host_status(&sm_a).await.caught_up && sm_host_status(&sm_b).await.caught_up
    })
    .await;

    // The partition: both links cut.
    a_to_b.cut();
    b_to_a.cut();
    wait_until("each agent sees its peer's pulls fail", LONG, || async {
        !sm_host_status(&sm_a).await.peers[0].last_error.is_empty()
            && !sm_host_status(&sm_b).await.peers[0].last_error.is_empty()
    })
    .await;
    let (ha, hb) = (sm_host_status(&sm_a).await, sm_host_status(&sm_b).await);
    eprintln!(
        "partitioned: smhost caught_up={} peer error {:?}; smhost2 caught_up={} peer error {:?}",
        ha.caught_up, ha.peers[0].last_error, hb.caught_up, hb.peers[0].last_error
    );
    // Each caught up since its start and stays so: every acknowledged set reaches it directly.
    assert!(ha.caught_up && hb.caught_up, "{ha:?}\n{hb:?}");
    let answering = format!(
        "fabric_agent_sm_peer_answering{{peer=\"http://127.0.0.1:{}\"}} 0",
        a_to_b.port()
    );
    let m = scrape(files.metrics.0);
    assert!(m.contains(&answering), "{answering}\n{m}");

    // A restarted agent cannot catch up while partitioned: it says with whom, and holds back
    // every set it stored until someone confirms it.
    assert!(sm_b.stop().success());
    sm_b.spawn();
    wait_until("the restarted agent answers", LONG, || async {
        !sm_host_status(&sm_b).await.catching_up_with.is_empty()
    })
    .await;
    let hb = sm_host_status(&sm_b).await;
    eprintln!(
        "restarted while partitioned: smhost2 caught_up={} catching up with {:?}, held back {:?}",
        hb.caught_up, hb.catching_up_with, hb.held_back_nodes
    );
    assert!(!hb.caught_up, "{hb:?}");
    assert_eq!(
        hb.catching_up_with,
        [format!("http://127.0.0.1:{}", b_to_a.port())]
    );
    // Its OpenSM kept running: a held-back set keeps the keys the running file holds
    // (sm::opensm::running_start), so node2's key stays in that file.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(region_of(&files.b.0).contains(&format!("{k2:#06x}")));

    // The nodes reach both hosts: a release and an attach are acknowledged by both.
    let r = release(&mut c1, "i-1", Some(30_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    assert!(!has_base(&fabric.pkeys("node1"), k1 as u16));
    // From here on node1's port must never hold the released key again.
    let poller = Poller::start(&fabric, "node1", k1 as u16);
    let a = attach_now(
        &mut c1,
        attach(
            "i-3",
            partition(&format!("ibpart_{k3:x}"), k3),
            Some(30_000),
        ),
    )
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    let (ha, hb) = (sm_host_status(&sm_a).await, sm_host_status(&sm_b).await);
    // node1's new sets confirmed it at the restarted host; node2 (nothing new to send) stays
    // held back there until the peer confirms it, keeping the key its running OpenSM's file held.
    assert!(
        !hb.held_back_nodes.contains(&"node1".to_owned())
            && hb.held_back_nodes.contains(&"node2".to_owned()),
        "{hb:?}"
    );
    for part in [&files.a.0, &files.b.0] {
        let r = region_of(part);
        assert!(
            r.contains(&format!("{k3:#06x}")) && !r.contains(&format!("{k1:#06x}")),
            "{r}"
        );
    }
    assert!(region_of(&files.a.0).contains(&format!("{k2:#06x}")));
    assert!(region_of(&files.b.0).contains(&format!("{k2:#06x}")));
    for (who, c) in [
        ("smhost", conditions(&sm_a).await),
        ("smhost2", conditions(&sm_b).await),
    ] {
        assert!(!c.iter().any(|k| k == "SM_HOSTS_DISAGREE"), "{who}: {c:?}");
    }
    eprintln!(
        "during the partition: smhost peers {:?}; smhost2 peers {:?}",
        ha.peers
            .iter()
            .map(|p| (&p.endpoint, &p.last_error))
            .collect::<Vec<_>>(),
        hb.peers
            .iter()
            .map(|p| (&p.endpoint, &p.last_error))
            .collect::<Vec<_>>()
    );

    // The links heal: the pulls answer again, the restarted agent catches up, nothing
    // comes back.
    a_to_b.heal();
    b_to_a.heal();
    wait_until(
        "both agents' pulls answer and both caught up",
        LONG,
        || async {
            let (ha, hb) = (sm_host_status(&sm_a).await, sm_host_status(&sm_b).await);
            ha.peers[0].last_error.is_empty()
                && hb.peers[0].last_error.is_empty()
                && ha.caught_up
                && hb.caught_up
        },
    )
    .await;
    // A few more rounds (500 ms each) and two forced sweeps of the master.
    tokio::time::sleep(Duration::from_secs(2)).await;
    fabric.hup_opensm();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (polls, seen) = poller.finish();
    eprintln!("node1 polled {polls} times from its RELEASED through the partition and the heal");
    assert!(polls > 10, "too few polls");
    assert!(!seen, "SAFETY: the released key came back on node1's port");
    assert!(!has_base(&fabric.pkeys("node1"), k1 as u16));
    for part in [&files.a.0, &files.b.0] {
        assert!(
            !region_of(part).contains(&format!("{k1:#06x}")),
            "SAFETY: a region still gives node1 the released key: {}",
            region_of(part)
        );
    }
    assert_eq!(region_of(&files.a.0), region_of(&files.b.0));
    assert!(has_base(&fabric.pkeys("node1"), k3 as u16));
    assert!(has_base(&fabric.pkeys("node2"), k2 as u16));
    assert!(sm_host_status(&sm_b).await.held_back_nodes.is_empty());
    for (who, c) in [
        ("smhost", conditions(&sm_a).await),
        ("smhost2", conditions(&sm_b).await),
    ] {
        assert!(!c.iter().any(|k| k == "SM_HOSTS_DISAGREE"), "{who}: {c:?}");
    }
    let a_state = get(&mut c1, "i-1").await;
    assert_eq!(state(&a_state), pb::AttachmentState::Released);
    drop((c1, c2));
    for mut a in [one, two] {
        assert!(a.stop().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // a lock between the two tests' own runtimes
async fn a_revocation_sent_to_one_sm_host_takes_the_key_off_the_port_through_the_other() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (pa, pb_) = (free_port(), free_port());
    let control_plane = GrantSigner::new("cp-1");
    let grants = format!(
        "[grants]\nrequire = true\n{}",
        control_plane.config_entry("")
    );
    let sm_a = SmHostAgent::start(
        &fabric,
        "smhost",
        &(ha_sm_config(&fabric, "smhost", pa, &files.sm_a(), &[pb_]) + &grants),
    );
    let sm_b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &(ha_sm_config(&fabric, "smhost2", pb_, &files.sm_b(), &[pa]) + &grants),
    );
    let one = Agent::start(
        &fabric,
        "node1",
        &(ha_node_config(&fabric, "node1", &[pa, pb_]) + &grants),
    );
    let mut c1 = one.client().await;
    let key = 0x0a51u32;
    let mut request = attach(
        "i-1",
        partition(&format!("ibpart_{key:04x}"), key),
        Some(30_000),
    );
    request.grant =
        Some(control_plane.sign(&grant("g-1", "fab1", "node1", "i-1", key, Membership::Full)));
    let a = attach_now(&mut c1, request).await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    assert!(has_base(&fabric.pkeys("node1"), key as u16));
    wait_until("both SM hosts caught up", LONG, || async {
        sm_host_status(&sm_a).await.caught_up && sm_host_status(&sm_b).await.caught_up
    })
    .await;

    // The control plane revokes i-1 at the standby's agent only.
    let mut to_b = PartitionsClient::connect(format!("http://127.0.0.1:{pb_}"))
        .await
        .expect("connect to the standby's agent");
    let revoked_at = std::time::Instant::now();
    let out = to_b
        .revoke_instance(smpb::RevokeInstanceRequest {
            node_id: "node1".into(),
            instance_id: "i-1".into(),
        })
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", sm_b.log_text()))
        .into_inner();
    assert_eq!(out.revoked_grant_ids, ["g-1"]);
    assert_eq!(out.removed_pkeys, [key]);
    assert!(!region_of(&files.b.0).contains(&format!("{key:#06x}")));

    // The master's agent learns it at its next pull: its file loses the key, and its OpenSM
    // takes node1's port out of the partition.
    wait_until(
        "the master's region without the revoked key",
        LONG,
        || async { !region_of(&files.a.0).contains(&format!("{key:#06x}")) },
    )
    .await;
    wait_until("the revoked key off node1's port", LONG, || async {
        !has_base(&fabric.pkeys("node1"), key as u16)
    })
    .await;
    eprintln!(
        "revoked at the standby's agent -> key off node1's port (master's agent, by PullNodeSets): {:?}",
        revoked_at.elapsed()
    );
    // The line comes once OpenSM confirmed the file, which may be after its sweep changed the
    // port.
    wait_until("the master's agent logs the revocation", LONG, || async {
        sm_a.log_text()
            .contains("took revocations from the peer SM hosts")
    })
    .await;

    // node1 still wants the key and still carries the revoked grant: both hosts refuse it.
    let mut to_a = PartitionsClient::connect(format!("http://127.0.0.1:{pa}"))
        .await
        .expect("connect to the master's agent");
    let guid1 = fabric.node_info("node1").port_guid;
    let signed = control_plane.sign(&grant("g-1", "fab1", "node1", "i-1", key, Membership::Full));
    for (who, c) in [("smhost", &mut to_a), ("smhost2", &mut to_b)] {
        let mut set = common::sm_requests::set_memberships("node1", &[guid1], &[key], 1 << 40);
        set.memberships.as_mut().expect("set").grants = vec![signed.clone()];
        let s = c.set_node_memberships(set).await.unwrap_err();
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{who}: {s:?}");
    }
    assert!(!has_base(&fabric.pkeys("node1"), key as u16));
    // node1's agent sees its key gone from its port and stops saying ACTIVE.
    wait_until("node1's attachment no longer ACTIVE", LONG, || {
        let mut c = c1.clone();
        async move { state(&get(&mut c, "i-1").await) != pb::AttachmentState::Active }
    })
    .await;
    let a = get(&mut c1, "i-1").await;
    eprintln!(
        "node1's attachment after the revocation: {:?} {}",
        state(&a),
        a.reason
    );
    drop(c1);
    let mut one = one;
    assert!(one.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // a lock between the tests' own runtimes
async fn a_node_reaching_one_sm_host_only_releases_once_the_other_has_its_set() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (pa, pb_) = (free_port(), free_port());
    let sm_a = SmHostAgent::start(
        &fabric,
        "smhost",
        &ha_sm_config(&fabric, "smhost", pa, &files.sm_a(), &[pb_]),
    );
    let sm_b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &ha_sm_config(&fabric, "smhost2", pb_, &files.sm_b(), &[pa]),
    );
    // node1 reaches the standby's agent only through a link the test cuts.
    let to_b = CuttableLink::start(pb_);
    let one = Agent::start(
        &fabric,
        "node1",
        &ha_node_config(&fabric, "node1", &[pa, to_b.port()]),
    );
    let mut c1 = one.client().await;
    let key = 0x0a61u32;
    let a = attach_now(
        &mut c1,
        attach(
            "i-1",
            partition(&format!("ibpart_{key:x}"), key),
            Some(30_000),
        ),
    )
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");

    to_b.cut();
    release(&mut c1, "i-1", None).await;
    // The master's host has the new set and programs it; the release waits for the other.
    wait_until("node1's key off its port", LONG, || async {
        !has_base(&fabric.pkeys("node1"), key as u16)
    })
    .await;
    let poller = Poller::start(&fabric, "node1", key as u16);
    let unreachable = format!("127.0.0.1:{}", to_b.port());
    wait_until(
        "the release's reason names the unreachable SM host",
        LONG,
        || {
            let mut c = c1.clone();
            let unreachable = unreachable.clone();
            async move {
                let a = get(&mut c, "i-1").await;
                state(&a) == pb::AttachmentState::Releasing && a.reason.contains(&unreachable)
            }
        },
    )
    .await;
    eprintln!(
        "while node1 reaches one SM host: {}",
        get(&mut c1, "i-1").await.reason
    );
    // The other host takes node1's new set from its peer.
    wait_until("the standby's region without node1's key", LONG, || async {
        !region_of(&files.b.0).contains(&format!("{key:#06x}"))
    })
    .await;
    assert_eq!(region_of(&files.a.0), region_of(&files.b.0));
    assert_eq!(
        state(&get(&mut c1, "i-1").await),
        pb::AttachmentState::Releasing
    );

    // The link heals: node1's retry reaches the standby's agent, which holds that generation
    // already (a retry), and the release completes.
    to_b.heal();
    wait_until("i-1 RELEASED", LONG, || {
        let mut c = c1.clone();
        async move { state(&get(&mut c, "i-1").await) == pb::AttachmentState::Released }
    })
    .await;
    // A forced sweep of the master after the release completed, still polled.
    fabric.hup_opensm();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (polls, seen) = poller.finish();
    eprintln!("node1 polled {polls} times from its key's removal to after RELEASED");
    assert!(polls > 5, "too few polls");
    assert!(!seen, "SAFETY: the released key came back on node1's port");
    assert!(!has_base(&fabric.pkeys("node1"), key as u16));
    drop(c1);
    let mut one = one;
    assert!(one.stop().success());
    drop((sm_a, sm_b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // a lock between the tests' own runtimes
async fn a_release_to_one_sm_host_consumes_the_grant_on_the_other_at_its_next_pull() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (pa, pb_) = (free_port(), free_port());
    let control_plane = GrantSigner::new("cp-1");
    let grants = format!(
        "[grants]\nrequire = true\n{}",
        control_plane.config_entry("")
    );
    let sm_a = SmHostAgent::start(
        &fabric,
        "smhost",
        &(ha_sm_config(&fabric, "smhost", pa, &files.sm_a(), &[pb_]) + &grants),
    );
    let sm_b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &(ha_sm_config(&fabric, "smhost2", pb_, &files.sm_b(), &[pa]) + &grants),
    );
    let mut one = Agent::start(
        &fabric,
        "node1",
        &(ha_node_config(&fabric, "node1", &[pa, pb_]) + &grants),
    );
    let mut c1 = one.client().await;
    let key = 0x0a61u32;
    let mut request = attach(
        "i-1",
        partition(&format!("ibpart_{key:04x}"), key),
        Some(30_000),
    );
    let g1 = control_plane.sign(&grant("g-1", "fab1", "node1", "i-1", key, Membership::Full));
    request.grant = Some(g1.clone());
    let a = attach_now(&mut c1, request).await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    wait_until(
        "both SM hosts caught up and holding the key",
        LONG,
        || async {
            sm_host_status(&sm_a).await.caught_up
                && sm_host_status(&sm_b).await.caught_up
                && region_of(&files.b.0).contains(&format!("{key:#06x}"))
        },
    )
    .await;
    // node1 is rooted from here on: its agent stops and the node speaks for itself.
    drop(c1);
    assert!(one.stop().success());
    let guid1 = fabric.node_info("node1").port_guid;
    let mut to_a = PartitionsClient::connect(format!("http://127.0.0.1:{pa}"))
        .await
        .expect("connect to the master's agent");
    let mut to_b = PartitionsClient::connect(format!("http://127.0.0.1:{pb_}"))
        .await
        .expect("connect to the standby's agent");
    // The release goes to the master's agent only: it consumes g-1 there.
    let generation = 1u64 << 40;
    to_a.set_node_memberships(common::sm_requests::set_memberships(
        "node1",
        &[guid1],
        &[],
        generation,
    ))
    .await
    .unwrap_or_else(|s| panic!("{s:?}\n{}", sm_a.log_text()));
    // The old grant, at a higher generation, goes to the standby's agent: taken, or refused
    // when the standby already pulled the release.
    let replay = |g: u64| {
        let mut set = common::sm_requests::set_memberships("node1", &[guid1], &[key], g);
        set.memberships.as_mut().expect("set").grants = vec![g1.clone()];
        set
    };
    let first = to_b.set_node_memberships(replay(generation + 1)).await;
    eprintln!(
        "the replay at the standby before its pull: {:?}",
        first.as_ref().map(|_| "OK").map_err(|s| s.code())
    );
    if let Err(s) = &first {
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    }
    // At its next pull the standby consumes g-1: its file (the one its OpenSM would program at
    // a failover) loses the key, and the replay is refused there.
    wait_until(
        "the standby's region without the consumed key",
        LONG,
        || async { !region_of(&files.b.0).contains(&format!("{key:#06x}")) },
    )
    .await;
    let s = to_b
        .set_node_memberships(replay(generation + 2))
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("consumed"), "{s:?}");
    assert!(!has_base(&fabric.pkeys("node1"), key as u16));
    drop((sm_a, sm_b));
}
