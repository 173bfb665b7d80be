//! The fleet client names an instance's ports: against a real `fabric-agent` daemon (embedded
//! fabric, two ports `sim0/1` and `sim0/2`), an instance attached on `sim0/1` covers that port
//! only, another partition is refused on it (FAILED_PRECONDITION naming the holder) and
//! accepted on `sim0/2`; the same through `fabric-fleet attach --port`.

mod common;

use common::agent::Agent;
use common::{fake_sm, fleet, fleet_cli, nodes_file, partition};
use fabric_fleet::proto::agent::{Membership, PortName};
use fabric_fleet::{AttachSpec, FleetError};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn on(node: &str, instance: &str, id: &str, pkey: u32, port: &str) -> AttachSpec {
    let (device, n) = port.rsplit_once('/').expect("device/port");
    AttachSpec {
        node_id: node.into(),
        instance_id: instance.into(),
        partition: partition(id, pkey),
        membership: Membership::Full,
        wait_ms: Some(10_000),
        ports: vec![PortName {
            device: device.into(),
            port_number: n.parse().expect("port number"),
            port_guid: String::new(),
        }],
    }
}

/// Attaches `spec`, which must be accepted; the attachment.
async fn attached(
    f: &fabric_fleet::Fleet,
    spec: AttachSpec,
) -> fabric_fleet::proto::agent::Attachment {
    let what = format!("{} on {:?}", spec.instance_id, spec.ports);
    f.attach(spec)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .attachment
        .expect("attachment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_names_its_ports_and_a_port_carries_one_partition() {
    let agent = Agent::start("node-p");
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let text = nodes_file(&[("node-p", agent.endpoint())], &sm_url);
    let f = fleet(&text, &dir.path().join("fleet.redb"));
    assert!(f.wait_settled(WAIT).await, "the node heard from");

    let x = attached(&f, on("node-p", "vm-x", "ibpart_x", 0x31, "sim0/1")).await;
    assert_eq!(fabric_fleet::view::state_name(x.state), "ACTIVE", "{x:?}");
    assert!(x.named_ports, "{x:?}");
    let covered: Vec<(&str, u32)> = x
        .ports
        .iter()
        .map(|p| (p.device.as_str(), p.port_number))
        .collect();
    assert_eq!(covered, [("sim0", 1)], "{x:?}");

    // Another partition on the same port: refused, naming the holder; nothing attached.
    let e = f
        .attach(on("node-p", "vm-y", "ibpart_y", 0x32, "sim0/1"))
        .await
        .expect_err("sim0/1 carries ibpart_x");
    match &e {
        FleetError::Node { code, message, .. } => {
            assert_eq!(*code, tonic::Code::FailedPrecondition, "{e}");
            assert!(
                message.contains("vm-x") && message.contains("ibpart_x"),
                "{message}"
            );
        }
        other => panic!("not the node's refusal: {other}"),
    }
    // On the other port: accepted.
    let y = attached(&f, on("node-p", "vm-y", "ibpart_y", 0x32, "sim0/2")).await;
    assert_eq!(fabric_fleet::view::state_name(y.state), "ACTIVE", "{y:?}");
    assert_eq!(y.ports.len(), 1, "{y:?}");
    assert_eq!(y.ports[0].port_number, 2, "{y:?}");
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_fleet_attach_takes_ports() {
    let agent = Agent::start("node-c");
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k1.seed");
    let keygen = std::process::Command::new(env!("CARGO_BIN_EXE_fabric-fleet"))
        .args(["grant", "keygen", "--out"])
        .arg(&key)
        .output()
        .expect("keygen");
    assert_eq!(keygen.status.code(), Some(0), "{keygen:?}");
    let nodes = dir.path().join("nodes.toml");
    std::fs::write(
        &nodes,
        format!(
            "{}[signing]\nactive = \"k1\"\nkeys = [{{ id = \"k1\", file = \"{}\" }}]\n",
            nodes_file(&[("node-c", agent.endpoint())], &sm_url),
            key.display()
        ),
    )
    .unwrap();
    let store = dir.path().join("fleet.redb");
    let attach_with = |instance: &str, id: &str, pkey: &str, port: &str, more: &[&str]| {
        let mut args = vec![
            "attach",
            "--node",
            "node-c",
            "--instance",
            instance,
            "--partition-id",
            id,
            "--name",
            "p",
            "--workspace",
            "ws",
            "--account",
            "acct",
            "--fabric",
            "fab1",
            "--pkey",
            pkey,
            "--wait-ms",
            "10000",
            "--port",
            port,
        ];
        args.extend_from_slice(more);
        fleet_cli(&nodes, &store, &args)
    };
    let attach = |instance: &str, id: &str, pkey: &str, port: &str| {
        attach_with(instance, id, pkey, port, &[])
    };
    let out = attach("vm-a", "ibpart_a", "0x41", "sim0/2");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // instance, partition, state, P_Key with the membership bit, the ports covered, reason.
    let fields: Vec<&str> = text.trim_end().split('\t').collect();
    assert_eq!(
        fields,
        ["vm-a", "ibpart_a", "ACTIVE", "0x8041", "sim0/2", "-"],
        "{text}"
    );

    // The same as JSON, on the other port (a second instance of the partition).
    let out = attach_with("vm-a2", "ibpart_a", "0x41", "sim0/1", &["-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["instance_id"], "vm-a2", "{doc}");
    assert_eq!(doc["state"], "ACTIVE", "{doc}");
    assert_eq!(doc["pkey"], "0x8041", "{doc}");
    assert_eq!(doc["pkey_base"], "0x0041", "{doc}");
    assert_eq!(doc["membership"], "FULL", "{doc}");
    assert_eq!(doc["named_ports"], true, "{doc}");
    let ports = doc["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1, "{doc}");
    assert_eq!(ports[0]["name"], "sim0/1", "{doc}");
    assert_eq!(ports[0]["device"], "sim0", "{doc}");
    assert_eq!(ports[0]["port_number"], 1, "{doc}");
    assert!(
        ports[0]["port_guid"]
            .as_str()
            .is_some_and(|g| g.starts_with("0x")),
        "{doc}"
    );

    // sim0/2 carries ibpart_a now: ibpart_b is refused there with the node's reason.
    let out = attach("vm-b", "ibpart_b", "0x42", "sim0/2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(
        err.contains("FailedPrecondition") && err.contains("vm-a"),
        "{err}"
    );

    // A malformed port is a usage error, before any node is asked.
    let out = attach("vm-b", "ibpart_b", "0x42", "sim0/0");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sim0/0"));
}
