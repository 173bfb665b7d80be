//! Grants end to end on an ibsim fabric with a real OpenSM: the SM-host agent requires the
//! control plane's signed grants (`[grants] require = true`) and serves `fabric.sm.v1` over
//! mTLS. Through that public API, with node1's own certificate: a set with a valid grant is
//! programmed (`smpquery` shows the key on node1's port); another tenant's key without a grant,
//! with a grant for node2, with a forged signature, with a key id not configured, with a grant
//! from an expired key, with a limited grant asking full, and a consumed grant replayed after
//! its release are each PERMISSION_DENIED with every node's P_Key table unchanged, the
//! partitions file byte-identical, the stored generation unchanged and an audit line naming the
//! caller. `RevokeInstance` (operators only) removes node1's port from the key while node1 keeps
//! sending it; `ListPartitionMembers` matches `smpquery`; a case variant of the node id is
//! refused. node2's agent refuses an attach without a grant and carries its grant to ACTIVE and
//! RELEASED. One fabric serves every case. Skipped (with a message) when ibsim/OpenSM are missing.

use testkit::common;
use testkit::rig;

use common::grants::{grant, GrantSigner};
use common::pki::Pki;
use common::{attach, attach_now, free_port, partition, release_request, state};
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::domain::Membership;
use fabric_agent::proto::agent as pb_agent;
use fabric_agent::proto::grant as gpb;
use fabric_agent::proto::sm as pb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::agents::{node_config, sm_tls_config, Agent};
use rig::{Fabric, FabricSpec};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";
const TENANT_A: u32 = 0x0a11;
const TENANT_B: u32 = 0x0b22;

fn set(
    node: &str,
    guid: &str,
    keys: &[(u32, bool)],
    generation: u64,
    grants: Vec<gpb::SignedGrant>,
) -> pb::SetNodeMembershipsRequest {
    pb::SetNodeMembershipsRequest {
        memberships: Some(pb::NodeMemberships {
            node_id: node.into(),
            port_guids: vec![guid.into()],
            keys: keys
                .iter()
                .map(|(pkey, full)| pb::KeyMembership {
                    pkey: *pkey,
                    full: *full,
                    name: format!("t{pkey:x}"),
                    port_guids: Vec::new(),
                })
                .collect(),
            generation,
            grants,
        }),
    }
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

/// Every node's P_Key table as `smpquery` reads it.
fn tables(fabric: &Fabric) -> BTreeMap<String, Vec<u16>> {
    let mut nodes = fabric.hcas();
    nodes.push(rig::SM_HOST.to_owned());
    nodes
        .into_iter()
        .map(|n| {
            let p = fabric.pkeys(&n);
            (n, p)
        })
        .collect()
}

/// The nodes whose P_Key table holds `base`, by `smpquery`.
fn holders(fabric: &Fabric, base: u32) -> Vec<String> {
    tables(fabric)
        .into_iter()
        .filter(|(_, keys)| keys.iter().any(|k| u32::from(k & 0x7fff) == base))
        .map(|(n, _)| n)
        .collect()
}

/// Waits until `smpquery` shows exactly `expected` holding `base`.
fn wait_holders(fabric: &Fabric, base: u32, expected: &[&str], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = holders(fabric, base);
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: holders of {base:#06x} are {now:?}, expected {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_decide_which_partitions_a_node_joins() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let dir = fabric.dir().to_owned();
    let pki = Pki::new("fab1 CA");
    pki.write_ca(&dir.join("ca.pem"));
    let (sm_crt, sm_key) = pki.issue_with(&dir, "smhost", &["localhost"], None, |_| {});
    let control_plane = GrantSigner::new("cp-2026");
    let expired = GrantSigner::new("cp-2024");
    let retired = GrantSigner::new("cp-2023");
    let port = free_port();
    let sm_conf = sm_tls_config(
        &fabric,
        port,
        &sm_crt,
        &sm_key,
        &dir.join("ca.pem"),
        &["dns:control-plane.fab1.example"],
    ) + &format!(
        "[grants]\nrequire = true\n{}{}",
        control_plane.config_entry(""),
        expired.config_entry("not_after = \"2024-12-31T23:59:59Z\"\n"),
    );
    let sm = Agent::start(&fabric, rig::SM_HOST, &sm_conf);
    let url = format!("https://127.0.0.1:{port}");
    let mut node1 = client(
        &url,
        &dir,
        pki.issue(&dir, "node1", &["node1.nodes.fab1.example"], "node1"),
    )
    .await;
    let mut ops = client(
        &url,
        &dir,
        pki.issue(&dir, "cp", &["control-plane.fab1.example"], "cp"),
    )
    .await;
    let guid1 = format!("{:#018x}", fabric.node_info("node1").port_guid);
    let guid2 = format!("{:#018x}", fabric.node_info("node2").port_guid);

    // node1 with a valid grant: programmed.
    let g1 = control_plane.sign(&grant(
        "g-a-1",
        "fab1",
        "node1",
        "i-1",
        TENANT_A,
        Membership::Full,
    ));
    node1
        .set_node_memberships(set(
            "node1",
            &guid1,
            &[(TENANT_A, true)],
            1,
            vec![g1.clone()],
        ))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", sm.log_text()));
    wait_holders(&fabric, TENANT_A, &["node1"], "a valid grant");

    // The refusals: each PERMISSION_DENIED naming the key and the reason, nothing written.
    let file_before = std::fs::read(fabric.partitions_path()).unwrap();
    let tables_before = tables(&fabric);
    let b_for = |node: &str, m| grant("g-b-1", "fab1", node, "i-9", TENANT_B, m);
    let both = [(TENANT_A, true), (TENANT_B, true)];
    let cases: Vec<(&str, Vec<gpb::SignedGrant>, &str)> = vec![
        (
            "another tenant's key without a grant",
            vec![g1.clone()],
            "no grant for key",
        ),
        (
            "a grant for node2",
            vec![
                g1.clone(),
                control_plane.sign(&b_for("node2", Membership::Full)),
            ],
            "is for node \"node2\", not \"node1\"",
        ),
        (
            "a forged signature",
            vec![
                g1.clone(),
                retired.sign_as(&b_for("node1", Membership::Full), "cp-2026"),
            ],
            "signature does not verify",
        ),
        (
            "a key id not configured (retired)",
            vec![g1.clone(), retired.sign(&b_for("node1", Membership::Full))],
            "not configured here",
        ),
        (
            "a grant signed by an expired key",
            vec![g1.clone(), expired.sign(&b_for("node1", Membership::Full))],
            "outside the validity of key \"cp-2024\"",
        ),
        (
            "a limited grant asking full",
            vec![
                g1.clone(),
                control_plane.sign(&b_for("node1", Membership::Limited)),
            ],
            "grants limited membership",
        ),
    ];
    for (i, (what, grants, reason)) in cases.into_iter().enumerate() {
        let s = node1
            .set_node_memberships(set("node1", &guid1, &both, 2 + i as u64, grants))
            .await
            .expect_err(what);
        assert_eq!(s.code(), Code::PermissionDenied, "{what}: {s:?}");
        assert!(
            s.message().contains(reason) && s.message().contains("0x0b22"),
            "{what}: {s:?}"
        );
        assert_eq!(
            std::fs::read(fabric.partitions_path()).unwrap(),
            file_before,
            "{what}"
        );
    }
    let stored = ops
        .get_node_memberships(pb::GetNodeMembershipsRequest {
            node_id: "node1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.generation, 1, "no refused set was stored");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        tables(&fabric),
        tables_before,
        "smpquery unchanged on every node"
    );

    // A case variant of the node id is refused (node ids are case-sensitive).
    let s = node1
        .set_node_memberships(set("NODE1", &guid2, &[], 1, vec![]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(ops
        .get_node_memberships(pb::GetNodeMembershipsRequest {
            node_id: "NODE1".into()
        })
        .await
        .is_err_and(|s| s.code() == Code::NotFound));

    // Release (no grant needed), then replaying the consumed grant is refused.
    node1
        .set_node_memberships(set("node1", &guid1, &[], 10, vec![]))
        .await
        .unwrap();
    wait_holders(&fabric, TENANT_A, &[], "the release");
    let file_released = std::fs::read(fabric.partitions_path()).unwrap();
    let tables_released = tables(&fabric);
    let s = node1
        .set_node_memberships(set(
            "node1",
            &guid1,
            &[(TENANT_A, true)],
            11,
            vec![g1.clone()],
        ))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("consumed"), "{s:?}");
    assert_eq!(
        std::fs::read(fabric.partitions_path()).unwrap(),
        file_released
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(tables(&fabric), tables_released);

    // A fresh grant for a new instance; the fabric's view matches smpquery.
    let g2 = control_plane.sign(&grant(
        "g-a-2",
        "fab1",
        "node1",
        "i-2",
        TENANT_A,
        Membership::Full,
    ));
    let n2 = set("node1", &guid1, &[(TENANT_A, true)], 12, vec![g2.clone()]);
    node1.set_node_memberships(n2).await.unwrap();
    wait_holders(&fabric, TENANT_A, &["node1"], "a fresh grant");
    let list = |pkey| pb::ListPartitionMembersRequest { pkey };
    let view = ops
        .list_partition_members(list(TENANT_A))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.source, "partitions-file-fallback");
    let listed: Vec<(String, String)> = view
        .members
        .iter()
        .map(|m| (m.port_guid.clone(), m.node_id.clone()))
        .collect();
    assert_eq!(listed, vec![(guid1.clone(), "node1".to_owned())]);
    assert_eq!(
        node1
            .list_partition_members(list(TENANT_A))
            .await
            .unwrap_err()
            .code(),
        Code::PermissionDenied,
        "a node may not read the fabric's view"
    );

    // Revocation: a node may not revoke; the control plane does, whatever node1 keeps sending.
    let revoke = pb::RevokeInstanceRequest {
        node_id: "node1".into(),
        instance_id: "i-2".into(),
    };
    let s = node1.revoke_instance(revoke.clone()).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let out = ops
        .revoke_instance(revoke.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.revoked_grant_ids, vec!["g-a-2".to_owned()]);
    assert_eq!(out.removed_pkeys, vec![TENANT_A]);
    wait_holders(&fabric, TENANT_A, &[], "the revocation");
    let view = ops
        .list_partition_members(list(TENANT_A))
        .await
        .unwrap()
        .into_inner();
    assert!(view.members.is_empty(), "{view:?}");
    let again = ops.revoke_instance(revoke).await.unwrap().into_inner();
    assert!(again.revoked_grant_ids.is_empty() && again.removed_pkeys.is_empty());
    let file_revoked = std::fs::read(fabric.partitions_path()).unwrap();
    let s = node1
        .set_node_memberships(set("node1", &guid1, &[(TENANT_A, true)], 13, vec![g2]))
        .await
        .unwrap_err();
    assert_eq!(
        s.code(),
        Code::PermissionDenied,
        "node1 keeps sending the revoked grant: {s:?}"
    );
    assert_eq!(
        std::fs::read(fabric.partitions_path()).unwrap(),
        file_revoked
    );
    node1
        .set_node_memberships(set("node1", &guid1, &[], 14, vec![]))
        .await
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(holders(&fabric, TENANT_A).is_empty());

    // A node agent carries its grants: node2's agent (remote backend, its own certificate)
    // refuses an attach without a grant and reaches ACTIVE with one.
    let (n2_crt, n2_key) = pki.issue(&dir, "node2", &["node2.nodes.fab1.example"], "node2");
    let node2_conf = node_config(&fabric, "node2", port).replace(
        &format!("endpoint = \"http://127.0.0.1:{port}\"\n"),
        &format!(
            "endpoint = \"https://127.0.0.1:{port}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ndomain_name = \"localhost\"\n",
            dir.join("ca.pem").display(),
            n2_crt.display(),
            n2_key.display()
        ),
    ) + &format!("[grants]\nrequire = true\n{}", control_plane.config_entry(""));
    let agent2 = Agent::start(&fabric, "node2", &node2_conf);
    let mut c2 = agent2.client().await;
    let mut request = attach("vm-b", partition("ibpart_b", TENANT_B), Some(20_000));
    let s = c2.attach_partition(request.clone()).await.unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains("grant"), "{s:?}");
    let mut gb = grant("g-b-2", "fab1", "node2", "vm-b", TENANT_B, Membership::Full);
    gb.partition_id = "ibpart_b".into();
    request.grant = Some(control_plane.sign(&gb));
    let a = attach_now(&mut c2, request).await;
    assert_eq!(
        state(&a),
        pb_agent::AttachmentState::Active,
        "{a:?}\n{}\n{}",
        agent2.log_text(),
        sm.log_text()
    );
    wait_holders(&fabric, TENANT_B, &["node2"], "node2's granted attach");
    let view = ops
        .list_partition_members(list(TENANT_B))
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<(String, String)> = view
        .members
        .iter()
        .map(|m| (m.port_guid.clone(), m.node_id.clone()))
        .collect();
    assert_eq!(listed, vec![(guid2.clone(), "node2".to_owned())]);
    let r = c2
        .release_instance(release_request("vm-b", Some(20_000)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state(r.attachment.as_ref().unwrap()),
        pb_agent::AttachmentState::Released,
        "{r:?}"
    );
    assert!(holders(&fabric, TENANT_B).is_empty());

    // Every refused set left an audit line naming node1's certificate.
    let log = sm.log_text();
    let denied: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("fabric_agent::audit") && l.contains("result=PermissionDenied"))
        .collect();
    let named = denied
        .iter()
        .filter(|l| l.contains("node1.nodes.fab1.example"))
        .count();
    assert!(named >= 9, "{denied:#?}");
    assert!(
        log.contains("method=\"RevokeInstance\"") || log.contains("method=RevokeInstance"),
        "{log}"
    );
}
