//! A grant's lifetime and P_Key retirement end to end on an ibsim fabric with a real OpenSM: the
//! SM-host agent requires grants (`[grants] require = true`, default lifetime) and serves
//! `fabric.sm.v1` over mTLS. A never-used grant issued 400 days ago is PERMISSION_DENIED
//! ("expired") with every P_Key table unchanged (`smpquery`); once the control plane retires a
//! P_Key (`RetirePartitionKey`, operators only: a node's certificate is refused), the node that
//! held it loses it on the fabric, no older grant (used or not) gets it back, and the next
//! tenant's grant, issued after the retirement, is programmed. Skipped when ibsim/OpenSM are
//! missing.

use testkit::common;
use testkit::rig;

use common::free_port;
use common::grants::{grant, GrantSigner};
use common::pki::Pki;
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::domain::Membership;
use fabric_agent::proto::grant as gpb;
use fabric_agent::proto::sm as pb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::agents::{sm_tls_config, Agent};
use rig::{Fabric, FabricSpec};
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";
const KEY: u32 = 0x0a31;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn set(
    node: &str,
    guid: &str,
    generation: u64,
    grants: Vec<gpb::SignedGrant>,
) -> pb::SetNodeMembershipsRequest {
    pb::SetNodeMembershipsRequest {
        memberships: Some(pb::NodeMemberships {
            node_id: node.into(),
            port_guids: vec![guid.into()],
            keys: vec![pb::KeyMembership {
                pkey: KEY,
                full: true,
                name: format!("t{KEY:x}"),
                port_guids: Vec::new(),
            }],
            generation,
            grants,
        }),
    }
}

/// A grant of `KEY` for `node` issued at `issued`.
fn signed(cp: &GrantSigner, id: &str, node: &str, issued: u64) -> gpb::SignedGrant {
    let mut g = grant(id, "fab1", node, &format!("i-{id}"), KEY, Membership::Full);
    g.issued_at_unix_ms = issued;
    cp.sign(&g)
}

async fn client(
    url: &str,
    dir: &Path,
    identity: (std::path::PathBuf, std::path::PathBuf),
) -> PartitionsClient<Channel> {
    let tls = ClientTls {
        ca: Some(dir.join("ca.pem")),
        identity: Some(identity),
        domain: Some("localhost".into()),
    };
    PartitionsClient::new(tcp(url, &tls).await.unwrap())
}

/// The nodes whose P_Key table holds `KEY`, by `smpquery`.
fn holders(fabric: &Fabric) -> Vec<String> {
    let mut nodes = fabric.hcas();
    nodes.push(rig::SM_HOST.to_owned());
    nodes
        .into_iter()
        .filter(|n| fabric.pkeys(n).iter().any(|k| u32::from(k & 0x7fff) == KEY))
        .collect()
}

fn wait_holders(fabric: &Fabric, expected: &[&str], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = holders(fabric);
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: holders of {KEY:#06x} are {now:?}, expected {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_grant_and_a_retired_keys_old_grants_never_join() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 3), OPERATOR) else {
        return;
    };
    let dir = fabric.dir().to_owned();
    let pki = Pki::new("fab1 CA");
    pki.write_ca(&dir.join("ca.pem"));
    let (sm_crt, sm_key) = pki.issue_with(&dir, "smhost", &["localhost"], None, |_| {});
    let cp = GrantSigner::new("cp-1");
    let port = free_port();
    let sm_conf = sm_tls_config(
        &fabric,
        port,
        &sm_crt,
        &sm_key,
        &dir.join("ca.pem"),
        &["dns:control-plane.fab1.example"],
    ) + &format!("[grants]\nrequire = true\n{}", cp.config_entry(""));
    let sm = Agent::start(&fabric, rig::SM_HOST, &sm_conf);
    let url = format!("https://127.0.0.1:{port}");
    let mut nodes = Vec::new();
    for n in ["node1", "node2", "node3"] {
        let c = client(
            &url,
            &dir,
            pki.issue(&dir, n, &[&format!("{n}.nodes.fab1.example")], n),
        )
        .await;
        let guid = format!("{:#018x}", fabric.node_info(n).port_guid);
        nodes.push((n, c, guid));
    }
    let mut ops = client(
        &url,
        &dir,
        pki.issue(&dir, "cp", &["control-plane.fab1.example"], "cp"),
    )
    .await;

    // A never-used grant issued 400 days ago: refused, nothing on the fabric.
    let before = std::fs::read(fabric.partitions_path()).unwrap();
    let (n, c, g) = &mut nodes[0];
    let old = signed(&cp, "g-400d", n, now_ms() - 400 * 24 * 3_600_000);
    let s = c
        .set_node_memberships(set(n, g, 1, vec![old]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("expired"), "{s:?}");
    assert_eq!(std::fs::read(fabric.partitions_path()).unwrap(), before);
    std::thread::sleep(Duration::from_secs(1));
    wait_holders(&fabric, &[], "an expired grant");

    // Tenant A: node1 joins with a fresh grant; node2 holds one it never used.
    let t_a = now_ms();
    let a1 = signed(&cp, "g-a1", n, t_a);
    c.set_node_memberships(set(n, g, 2, vec![a1.clone()]))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", sm.log_text()));
    wait_holders(&fabric, &["node1"], "tenant A's grant");
    let a2 = signed(&cp, "g-a2", "node2", t_a + 1);

    // A node may not retire a key; the control plane does, when it deletes the partition.
    let retire = |at| pb::RetirePartitionKeyRequest {
        pkey: KEY,
        retired_at_unix_ms: at,
        partition_id: "ibpart_a".into(),
    };
    let s = c.retire_partition_key(retire(now_ms())).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let retired_at = now_ms();
    let out = ops
        .retire_partition_key(retire(retired_at))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", sm.log_text()))
        .into_inner();
    assert_eq!(out.retired_at_unix_ms, retired_at);
    assert_eq!(out.removed.len(), 1, "{out:?}");
    wait_holders(&fabric, &[], "the retirement");

    // No older grant gets the key back: node1 replaying, node2's unused one.
    let s = c
        .set_node_memberships(set(n, g, 3, vec![a1]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let (n2, c2, g2) = &mut nodes[1];
    let s = c2
        .set_node_memberships(set(n2, g2, 1, vec![a2]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("retired"), "{s:?}");
    std::thread::sleep(Duration::from_secs(1));
    wait_holders(&fabric, &[], "old grants after the retirement");

    // Tenant B: node3's grant, issued after the retirement, is programmed.
    let (n3, c3, g3) = &mut nodes[2];
    let b = signed(&cp, "g-b1", n3, retired_at + 1);
    c3.set_node_memberships(set(n3, g3, 1, vec![b]))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", sm.log_text()));
    wait_holders(&fabric, &["node3"], "tenant B's new grant");
    drop(sm);
}
