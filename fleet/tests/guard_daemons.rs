//! The fleet client against real `fabric-agent` daemons (embedded fabric, one temp dir each,
//! started and stopped by pid). The fabric's own view comes from a fake SM host
//! (`tests/common/fake_sm.rs`) the test controls, so it can lie or lag at will; the real SM
//! host's `ListPartitionMembers` is exercised by the root crate's `tests/opensm/fleet.rs`.

mod common;

use common::agent::Agent;
use common::{attach, fake_sm, fleet, nodes_file, partition, state_of, wait_for};
use fabric_fleet::{Blocker, Decision};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn blockers(d: Decision) -> Vec<Blocker> {
    match d {
        Decision::No(b) => b,
        Decision::Yes => panic!("the guard said yes"),
    }
}

fn port_of(f: &fabric_fleet::Fleet, node: &str) -> String {
    f.with_view(|v| v.nodes[node].durable.ports.iter().next().cloned())
        .expect("the node reported a fabric port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn may_delete_waits_for_every_node_released_and_the_fabric_empty() {
    let agents: Vec<Agent> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| Agent::start(n))
        .collect();
    let (sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<(&str, String)> = agents
        .iter()
        .map(|a| (a.node_id.as_str(), a.endpoint()))
        .collect();
    let text = nodes_file(&nodes, &sm_url);
    let store = dir.path().join("fleet.redb");
    let f = fleet(&text, &store);
    assert!(f.wait_settled(WAIT).await, "every node heard from");

    let p = partition("ibpart_del", 0x21);
    for a in &agents {
        let inst = format!("i-{}", a.node_id);
        let att = attach(&f, &a.node_id, &inst, &p).await;
        assert_eq!(
            fabric_fleet::view::state_name(att.state),
            "ACTIVE",
            "{att:?}"
        );
    }
    for a in &agents {
        let inst = format!("i-{}", a.node_id);
        wait_for("ACTIVE in the view", WAIT, || {
            (state_of(&f, &a.node_id, &inst).as_deref() == Some("ACTIVE")).then_some(())
        })
        .await;
    }
    let ports: Vec<String> = agents.iter().map(|a| port_of(&f, &a.node_id)).collect();
    let held: Vec<&str> = ports.iter().map(String::as_str).collect();
    sm.hold(0x21, &held);
    let b = blockers(f.may_delete("ibpart_del").await.unwrap());
    assert_eq!(
        b.iter()
            .filter(|b| matches!(b, Blocker::Instance { state, .. } if state == "ACTIVE"))
            .count(),
        3,
        "{b:#?}"
    );
    assert_eq!(
        b.iter()
            .filter(|b| matches!(b, Blocker::FabricHolds { .. }))
            .count(),
        3
    );

    // node-c's subnet manager becomes unreachable: its release cannot complete.
    std::fs::write(agents[2].fault_file(), "unreachable\n").unwrap();
    for a in &agents[..2] {
        f.release(&a.node_id, &format!("i-{}", a.node_id), Some(10_000))
            .await
            .unwrap();
    }
    f.release("node-c", "i-node-c", None).await.unwrap();
    for a in &agents[..2] {
        let inst = format!("i-{}", a.node_id);
        wait_for("RELEASED in the view", WAIT, || {
            (state_of(&f, &a.node_id, &inst).as_deref() == Some("RELEASED")).then_some(())
        })
        .await;
    }
    // The fabric dropped node-a and node-b's ports; node-c's is still there.
    sm.hold(0x21, &[&ports[2]]);
    // Give node-c time to try (and fail) its apply, so its last error is in the view.
    wait_for("node-c RELEASING with an error", WAIT, || {
        f.with_view(|v| {
            let i = v.nodes["node-c"].durable.instances.get("i-node-c")?;
            (fabric_fleet::view::state_name(i.state) == "RELEASING").then_some(())
        })
    })
    .await;
    let b = blockers(f.may_delete("ibpart_del").await.unwrap());
    let said: Vec<String> = b.iter().map(ToString::to_string).collect();
    assert_eq!(b.len(), 2, "{said:#?}");
    assert!(
        said[0].contains("instance i-node-c on node node-c is RELEASING"),
        "{said:#?}"
    );
    assert!(
        said[1].contains(&format!(
            "still holds port {} (node node-c) in 0x0021",
            ports[2]
        )),
        "{said:#?}"
    );

    // The SM comes back: node-c reaches RELEASED, but the fabric's view still holds its port.
    std::fs::write(agents[2].fault_file(), "").unwrap();
    wait_for("node-c RELEASED", WAIT, || {
        (state_of(&f, "node-c", "i-node-c").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    let b = blockers(f.may_delete("ibpart_del").await.unwrap());
    assert!(
        matches!(&b[..], [Blocker::FabricHolds { node_id, .. }] if node_id == "node-c"),
        "{b:#?}"
    );
    sm.hold(0x21, &[]);
    assert_eq!(f.may_delete("ibpart_del").await.unwrap(), Decision::Yes);
    // An unrelated partition with no attaches through this client: nothing blocks it.
    assert_eq!(f.may_delete("ibpart_other").await.unwrap(), Decision::Yes);
    f.shutdown().await;

    // The CLI on the same store and nodes file: exit 0 now, 1 naming the fabric when it holds
    // a port again.
    let nodes_path = dir.path().join("nodes.toml");
    std::fs::write(&nodes_path, &text).unwrap();
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fabric-fleet"))
            .arg("--nodes")
            .arg(&nodes_path)
            .arg("--store")
            .arg(&store)
            .args(["--sync-secs", "20"])
            .args(args)
            .output()
            .expect("run fabric-fleet")
    };
    let out = tokio::task::block_in_place(|| cli(&["may-delete", "ibpart_del"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    sm.hold(0x21, &[&ports[0]]);
    let out = tokio::task::block_in_place(|| cli(&["may-delete", "ibpart_del"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout.contains(&format!("still holds port {} (node node-a)", ports[0])),
        "{stdout}"
    );
    let out = tokio::task::block_in_place(|| cli(&["status"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for a in &agents {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{}\t", a.node_id)))
            .unwrap_or_else(|| panic!("{stdout}"));
        assert!(line.contains("\tyes\t"), "{line}");
    }
    let out = tokio::task::block_in_place(|| cli(&["partition", "ibpart_del"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("RELEASED").count(), 3, "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_is_resynced_and_the_guard_never_says_yes_early() {
    let mut agents: Vec<Agent> = ["wipe-1", "wipe-2"]
        .iter()
        .map(|n| Agent::start(n))
        .collect();
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<(&str, String)> = agents
        .iter()
        .map(|a| (a.node_id.as_str(), a.endpoint()))
        .collect();
    let f = std::sync::Arc::new(fleet(
        &nodes_file(&nodes, &sm_url),
        &dir.path().join("fleet.redb"),
    ));
    assert!(f.wait_settled(WAIT).await);
    let p = partition("ibpart_wipe", 0x22);
    attach(&f, "wipe-1", "i-1", &p).await;
    attach(&f, "wipe-2", "i-2", &p).await;
    f.release("wipe-1", "i-1", Some(10_000)).await.unwrap();
    wait_for("i-1 RELEASED and i-2 ACTIVE", WAIT, || {
        (state_of(&f, "wipe-1", "i-1").as_deref() == Some("RELEASED")
            && state_of(&f, "wipe-2", "i-2").as_deref() == Some("ACTIVE"))
        .then_some(())
    })
    .await;
    let old_epoch = f.with_view(|v| v.nodes["wipe-2"].durable.epoch.clone());

    // Ask the guard continuously while wipe-2 crashes, loses its state and comes back.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (f, stop) = (f.clone(), stop.clone());
        tokio::spawn(async move {
            let mut asked = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(Decision::Yes) = f.may_delete("ibpart_wipe").await {
                    return Err(asked);
                }
                asked += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(asked)
        })
    };
    agents[1].crash();
    agents[1].wipe_state();
    agents[1].spawn();
    let new_epoch = wait_for("wipe-2 resynced in a new epoch", WAIT, || {
        f.with_view(|v| {
            let n = &v.nodes["wipe-2"];
            (n.durable.epoch != old_epoch && n.live.reachable).then(|| n.durable.epoch.clone())
        })
    })
    .await;
    assert_ne!(new_epoch, old_epoch);
    let b = blockers(f.may_delete("ibpart_wipe").await.unwrap());
    assert!(
        matches!(&b[..], [Blocker::Instance { instance_id, node_id, state, .. }]
            if instance_id == "i-2" && node_id == "wipe-2" && state == "UNKNOWN"),
        "{b:#?}"
    );
    // Still RELEASED on wipe-1, whose follower never resynced.
    assert_eq!(state_of(&f, "wipe-1", "i-1").as_deref(), Some("RELEASED"));
    assert_eq!(f.with_view(|v| v.nodes["wipe-1"].live.resyncs), 1);

    // The control plane re-attaches on the wiped node; until it releases there, never yes.
    attach(&f, "wipe-2", "i-2", &p).await;
    wait_for("i-2 ACTIVE again", WAIT, || {
        (state_of(&f, "wipe-2", "i-2").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let asked = poller
        .await
        .unwrap()
        .unwrap_or_else(|n| panic!("yes after {n} questions, before the wiped node released"));
    assert!(asked > 0);
    f.release("wipe-2", "i-2", Some(10_000)).await.unwrap();
    wait_for("i-2 RELEASED", WAIT, || {
        (state_of(&f, "wipe-2", "i-2").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    assert_eq!(f.may_delete("ibpart_wipe").await.unwrap(), Decision::Yes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_resumes_from_its_persisted_cursor() {
    let mut agent = Agent::start("resume-1");
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let text = nodes_file(&[("resume-1", agent.endpoint())], &sm_url);
    let store = dir.path().join("fleet.redb");
    let f = fleet(&text, &store);
    let p = partition("ibpart_resume", 0x23);
    attach(&f, "resume-1", "i-r", &p).await;
    wait_for("ACTIVE", WAIT, || {
        (state_of(&f, "resume-1", "i-r").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    let (epoch, seq) = f.with_view(|v| {
        (
            v.nodes["resume-1"].durable.epoch.clone(),
            v.nodes["resume-1"].durable.seq,
        )
    });
    f.release("resume-1", "i-r", Some(10_000)).await.unwrap();
    wait_for("RELEASED", WAIT, || {
        (state_of(&f, "resume-1", "i-r").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    f.shutdown().await;

    // While the follower is down, another instance comes and goes.
    let registry = fabric_fleet::registry::Registry::parse(&text).unwrap();
    let offline = fabric_fleet::Fleet::open(registry, &store)
        .unwrap()
        .with_signer(common::signer());
    attach(
        &offline,
        "resume-1",
        "i-s",
        &partition("ibpart_resume", 0x23),
    )
    .await;
    offline
        .release("resume-1", "i-s", Some(10_000))
        .await
        .unwrap();
    drop(offline);

    let f = fleet(&text, &store);
    // The persisted view is there before anything is dialled, cursor included.
    assert!(f.with_view(|v| v.nodes["resume-1"].durable.seq) > seq);
    wait_for("i-s RELEASED after resuming", WAIT, || {
        (state_of(&f, "resume-1", "i-s").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    f.with_view(|v| {
        let n = &v.nodes["resume-1"];
        assert_eq!(n.durable.epoch, epoch);
        assert_eq!(n.live.resyncs, 0, "resumed from the cursor, no resync");
        assert!(n.live.events > 0);
    });
    assert_eq!(f.may_delete("ibpart_resume").await.unwrap(), Decision::Yes);

    // The agent stops cleanly (SIGTERM) and restarts on the same state: same epoch, the
    // follower reconnects from its cursor, again without a resync.
    agent.stop();
    wait_for("unreachable", WAIT, || {
        f.with_view(|v| v.nodes["resume-1"].live.unreachable_since_ms)
    })
    .await;
    agent.spawn();
    attach(&f, "resume-1", "i-t", &p).await;
    wait_for("i-t ACTIVE after the agent's clean restart", WAIT, || {
        (state_of(&f, "resume-1", "i-t").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    f.with_view(|v| {
        let n = &v.nodes["resume-1"];
        assert_eq!(n.durable.epoch, epoch, "a clean restart keeps the epoch");
        assert_eq!(n.live.resyncs, 0, "resumed from the cursor, no resync");
    });

    // The agent crashes (SIGKILL) and restarts: an unclean stop opens a new epoch (its store
    // could be a copy put back), so the follower resynchronises once and goes on.
    agent.crash();
    wait_for("unreachable", WAIT, || {
        f.with_view(|v| v.nodes["resume-1"].live.unreachable_since_ms)
    })
    .await;
    agent.spawn();
    wait_for("a resync into the new epoch", WAIT, || {
        f.with_view(|v| {
            let n = &v.nodes["resume-1"];
            (n.live.resyncs == 1 && n.durable.epoch != epoch).then_some(())
        })
    })
    .await;
    attach(&f, "resume-1", "i-u", &p).await;
    wait_for("i-u ACTIVE after the agent's crash", WAIT, || {
        (state_of(&f, "resume-1", "i-u").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    assert_eq!(
        state_of(&f, "resume-1", "i-t").as_deref(),
        Some("ACTIVE"),
        "the resync keeps what the node still holds"
    );
}
