//! Shared support of the fleet crate's integration tests: real `fabric-agent` daemons by pid,
//! an in-process fake agent, a fake SM host (`fabric.sm.v1.Partitions`), waiting.

#![allow(dead_code)]

pub mod agent;
pub mod fake_agent;
pub mod fake_sm;

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some`, at most `limit`; panics naming `what`.
pub async fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A signer with one fixed test key.
pub fn signer() -> fabric_fleet::grant::Signer {
    fabric_fleet::grant::Signer::new(vec![("test-k1".into(), [42u8; 32])], "test-k1")
        .expect("signer")
}

/// The test partition on fabric `fab1`.
pub fn partition(id: &str, pkey: u32) -> fabric_fleet::proto::agent::Partition {
    fabric_fleet::proto::agent::Partition {
        id: id.into(),
        name: format!("name-{pkey:x}"),
        workspace: "ws".into(),
        account: "acct".into(),
        fabric: "fab1".into(),
        pkey,
    }
}

/// A nodes file for `nodes` (id, endpoint) and one SM host for `fab1`, with fast reconnects.
pub fn nodes_file(nodes: &[(&str, String)], sm_url: &str) -> String {
    let mut text = String::from(
        "[follow]\nbackoff_initial_ms = 50\nbackoff_max_ms = 500\ncall_timeout_ms = 5000\n",
    );
    for (id, endpoint) in nodes {
        text.push_str(&format!(
            "[[node]]\nid = \"{id}\"\nendpoint = \"{endpoint}\"\n"
        ));
    }
    text.push_str(&format!(
        "[[sm_host]]\nfabric = \"fab1\"\nendpoint = \"{sm_url}\"\n"
    ));
    text
}

/// `fabric-fleet --nodes NODES --store STORE --sync-secs 5 ARGS`, run to its end.
pub fn fleet_cli(
    nodes: &std::path::Path,
    store: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fabric-fleet"))
        .arg("--nodes")
        .arg(nodes)
        .arg("--store")
        .arg(store)
        .args(["--sync-secs", "5"])
        .args(args)
        .output()
        .expect("run fabric-fleet")
}

/// Opens a fleet on `text` with the test signer and starts following.
pub fn fleet(text: &str, store: &std::path::Path) -> fabric_fleet::Fleet {
    let registry = fabric_fleet::registry::Registry::parse(text).expect("nodes file");
    let mut f = fabric_fleet::Fleet::open(registry, store)
        .expect("open fleet")
        .with_signer(signer());
    f.follow();
    f
}

/// The state the fleet's view holds for an instance on a node, by name.
pub fn state_of(fleet: &fabric_fleet::Fleet, node: &str, instance: &str) -> Option<String> {
    fleet.with_view(|v| {
        v.nodes
            .get(node)
            .and_then(|n| n.durable.instances.get(instance))
            .map(|i| fabric_fleet::view::state_name(i.state).to_owned())
    })
}

/// Attaches through the fleet's helper (full membership), waiting up to 10 s for ACTIVE.
pub async fn attach(
    fleet: &fabric_fleet::Fleet,
    node: &str,
    instance: &str,
    partition: &fabric_fleet::proto::agent::Partition,
) -> fabric_fleet::proto::agent::Attachment {
    attach_waiting(fleet, node, instance, partition, Some(10_000)).await
}

/// Attaches through the fleet's helper (full membership) without waiting for ACTIVE.
pub async fn attach_no_wait(
    fleet: &fabric_fleet::Fleet,
    node: &str,
    instance: &str,
    partition: &fabric_fleet::proto::agent::Partition,
) -> fabric_fleet::proto::agent::Attachment {
    attach_waiting(fleet, node, instance, partition, None).await
}

async fn attach_waiting(
    fleet: &fabric_fleet::Fleet,
    node: &str,
    instance: &str,
    partition: &fabric_fleet::proto::agent::Partition,
    wait_ms: Option<u32>,
) -> fabric_fleet::proto::agent::Attachment {
    fleet
        .attach(fabric_fleet::AttachSpec {
            node_id: node.into(),
            instance_id: instance.into(),
            partition: partition.clone(),
            membership: fabric_fleet::proto::agent::Membership::Full,
            wait_ms,
            ports: Vec::new(),
        })
        .await
        .expect("attach")
        .attachment
        .expect("attachment")
}
