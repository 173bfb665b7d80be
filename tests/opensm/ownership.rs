//! Port ownership on the ibsim + OpenSM fabric: the SM-host agent (under the shim, asking the
//! SA through umad) refuses node1's claims on a switch port, the SM's port, a GUID the fabric
//! does not have, node2's port and a port whose NodeDescription names nobody — each with a
//! clear status, nothing written and OpenSM's tables unchanged (`smpquery pkeys`); the
//! operator's inventory allows a port; an unreachable SA refuses (UNAVAILABLE); and a port
//! moved to another node (ibsim console `Guid`: out of node2's HCA, a sweep, into an HCA
//! named "node1 mlx5_1", a sweep) is accepted only once the SA shows it there, and leaves its
//! old node's set.
//!
//! The SM-host agent observes a sysfs fixture, not SMPs: under umad2sim a process routes each
//! management class to one umad fd, so the ownership check's SA session cannot share the
//! process with an SMP observer (see docs/OPENSM.md).

use testkit::common;
use testkit::rig;

use common::sm_requests::set_memberships;
use common::{free_port, has_base};
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::agents::Agent;
use rig::{Fabric, FabricSpec, SM_HOST};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

const CONVERGE: Duration = Duration::from_secs(20);
const UNKNOWN_GUID: u64 = 0x0002_c903_000e_0b72;
/// Tenant ports are limited members of the default partition (else no tenant key is served).
const PARTITIONS: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";

fn spec() -> FabricSpec {
    let mut spec = FabricSpec::new(1, 5);
    for (node, description) in [
        ("node3", "node2 mlx5_1"),
        ("node4", "node1 mlx5_1"),
        ("node5", "spare mlx5_0"),
    ] {
        spec.descriptions
            .insert(node.to_owned(), description.to_owned());
    }
    spec
}

/// The SM-host agent: OpenSM backend with ownership checks (ibsim names its HCAs `node1`, so
/// the bare node id is a pattern too), Partitions on loopback TCP, a sysfs fixture as its own
/// ports (read with std, which the shim does not redirect).
fn sm_config(fabric: &Fabric, port: u16) -> String {
    let d = fabric.dir().display();
    rig::agents::sm_config_with(
        fabric,
        port,
        &format!(
            "description_patterns = [\"{{node}}\", \"{{node}} *\"]\n\
             inventory_file = \"{d}/inventory.toml\"\nsa_timeout_ms = 300\nsa_retries = 1\nsa_deadline_ms = 2000\n"
        ),
        &format!(
            "kind = \"sysfs\"\nsysfs_root = \"{}\"\nslow_poll_ms = 2000\n",
            std::fs::canonicalize("tests/fixtures/sysfs/mlx5-8x")
                .expect("fixture")
                .display(),
        ),
    )
}

async fn start(fabric: &Fabric) -> (Agent, PartitionsClient<Channel>) {
    std::fs::write(fabric.dir().join("inventory.toml"), "").unwrap();
    let port = free_port();
    let sm = Agent::start(fabric, SM_HOST, &sm_config(fabric, port));
    let client = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the SM host");
    (sm, client)
}

async fn held(client: &mut PartitionsClient<Channel>, node: &str) -> smpb::NodeMemberships {
    client
        .get_node_memberships(smpb::GetNodeMembershipsRequest {
            node_id: node.into(),
        })
        .await
        .expect("stored set")
        .into_inner()
}

/// One port as the SA reports it (`saquery NR <lid>`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SaPort {
    lid: u16,
    switch: bool,
    port_guid: u64,
    description: String,
}

fn sa_field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let l = l.trim();
        let rest = l.strip_prefix(name)?;
        rest.starts_with('.')
            .then(|| rest.trim_start_matches('.').trim().to_owned())
    })
}

/// Every port the SA knows, asked LID by LID (one record per answer: the shim cuts RMPP), from
/// the SM host's port: the SA shows a limited member of the default partition only the
/// records of ports it shares a partition with.
fn sa_ports(fabric: &Fabric) -> Vec<SaPort> {
    (1..=12u16)
        .filter_map(|lid| {
            let text = fabric
                .run_tool(SM_HOST, "saquery", &["NR", &lid.to_string()])
                .ok()?;
            Some(SaPort {
                lid: sa_field(&text, "lid")?.parse().ok()?,
                switch: sa_field(&text, "node_type")? == "Switch",
                port_guid: u64::from_str_radix(
                    sa_field(&text, "port_guid")?.trim_start_matches("0x"),
                    16,
                )
                .ok()?,
                description: sa_field(&text, "NodeDescription")?,
            })
        })
        .collect()
}

/// Waits up to `CONVERGE` for `done`.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    common::wait_until(what, CONVERGE, || std::future::ready(done())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node1_may_claim_only_ports_the_fabric_or_the_inventory_shows_in_node1() {
    let Some(mut fabric) = Fabric::start(&spec(), PARTITIONS) else {
        return;
    };
    let (mut sm, mut client) = start(&fabric).await;
    let guid = |node: &str| fabric.node_info(node).port_guid;
    let (g1, g2, g4, g5, sm_port) = (
        guid("node1"),
        guid("node2"),
        guid("node4"),
        guid("node5"),
        guid(SM_HOST),
    );
    let ports = sa_ports(&fabric);
    eprintln!("SA ports: {ports:?}");
    let switch = ports
        .iter()
        .find(|p| p.switch)
        .expect("a switch port")
        .port_guid;
    assert_eq!(
        ports
            .iter()
            .find(|p| p.port_guid == g5)
            .map(|p| p.description.as_str()),
        Some("spare mlx5_0"),
        "ibsim takes the NodeDescription from the net file's comment"
    );

    // Each node claims its own port: proven by the fabric (NodeDescription = node id).
    client
        .set_node_memberships(set_memberships("node1", &[g1], &[0x0a51], 1))
        .await
        .expect("node1's own port");
    client
        .set_node_memberships(set_memberships("node2", &[g2], &[0x0a52], 1))
        .await
        .expect("node2's own port");
    wait_until("both keys on their nodes", || {
        has_base(&fabric.pkeys("node1"), 0x0a51) && has_base(&fabric.pkeys("node2"), 0x0a52)
    })
    .await;

    let file = std::fs::read(fabric.partitions_path()).unwrap();
    let watched = ["node1", "node2", "node5", SM_HOST];
    let tables: Vec<Vec<u16>> = watched.iter().map(|n| fabric.pkeys(n)).collect();
    for (claimed, code, reason) in [
        (switch, Code::PermissionDenied, "a switch"),
        (sm_port, Code::PermissionDenied, "SM host's own port"),
        (UNKNOWN_GUID, Code::FailedPrecondition, "knows no such port"),
        (g2, Code::PermissionDenied, "belongs to node \"node2\""),
        (g5, Code::FailedPrecondition, "does not name node \"node1\""),
    ] {
        let asked = Instant::now();
        // The set keeps node1's stored keys, so nothing else would change: refused, nothing
        // stored or written (a refused port with other changes: tests/opensm/isolation.rs).
        let status = client
            .set_node_memberships(set_memberships("node1", &[g1, claimed], &[0x0a51], 2))
            .await
            .expect_err("refused");
        // One SA session: open umad0, NodeInfo + PortInfo SMPs, one NodeRecord GetTable.
        eprintln!(
            "refusal of {claimed:#x} answered in {:?}: {status:?}",
            asked.elapsed()
        );
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(&format!("{claimed:#018x}"))
                && status.message().contains(reason),
            "{status:?}"
        );
        assert_eq!(
            std::fs::read(fabric.partitions_path()).unwrap(),
            file,
            "nothing written"
        );
        let stored = held(&mut client, "node1").await;
        assert_eq!((stored.generation, stored.port_guids.len()), (1, 1));
    }
    // OpenSM's tables are unchanged (a sweep would have had nothing new to program anyway:
    // read them after a forced heavy sweep to be sure nothing is pending).
    fabric.hup_opensm();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (node, before) in watched.iter().zip(&tables) {
        assert_eq!(&fabric.pkeys(node), before, "{node}'s P_Key table changed");
        assert!(!has_base(before, 0x0a53));
    }
    assert!(
        sm.log_text().contains("port claim refused"),
        "refusals are logged"
    );

    // The operator's inventory lists the spare HCA for node1: accepted, and OpenSM programs it.
    std::fs::write(
        fabric.dir().join("inventory.toml"),
        format!("node1 = [\"0x{g5:016x}\"]\n"),
    )
    .unwrap();
    client
        .set_node_memberships(set_memberships("node1", &[g1, g5], &[0x0a51, 0x0a53], 2))
        .await
        .expect("listed in the inventory");
    wait_until("0x8a53 on the spare HCA", || {
        has_base(&fabric.pkeys("node5"), 0x0a53)
    })
    .await;
    // A broken inventory refuses every new claim.
    std::fs::write(fabric.dir().join("inventory.toml"), "node1 = [\"0x5\"]\n").unwrap();
    let status = client
        .set_node_memberships(set_memberships(
            "node1",
            &[g1, g5, g4],
            &[0x0a51, 0x0a53],
            3,
        ))
        .await
        .expect_err("broken inventory");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("inventory"), "{status:?}");

    // No SA (OpenSM stopped): a new claim is refused UNAVAILABLE, never accepted.
    std::fs::write(fabric.dir().join("inventory.toml"), "").unwrap();
    let file = std::fs::read(fabric.partitions_path()).unwrap();
    fabric.stop_opensm(false);
    let started = Instant::now();
    let status = client
        .set_node_memberships(set_memberships(
            "node1",
            &[g1, g5, g4],
            &[0x0a51, 0x0a53],
            3,
        ))
        .await
        .expect_err("SA unreachable");
    eprintln!("SA unreachable after {:?}: {status:?}", started.elapsed());
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by sa_deadline_ms"
    );
    assert_eq!(std::fs::read(fabric.partitions_path()).unwrap(), file);
    assert_eq!(held(&mut client, "node1").await.generation, 2);
    assert!(sm.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_port_changes_owner_only_once_the_fabric_shows_it_in_the_new_node() {
    let Some(mut fabric) = Fabric::start(&spec(), PARTITIONS) else {
        return;
    };
    let (mut sm, mut client) = start(&fabric).await;
    let g1 = fabric.node_info("node1").port_guid;
    let g2 = fabric.node_info("node2").port_guid;
    let g3 = fabric.node_info("node3").port_guid; // "node2 mlx5_1": node2's second HCA

    client
        .set_node_memberships(set_memberships("node2", &[g2, g3], &[0x0a52], 1))
        .await
        .expect("node2's two HCAs");
    client
        .set_node_memberships(set_memberships("node1", &[g1], &[0x0a51], 1))
        .await
        .expect("node1's own port");
    let status = client
        .set_node_memberships(set_memberships("node1", &[g1, g3], &[0x0a51], 2))
        .await
        .expect_err("node2's port");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("\"node2 mlx5_1\""), "{status:?}");

    // The card is pulled from node2's chassis (node3's HCA takes another GUID) and, after a
    // sweep, is gone from the fabric: still node2's, so node1 may not have it.
    let elsewhere = 0x0002_c903_00ab_0000u64;
    fabric
        .ibsim_console(&format!("Guid \"node3\" {elsewhere:#x}"))
        .unwrap();
    wait_until("ibsim changed node3's GUID", || {
        fabric.node_info("node3").port_guid == elsewhere + 1
    })
    .await;
    fabric.hup_opensm();
    wait_until("the SA no longer shows the port", || {
        let ports = sa_ports(&fabric);
        ports.iter().any(|p| p.port_guid == elsewhere + 1)
            && !ports.iter().any(|p| p.port_guid == g3)
    })
    .await;
    let status = client
        .set_node_memberships(set_memberships("node1", &[g1, g3], &[0x0a51], 2))
        .await
        .expect_err("the fabric does not show it in node1");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("does not show it"), "{status:?}");

    // It goes into node1's chassis (node4's HCA, "node1 mlx5_1", takes its GUIDs: port GUID =
    // node GUID + 1 under ibsim). OpenSM reads a NodeDescription when it discovers a node, so
    // the card had to leave the fabric first (it does on real hosts too; rdma-ndd then renames
    // it and OpenSM re-reads it on the NodeDescription-changed trap).
    fabric
        .ibsim_console(&format!("Guid \"node4\" {:#x}", g3 - 1))
        .unwrap();
    wait_until("ibsim moved the GUID", || {
        fabric.node_info("node4").port_guid == g3
    })
    .await;
    fabric.hup_opensm();
    wait_until("the SA shows the port in node1", || {
        sa_ports(&fabric)
            .iter()
            .any(|p| p.port_guid == g3 && p.description == "node1 mlx5_1")
    })
    .await;
    client
        .set_node_memberships(set_memberships("node1", &[g1, g3], &[0x0a51], 2))
        .await
        .expect("the fabric shows it in node1");
    let node2 = held(&mut client, "node2").await;
    assert_eq!(
        node2.port_guids,
        vec![format!("0x{g2:016x}")],
        "it left node2's set"
    );
    assert_eq!(node2.generation, 1);
    wait_until("node1's key on the moved port, node2's gone", || {
        let keys = fabric.pkeys("node4");
        has_base(&keys, 0x0a51) && !has_base(&keys, 0x0a52)
    })
    .await;
    // node2 claiming it back (a newer set) is refused: the fabric shows it in node1.
    let status = client
        .set_node_memberships(set_memberships("node2", &[g2, g3], &[0x0a52], 2))
        .await
        .expect_err("no longer node2's");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(sm.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_several_nodes_are_each_checked_and_accepted() {
    let Some(fabric) = Fabric::start(&spec(), PARTITIONS) else {
        return;
    };
    let (mut sm, client) = start(&fabric).await;
    let guid = |node: &str| fabric.node_info(node).port_guid;
    let (g1, g2, g3, g4) = (guid("node1"), guid("node2"), guid("node3"), guid("node4"));
    // Each node claims its two HCAs at once, several times over (retries ask nothing again,
    // new generations of the same set neither): every SA session runs alone.
    let mut tasks = Vec::new();
    for (node, guids, key) in [("node1", [g1, g4], 0x0a51), ("node2", [g2, g3], 0x0a52)] {
        for generation in 1..=3 {
            let mut c = client.clone();
            tasks.push(tokio::spawn(async move {
                c.set_node_memberships(set_memberships(node, &guids, &[key], generation))
                    .await
                    .map(|_| ())
            }));
        }
    }
    for t in tasks {
        // A later generation may have been stored first: the earlier one is then ABORTED.
        match t.await.unwrap() {
            Ok(()) => {}
            Err(s) => assert_eq!(s.code(), Code::Aborted, "{s:?}"),
        }
    }
    let mut c = client.clone();
    for (node, guids) in [("node1", [g1, g4]), ("node2", [g2, g3])] {
        let stored = held(&mut c, node).await;
        assert_eq!(stored.generation, 3, "{node}");
        let mut want: Vec<String> = guids.iter().map(|g| format!("0x{g:016x}")).collect();
        let mut got = stored.port_guids.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{node}");
    }
    wait_until("each key on both HCAs of its node", || {
        has_base(&fabric.pkeys("node1"), 0x0a51)
            && has_base(&fabric.pkeys("node4"), 0x0a51)
            && has_base(&fabric.pkeys("node2"), 0x0a52)
            && has_base(&fabric.pkeys("node3"), 0x0a52)
    })
    .await;
    assert!(!sm.log_text().contains("port claim refused"));
    assert!(sm.stop().success());
}
