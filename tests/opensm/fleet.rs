//! The control plane's client (`fabric-fleet`) against the ibsim + OpenSM rig: an SM-host agent
//! (OpenSM backend, grants required with a key this test generates, `fabric.sm.v1` over mTLS,
//! the control plane's certificate an operator client) and two node agents (remote backend
//! toward the SM host with their own certificates, SMP observers).
//!
//! Through the fleet library only (a nodes file written here, its `Signer` from a seed file, its
//! attach helper, followers and `may_delete`): one instance on each node is attached to one
//! partition with signed grants and reaches ACTIVE (`smpquery` shows the key on both ports, the
//! guard names both instances and both ports the SM host lists); node1's instance is released;
//! the SM-host agent is stopped and node2's release stays RELEASING: the guard answers No naming
//! that instance, node and state and, once node2 has tried, its error (`subnet manager
//! unavailable`), and `smpquery` shows node2's port still holding the key; the
//! SM-host agent starts again: node2 reaches RELEASED, `ListPartitionMembers` lists none of the
//! ports, the guard answers Yes, and `smpquery` and the partitions file agree that no port holds
//! the key (the file names neither port). Skipped through `common::skip` (a failure under CI or
//! the test command) when ibsim/OpenSM are missing.

use testkit::common;
use testkit::rig;

use common::free_port;
use common::pki::Pki;
use fabric_fleet::proto::agent::{Membership, Partition};
use fabric_fleet::proto::sm::partitions_client::PartitionsClient;
use fabric_fleet::proto::sm::ListPartitionMembersRequest;
use fabric_fleet::registry::Registry;
use fabric_fleet::view::state_name;
use fabric_fleet::{AttachSpec, Blocker, Decision, Fleet};
use rig::agents::{node_config, sm_tls_config, Agent};
use rig::{Fabric, FabricSpec};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";
const PKEY: u32 = 0x0c31;
const PARTITION: &str = "ibpart_c31";
const WAIT: Duration = Duration::from_secs(20);
const NODES: [(&str, &str); 2] = [("node1", "fr-1"), ("node2", "fr-2")];

/// Polls `f` every 100 ms until it returns `Some`, at most [`WAIT`]; panics naming `what`.
async fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The nodes whose port 1 holds `PKEY` (full or limited), by `smpquery` on each HCA.
fn holders(fabric: &Fabric) -> Vec<String> {
    tokio::task::block_in_place(|| {
        fabric
            .hcas()
            .into_iter()
            .filter(|n| {
                fabric
                    .pkeys(n)
                    .iter()
                    .any(|k| u32::from(k & 0x7fff) == PKEY)
            })
            .collect()
    })
}

/// Waits until `smpquery` shows exactly `expected` holding `PKEY`.
async fn wait_holders(fabric: &Fabric, expected: &[&str], what: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = holders(fabric);
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: smpquery shows {now:?} holding {PKEY:#06x}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn state_of(f: &Fleet, node: &str, instance: &str) -> Option<String> {
    f.with_view(|v| {
        v.nodes
            .get(node)?
            .durable
            .instances
            .get(instance)
            .map(|i| state_name(i.state).to_owned())
    })
}

fn blockers(d: Decision, what: &str) -> Vec<Blocker> {
    match d {
        Decision::No(b) => b,
        Decision::Yes => panic!("{what}: the guard said yes"),
    }
}

/// The port GUIDs `ListPartitionMembers` on the SM host lists in `PKEY`, and the view's source.
async fn members(sm: &mut PartitionsClient<tonic::transport::Channel>) -> (Vec<String>, String) {
    let r = sm
        .list_partition_members(ListPartitionMembersRequest { pkey: PKEY })
        .await
        .expect("ListPartitionMembers as the control plane")
        .into_inner();
    let mut guids: Vec<String> = r.members.into_iter().map(|m| m.port_guid).collect();
    guids.sort();
    (guids, r.source)
}

/// A 0600 file holding a fresh 32-byte Ed25519 seed.
fn write_seed(path: &Path) {
    let seed: [u8; 32] = rand::random();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(&seed))
        .expect("write the signing seed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_client_guards_a_partition_on_the_ibsim_opensm_rig() {
    let started = Instant::now();
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        common::skip("ibsim, OpenSM or umad2sim not installed");
        return;
    };
    let phase = |what: &str| {
        eprintln!(
            "fleet rig: {what} at {:.2} s",
            started.elapsed().as_secs_f64()
        )
    };
    phase("fabric up");
    let dir = fabric.dir().to_owned();
    let ca = dir.join("ca.pem");
    let pki = Pki::new("fab1 CA");
    pki.write_ca(&ca);

    // The control plane's signing key and nodes file; its Signer verifies the key file's mode.
    let seed = dir.join("cp-k1.seed");
    write_seed(&seed);
    let (cp_crt, cp_key) = pki.issue(&dir, "cp", &["control-plane.fab1.example"], "cp");
    let port = free_port();
    let mut nodes_file = format!(
        "[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         [signing]\nactive = \"cp-k1\"\nkeys = [{{ id = \"cp-k1\", file = \"{}\" }}]\n\
         [follow]\nbackoff_initial_ms = 50\nbackoff_max_ms = 500\ncall_timeout_ms = 3000\n\
         [[sm_host]]\nfabric = \"fab1\"\nendpoint = \"https://127.0.0.1:{port}\"\ndomain = \"localhost\"\n",
        ca.display(),
        cp_crt.display(),
        cp_key.display(),
        seed.display()
    );
    for (node, _) in NODES {
        nodes_file.push_str(&format!(
            "[[node]]\nid = \"{node}\"\nendpoint = \"unix://{}\"\n",
            dir.join(format!("{node}.sock")).display()
        ));
    }
    let nodes_path = dir.join("nodes.toml");
    std::fs::write(&nodes_path, &nodes_file).unwrap();
    let registry = Registry::load(&nodes_path).expect("nodes file");
    let signing = registry.signing.clone().expect("[signing]");
    let signer = fabric_fleet::grant::Signer::from_files(&signing.keys, &signing.active)
        .expect("the control plane's signer");
    let public = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        signer.public_keys()["cp-k1"],
    );
    let trust = format!(
        "[grants]\nrequire = true\n[[grants.keys]]\nid = \"cp-k1\"\npublic_key = \"{public}\"\n"
    );

    // The SM-host agent: OpenSM backend, mTLS, grants required, the control plane an operator.
    let (sm_crt, sm_key) = pki.issue_with(&dir, "smhost", &["localhost"], None, |_| {});
    let sm_conf = sm_tls_config(
        &fabric,
        port,
        &sm_crt,
        &sm_key,
        &ca,
        &["dns:control-plane.fab1.example"],
    ) + &trust;
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_conf);

    // Two node agents: remote backend toward the SM host with their own certificates.
    let mut agents = Vec::new();
    for (node, _) in NODES {
        let (crt, key) = pki.issue(&dir, node, &[&format!("{node}.nodes.fab1.example")], node);
        let conf = node_config(&fabric, node, port).replace(
            &format!("endpoint = \"http://127.0.0.1:{port}\"\n"),
            &format!(
                "endpoint = \"https://127.0.0.1:{port}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
                 domain_name = \"localhost\"\n",
                ca.display(),
                crt.display(),
                key.display()
            ),
        ) + &trust;
        agents.push(Agent::start(&fabric, node, &conf));
    }
    let logs = |agents: &[Agent], sm: &Agent| {
        let mut out = sm.log_text();
        for a in agents {
            out.push_str(&a.log_text());
        }
        out
    };

    // The fleet client: follow both nodes.
    let sm_endpoint = registry.sm_hosts[0].endpoint.clone();
    let mut fleet = Fleet::open(registry, &dir.join("fleet.redb"))
        .expect("open the fleet store")
        .with_signer(signer);
    fleet.follow();
    assert!(fleet.wait_settled(WAIT).await, "both nodes followed");
    let mut sm_client = PartitionsClient::new(
        fabric_fleet::connect::channel(&sm_endpoint, Duration::from_secs(20)).unwrap(),
    );
    let guids: Vec<String> = tokio::task::block_in_place(|| {
        NODES
            .iter()
            .map(|(n, _)| format!("{:#018x}", fabric.node_info(n).port_guid))
            .collect()
    });
    let mut sorted_guids = guids.clone();
    sorted_guids.sort();
    for ((node, _), guid) in NODES.iter().zip(&guids) {
        let reported = fleet.with_view(|v| v.nodes[*node].durable.ports.clone());
        assert!(
            reported.contains(guid),
            "{node} reports ports {reported:?}, smpquery says {guid}"
        );
    }

    // Attach one instance per node with the control plane's signed grants: both ACTIVE.
    let partition = Partition {
        id: PARTITION.into(),
        name: "fleet-rig".into(),
        workspace: "ws".into(),
        account: "acct".into(),
        fabric: "fab1".into(),
        pkey: PKEY,
    };
    for (node, instance) in NODES {
        let a = fleet
            .attach(AttachSpec {
                node_id: node.into(),
                instance_id: instance.into(),
                partition: partition.clone(),
                membership: Membership::Full,
                wait_ms: Some(20_000),
                ports: Vec::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("attach {instance} on {node}: {e}"))
            .attachment
            .expect("attachment");
        assert_eq!(
            state_name(a.state),
            "ACTIVE",
            "{a:?}\n{}",
            logs(&agents, &sm)
        );
    }
    phase("both attached");
    wait_holders(&fabric, &["node1", "node2"], "both attaches").await;
    for (node, instance) in NODES {
        wait_until(&format!("{instance} ACTIVE in the fleet's view"), || {
            (state_of(&fleet, node, instance).as_deref() == Some("ACTIVE")).then_some(())
        })
        .await;
    }
    let (listed, source) = members(&mut sm_client).await;
    assert_eq!(listed, sorted_guids, "the SM host lists both ports");
    let file = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(
        guids.iter().all(|g| file.contains(g.as_str())),
        "the partitions file names both ports {guids:?}:\n{file}"
    );
    assert_eq!(source, "partitions-file-fallback");
    let b = blockers(fleet.may_delete(PARTITION).await.unwrap(), "both ACTIVE");
    let said: Vec<String> = b.iter().map(ToString::to_string).collect();
    assert_eq!(b.len(), 4, "{said:#?}");
    for ((node, instance), guid) in NODES.iter().zip(&guids) {
        assert!(
            said.iter()
                .any(|s| s.contains(&format!("instance {instance} on node {node} is ACTIVE"))),
            "{said:#?}"
        );
        assert!(
            b.iter().any(
                |x| matches!(x, Blocker::FabricHolds { port_guid, node_id, source, .. }
                if port_guid == guid && node_id == node && source == "partitions-file-fallback")
            ),
            "{said:#?}"
        );
    }

    // node1's instance is released; then the SM host stops and node2's release cannot finish.
    let r = fleet
        .release("node1", "fr-1", Some(20_000))
        .await
        .expect("release fr-1");
    assert_eq!(
        state_name(r.attachment.expect("attachment").state),
        "RELEASED"
    );
    wait_holders(&fabric, &["node2"], "node1's release").await;
    phase("fr-1 released");
    let sm_pid = sm.pid();
    let status = sm.stop();
    assert!(
        status.success(),
        "the SM-host agent (pid {sm_pid}) exited with {status}"
    );
    // node2's agent takes the release; the revocation that follows cannot reach the stopped
    // SM host, and the fleet says so (with node2's answer).
    let r = match fleet.release("node2", "fr-2", None).await {
        Err(fabric_fleet::FleetError::Revoke {
            released, failures, ..
        }) => {
            assert_eq!(failures.len(), 1, "{failures:?}");
            *released
        }
        other => panic!("release fr-2 with the SM host stopped: {other:?}"),
    };
    assert_eq!(
        state_name(r.attachment.expect("attachment").state),
        "RELEASING"
    );
    wait_until("fr-1 RELEASED and fr-2 RELEASING in the view", || {
        (state_of(&fleet, "node1", "fr-1").as_deref() == Some("RELEASED")
            && state_of(&fleet, "node2", "fr-2").as_deref() == Some("RELEASING"))
        .then_some(())
    })
    .await;
    // node2's agent tried its release against the stopped SM host and says so.
    wait_until(
        "node2's subnet manager unreachable in the fleet's view",
        || {
            fleet
                .with_view(|v| !v.nodes["node2"].live.sm_reachable)
                .then_some(())
        },
    )
    .await;
    // Asked until the blocker carries node2's own word on the failing release (not the
    // transition's reason): every answer meanwhile is No with exactly that blocker.
    let deadline = Instant::now() + WAIT;
    let said = loop {
        let b = blockers(
            fleet.may_delete(PARTITION).await.unwrap(),
            "node2 RELEASING",
        );
        let said: Vec<String> = b.iter().map(ToString::to_string).collect();
        assert!(
            matches!(&b[..], [Blocker::Instance { instance_id, node_id, state, since_ms: Some(_), .. }]
                if instance_id == "fr-2" && node_id == "node2" && state == "RELEASING"),
            "{said:#?}"
        );
        assert!(
            said[0].contains("instance fr-2 on node node2 is RELEASING since"),
            "{said:#?}"
        );
        if said[0].contains("last error: subnet manager unavailable") {
            break said;
        }
        assert!(
            Instant::now() < deadline,
            "the blocker never named the subnet manager: {said:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("fleet rig: blockers while the SM host is stopped: {said:#?}");
    assert_eq!(
        state_of(&fleet, "node2", "fr-2").as_deref(),
        Some("RELEASING"),
        "still RELEASING while the SM host is stopped"
    );
    assert_eq!(
        holders(&fabric),
        vec!["node2".to_owned()],
        "smpquery: node2's port still holds the key"
    );

    // The SM host comes back: node2 reaches RELEASED and the fabric lets go of its port.
    phase("guard said No while the SM host is stopped");
    sm.spawn(&fabric);
    for (node, instance) in NODES {
        wait_until(&format!("{instance} RELEASED in the fleet's view"), || {
            (state_of(&fleet, node, instance).as_deref() == Some("RELEASED")).then_some(())
        })
        .await;
    }
    let (listed, _) = members(&mut sm_client).await;
    assert!(
        listed.iter().all(|g| !guids.contains(g)),
        "the SM host still lists {listed:?}"
    );
    assert_eq!(
        fleet.may_delete(PARTITION).await.unwrap(),
        Decision::Yes,
        "both RELEASED and the SM host lists none of their ports"
    );
    phase("guard said Yes");
    wait_holders(&fabric, &[], "node2's release").await;
    let file = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(
        guids.iter().all(|g| !file.contains(g.as_str())),
        "the partitions file still names a port of {guids:?}:\n{file}"
    );

    fleet.shutdown().await;
    drop(agents);
    drop(sm);
    eprintln!(
        "fleet rig: {:.1} s from the fabric's start",
        started.elapsed().as_secs_f64()
    );
}
