//! `ListPartitionMembers` on the SM host answers from the SA (`source = "sa"`): on the ibsim +
//! OpenSM fabric, after node1 and node2 put their ports in a key (node3 not), the SM-host agent
//! asks the SA for each known port's P_KeyTableRecords and lists exactly the ports whose
//! records hold the key, which is what `saquery --smkey 1 PKTR <lid>/0/<block>` shows for every port.
//! The SM host, running without grants required, logs a WARN at start. Skipped (with a
//! message) when ibsim/OpenSM are missing.

use testkit::common;
use testkit::rig;

use common::sm_requests::set_memberships;
use common::{free_port, has_base};
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::agents::Agent;
use rig::{Fabric, FabricSpec, SM_HOST};
use std::collections::BTreeMap;
use std::time::Duration;

const PARTITIONS: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";
const KEY: u32 = 0x0a61;

/// The SM-host agent with ownership checks on (so the SA is asked), a sysfs fixture as its
/// own ports (an SMP observer cannot share the process with an SA session under umad2sim).
fn sm_config(fabric: &Fabric, port: u16) -> String {
    rig::agents::sm_config_with(
        fabric,
        port,
        "description_patterns = [\"{node}\", \"{node} *\"]\n\
         sa_timeout_ms = 300\nsa_retries = 1\nsa_deadline_ms = 4000\n",
        &format!(
            "kind = \"sysfs\"\nsysfs_root = \"{}\"\nslow_poll_ms = 2000\n",
            std::fs::canonicalize("tests/fixtures/sysfs/mlx5-8x")
                .expect("fixture")
                .display(),
        ),
    )
}

/// The P_Keys `saquery --smkey 1 PKTR <lid>/0/<block>` (a trusted request: OpenSM's default
/// SA key) shows for blocks 0 and 1 of the port at `lid`.
fn saquery_pkeys(fabric: &Fabric, lid: u16) -> Vec<u16> {
    let mut keys = Vec::new();
    for block in 0..2 {
        let Ok(text) = fabric.run_tool(
            SM_HOST,
            "saquery",
            &["--smkey", "1", "PKTR", &format!("{lid}/0/{block}")],
        ) else {
            continue;
        };
        keys.extend(
            text.split_whitespace()
                .filter_map(|w| w.strip_prefix("0x"))
                .filter(|h| h.len() == 4)
                .filter_map(|h| u16::from_str_radix(h, 16).ok())
                .filter(|k| *k != 0),
        );
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_partition_members_answers_from_the_sa() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 3), PARTITIONS) else {
        return;
    };
    let port = free_port();
    let sm = Agent::start(&fabric, SM_HOST, &sm_config(&fabric, port));
    let mut client = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the SM host");
    // This SM host runs without grants required: it says so, loudly, at start.
    let log = sm.log_text();
    assert!(
        log.contains("WARN") && log.contains("GRANTS NOT REQUIRED"),
        "{log}"
    );
    let ports = fabric.ports();
    let info = |node: &str| ports.get(node).copied().expect("node in the fabric");
    for (node, generation) in [("node1", 1), ("node2", 1)] {
        client
            .set_node_memberships(set_memberships(node, &[info(node).0], &[KEY], generation))
            .await
            .unwrap_or_else(|e| panic!("{node}: {e:?}\n{}", sm.log_text()));
    }
    common::wait_until(
        "the key on node1 and node2",
        Duration::from_secs(20),
        || {
            std::future::ready(
                has_base(&fabric.pkeys("node1"), KEY as u16)
                    && has_base(&fabric.pkeys("node2"), KEY as u16),
            )
        },
    )
    .await;

    let view = client
        .list_partition_members(smpb::ListPartitionMembersRequest { pkey: KEY })
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", sm.log_text()))
        .into_inner();
    assert_eq!(view.source, "sa", "{view:?}\n{}", sm.log_text());
    let listed: BTreeMap<String, (String, bool)> = view
        .members
        .iter()
        .map(|m| (m.port_guid.clone(), (m.node_id.clone(), m.full)))
        .collect();

    // What saquery shows, port by port: exactly the ports listed, with their membership.
    let mut shown = BTreeMap::new();
    for node in fabric.hcas() {
        let (guid, lid) = info(&node);
        let keys = saquery_pkeys(&fabric, lid);
        eprintln!("saquery PKTR {lid} ({node}): {keys:04x?}");
        if let Some(k) = keys.iter().find(|k| **k & 0x7fff == KEY as u16) {
            shown.insert(format!("{guid:#018x}"), (node.clone(), k & 0x8000 != 0));
        }
    }
    assert_eq!(listed, shown, "{}", sm.log_text());
    assert_eq!(shown.len(), 2, "node1 and node2 hold the key: {shown:?}");
    drop(sm);
}
