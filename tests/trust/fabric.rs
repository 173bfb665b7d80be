//! Node identity end to end on an ibsim fabric with a real OpenSM: the SM-host agent serves
//! `Partitions` over mTLS only to certificates under `*.nodes.fab1.example`, each for its own
//! node. node1's agent (its own certificate) reaches ACTIVE; node2's agent holding node1's
//! certificate is refused: its attachment never goes ACTIVE, OpenSM's file never names node2's
//! port, and node2's P_Key table (read with `smpquery`) never gets the key.
//! Skipped (with a message) when ibsim/OpenSM or the shim are not installed.

use testkit::common;
use testkit::rig;

use common::pki::Pki;
use common::{attach, attach_now, free_port, get, has_base, partition, state};
use fabric_agent::proto::agent as pb;
use rig::agents::{node_config, sm_tls_config, Agent};
use rig::{Fabric, FabricSpec};
use std::time::{Duration, Instant};

/// Tenant ports are limited members of the default partition (the SM host refuses tenant keys
/// while the default partition makes everyone a full member).
const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_cannot_program_another_node() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 3), OPERATOR) else {
        return;
    };
    let dir = fabric.dir().to_owned();
    let pki = Pki::new("fab1 CA");
    let ca_pem = dir.join("fab1-ca.pem");
    pki.write_ca(&ca_pem);
    let (sm_crt, sm_key) = pki.issue_with(&dir, "smhost", &["localhost"], None, |_| {});
    let (n1_crt, n1_key) =
        pki.issue_with(&dir, "node1", &["node1.nodes.fab1.example"], None, |_| {});

    let port = free_port();
    let sm_conf = sm_tls_config(&fabric, port, &sm_crt, &sm_key, &ca_pem, &[]);
    assert!(sm_conf.contains("[listen.tls]"), "{sm_conf}");
    let sm = Agent::start(&fabric, rig::SM_HOST, &sm_conf);
    let node = |name: &str| {
        node_config(&fabric, name, port).replace(
            &format!("endpoint = \"http://127.0.0.1:{port}\"\n"),
            &format!(
                "endpoint = \"https://127.0.0.1:{port}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ndomain_name = \"localhost\"\n",
                ca_pem.display(),
                n1_crt.display(),
                n1_key.display()
            ),
        )
    };
    // Both agents present node1's certificate; only node1's is speaking for its own node.
    let a1 = Agent::start(&fabric, "node1", &node("node1"));
    let a2 = Agent::start(&fabric, "node2", &node("node2"));
    let (mut c1, mut c2) = (a1.client().await, a2.client().await);
    let node2_guid = format!("{:#018x}", fabric.node_info("node2").port_guid);
    let node2_before = fabric.pkeys("node2");

    let a = attach_now(
        &mut c1,
        attach("i-1", partition("ibpart_a", 0x0a12), Some(20_000)),
    )
    .await;
    assert_eq!(
        state(&a),
        pb::AttachmentState::Active,
        "{a:?}\n{}",
        sm.log_text()
    );
    assert!(fabric.pkeys("node1").contains(&0x8a12));

    c2.attach_partition(attach("i-2", partition("ibpart_a", 0x0a12), None))
        .await
        .unwrap();
    // Give node2's reconciler time for several refused applies.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let a = get(&mut c2, "i-2").await;
        assert_ne!(state(&a), pb::AttachmentState::Active, "{a:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let a = get(&mut c2, "i-2").await;
    assert!(
        a.reason.contains("node2") || a.reason.to_lowercase().contains("permission"),
        "the refusal is visible on node2: {a:?}\n{}",
        a2.log_text()
    );
    let file = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(!file.contains(&node2_guid), "{file}");
    let node2_after = fabric.pkeys("node2");
    assert!(!has_base(&node2_after, 0x0a12), "{node2_after:x?}");
    assert_eq!(node2_before, node2_after);
    let audit: Vec<_> = sm
        .log_text()
        .lines()
        .filter(|l| {
            l.contains("fabric_agent::audit")
                && l.contains("node=\"node2\"")
                && l.contains("result=")
        })
        .map(str::to_owned)
        .collect();
    assert!(
        !audit.is_empty() && audit.iter().all(|l| l.contains("result=PermissionDenied")),
        "{audit:#?}"
    );
}
