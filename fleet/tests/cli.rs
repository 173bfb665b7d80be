//! The `fabric-fleet` binary without any node: grant keys and signing, and refusals of bad
//! input (exit codes from `src/cli/exit.rs`; clap's own usage errors exit 2).

use base64::Engine;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use fabric_fleet::proto::grant::{Grant, SignedGrant};
use prost::Message;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

fn fleet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fabric-fleet"))
        .args(args)
        .env_remove("FABRIC_FLEET_NODES")
        .output()
        .expect("run fabric-fleet")
}

#[test]
fn keygen_then_sign_makes_a_grant_the_public_key_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k1.seed");
    let key_s = key.to_str().unwrap();
    let out = fleet(&["grant", "keygen", "--out", key_s]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let b64 = base64::engine::general_purpose::STANDARD;
    let public = b64
        .decode(String::from_utf8(out.stdout).unwrap().trim())
        .unwrap();
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Never overwrites.
    assert_eq!(
        fleet(&["grant", "keygen", "--out", key_s]).status.code(),
        Some(64)
    );

    let sign = |pkey: &str| {
        fleet(&[
            "grant",
            "sign",
            "--key",
            key_s,
            "--key-id",
            "k1",
            "--grant-id",
            "g-1",
            "--fabric",
            "fab1",
            "--node",
            "n1",
            "--instance",
            "i-1",
            "--partition-id",
            "ibpart_x",
            "--pkey",
            pkey,
        ])
    };
    let out = sign("0x0a12");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let signed = SignedGrant::decode(
        b64.decode(String::from_utf8(out.stdout).unwrap().trim())
            .unwrap()
            .as_slice(),
    )
    .unwrap();
    assert_eq!(signed.key_id, "k1");
    let vk = VerifyingKey::from_bytes(&public.try_into().unwrap()).unwrap();
    let mut msg = b"fabric.grant.v1\n".to_vec();
    msg.extend_from_slice(&signed.grant);
    vk.verify(&msg, &Signature::from_slice(&signed.signature).unwrap())
        .expect("the signature verifies over the domain-separated bytes");
    let grant = Grant::decode(signed.grant.as_slice()).unwrap();
    assert_eq!((grant.pkey, grant.node_id.as_str()), (0x0a12, "n1"));

    // Bad input: a P_Key outside the range (clap usage error), a key others may read.
    assert_eq!(sign("0x7fff").status.code(), Some(2));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = sign("0x0a12");
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{out:?}"
    );
}

#[test]
fn a_bad_nodes_file_is_refused_naming_the_key_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.toml");
    let store = dir.path().join("fleet.redb");
    std::fs::write(
        &nodes,
        "[[node]]\nid = \"n1\"\nendpoint = \"http://10.1.2.3:7443\"\n",
    )
    .unwrap();
    let out = fleet(&[
        "--nodes",
        nodes.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "may-delete",
        "ibpart_x",
    ]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node[0].endpoint") && err.contains("loopback"),
        "{err}"
    );
    assert!(!store.exists(), "a refused nodes file creates no store");
    let out = fleet(&["status"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

#[test]
fn may_delete_without_an_sm_host_cannot_decide() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.toml");
    // An unreachable node and no SM host; the store holds one attach, RELEASED on its node:
    // the fabric's view is needed and cannot be read, so there is no answer (69).
    std::fs::write(
        &nodes,
        "[[node]]\nid = \"n1\"\nendpoint = \"unix:///nonexistent/a.sock\"\n",
    )
    .unwrap();
    let store = dir.path().join("fleet.redb");
    {
        let s = fabric_fleet::store::Store::open(&store).unwrap();
        s.record_attach(&fabric_fleet::store::AttachRecord {
            node_id: "n1".into(),
            instance_id: "i-1".into(),
            partition_id: "ibpart_x".into(),
            fabric: "fab1".into(),
            pkey: 0x10,
            grant_id: "g".into(),
            recorded_at_ms: 1,
            released_before: None,
        })
        .unwrap();
        let mut d = fabric_fleet::view::NodeDurable {
            epoch: "e".into(),
            seq: 2,
            ..Default::default()
        };
        d.instances.insert(
            "i-1".into(),
            fabric_fleet::view::InstanceView {
                instance_id: "i-1".into(),
                partition_id: "ibpart_x".into(),
                pkey_value: 0x8010,
                state: fabric_fleet::proto::agent::AttachmentState::Released as i32,
                since_ms: 1,
                last_error: String::new(),
                epoch: "e".into(),
                seq: 2,
            },
        );
        s.put_nodes([("n1", &d)]).unwrap();
    }
    let args = |p: &str| {
        vec![
            "--nodes".to_owned(),
            nodes.to_str().unwrap().to_owned(),
            "--store".to_owned(),
            store.to_str().unwrap().to_owned(),
            "--sync-secs".to_owned(),
            "5".to_owned(),
            "may-delete".to_owned(),
            p.to_owned(),
        ]
    };
    let run = |p: &str| {
        let a = args(p);
        fleet(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = run("ibpart_x");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no [[sm_host]] is configured for fabric fab1"),
        "{out:?}"
    );
    // A partition nobody attached through this client: yes.
    assert_eq!(run("ibpart_y").status.code(), Some(0));

    // The same answers as one JSON document each, with the same exit codes.
    let json = |extra: &[&str]| {
        let mut a = args("ibpart_x");
        a.pop();
        a.pop();
        a.extend(extra.iter().map(|s| s.to_string()));
        let out = fleet(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code(), doc)
    };
    let (code, doc) = json(&["may-delete", "ibpart_x", "-o", "json"]);
    assert_eq!(code, Some(69), "{doc}");
    assert!(doc["may_delete"].is_null(), "{doc}");
    assert!(
        doc["error"].as_str().unwrap().contains("no [[sm_host]]"),
        "{doc}"
    );
    // The node was tried and failed: settled, without its word.
    assert_eq!(doc["settled"], true, "{doc}");
    let (code, doc) = json(&["may-delete", "ibpart_y", "-o", "json"]);
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["may_delete"], true, "{doc}");
    let (code, doc) = json(&["partition", "ibpart_x", "-o", "json"]);
    assert_eq!(code, Some(0), "{doc}");
    let row = &doc["instances"][0];
    assert_eq!(row["node"], "n1", "{doc}");
    assert_eq!(row["instance_id"], "i-1", "{doc}");
    assert_eq!(row["state"], "RELEASED", "{doc}");
    assert_eq!(row["pkey"], "0x8010", "{doc}");
    assert_eq!(row["reported"], true, "{doc}");
}
