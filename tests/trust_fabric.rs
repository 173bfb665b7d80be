//! Node identity end to end on an ibsim fabric with a real OpenSM: the SM-host agent serves
//! `Partitions` over mTLS only to certificates under `*.nodes.fab1.example`, each for its own
//! node. node1's agent (its own certificate) reaches ACTIVE; node2's agent holding node1's
//! certificate is refused: its attachment never goes ACTIVE, OpenSM's file never names node2's
//! port, and node2's P_Key table (read with `smpquery`) never gets the key.
//! Skipped (with a message) when ibsim/OpenSM or the shim are not installed.

mod common;
#[path = "rig/mod.rs"]
mod rig;

use common::{attach, partition, state};
use fabric_agent::proto::agent as pb;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rig::agents::{node_config, sm_config, Agent};
use rig::{Fabric, FabricSpec};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Tenant ports are limited members of the default partition (the SM host refuses tenant keys
/// while the default partition makes everyone a full member).
const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn issue(
    ca: &CertifiedIssuer<'static, KeyPair>,
    dir: &Path,
    file: &str,
    san: &str,
) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![san.to_owned()])
        .unwrap()
        .signed_by(&key, ca)
        .unwrap();
    let (c, k) = (
        dir.join(format!("{file}.crt")),
        dir.join(format!("{file}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

fn has_base(keys: &[u16], base: u16) -> bool {
    keys.iter().any(|k| k & 0x7fff == base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_cannot_program_another_node() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 3), OPERATOR) else {
        return;
    };
    let dir = fabric.dir().to_owned();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "fab1 CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let ca_pem = dir.join("fab1-ca.pem");
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    let (sm_crt, sm_key) = issue(&ca, &dir, "smhost", "localhost");
    let (n1_crt, n1_key) = issue(&ca, &dir, "node1", "node1.nodes.fab1.example");

    let port = free_port();
    let sm_conf = sm_config(&fabric, port).replace(
        "insecure_plaintext_for_tests = true\n",
        &format!(
            "[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             partitions_clients = [\"dns:*.nodes.fab1.example\"]\n\
             node_name_template = \"{{node}}.nodes.fab1.example\"\n",
            sm_crt.display(),
            sm_key.display(),
            ca_pem.display()
        ),
    );
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

    let a = c1
        .attach_partition(attach("i-1", partition("ibpart_a", 0x0a12), Some(20_000)))
        .await
        .unwrap()
        .into_inner()
        .attachment
        .unwrap();
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
        let a = c2
            .get_attachment(pb::GetAttachmentRequest {
                instance_id: "i-2".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_ne!(state(&a), pb::AttachmentState::Active, "{a:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let a = c2
        .get_attachment(pb::GetAttachmentRequest {
            instance_id: "i-2".into(),
        })
        .await
        .unwrap()
        .into_inner();
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
        .filter(|l| l.contains("fabric_agent::audit") && l.contains("node=\"node2\""))
        .map(str::to_owned)
        .collect();
    assert!(
        !audit.is_empty() && audit.iter().all(|l| l.contains("result=PermissionDenied")),
        "{audit:#?}"
    );
}
