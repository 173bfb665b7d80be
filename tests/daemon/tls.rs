//! TCP with mTLS: an allowlisted client certificate is served; a certificate-less client gets
//! UNAUTHENTICATED; a valid but unlisted identity gets PERMISSION_DENIED; a certificate from
//! another CA never gets an answer. Certificates are generated here.

use testkit::common;

use common::pki::Pki;
use common::*;
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::path::PathBuf;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_accepts_listed_clients_and_refuses_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = Pki::new("fabric test CA");
    let ca = dir.join("ca.pem");
    pki.write_ca(&ca);
    let (server_crt, server_key) = pki.issue(dir, "server", &["localhost"], "node1");
    let (cp_crt, cp_key) = pki.issue(
        dir,
        "control-plane",
        &["control-plane.example"],
        "control-plane",
    );
    let (other_crt, other_key) = pki.issue(dir, "other", &["intruder.example"], "intruder");
    let rogue = Pki::new("rogue CA");
    let (rogue_crt, rogue_key) =
        rogue.issue(dir, "rogue", &["control-plane.example"], "control-plane");

    let port = free_port();
    let extra = format!(
        "[listen]\nunix_socket = \"{sock}\"\ntcp = \"127.0.0.1:{port}\"\n[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nallowed_clients = [\"dns:control-plane.example\"]\n",
        server_crt.display(),
        server_key.display(),
        ca.display(),
        sock = dir.join("agent.sock").display(),
    );
    let mut d = Daemon::prepare(dir, &extra);
    d.spawn(&[]);
    let url = format!("https://127.0.0.1:{port}");
    let tls = |identity: Option<(PathBuf, PathBuf)>| ClientTls {
        ca: Some(ca.clone()),
        identity,
        domain: Some("localhost".into()),
    };

    let ch = tcp(&url, &tls(Some((cp_crt, cp_key))))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let mut allowed = FabricAgentClient::new(ch);
    let node = allowed
        .get_node(pb::GetNodeRequest {})
        .await
        .expect("allowlisted client is served");
    assert_eq!(node.into_inner().node_id, "node1");

    let mut anonymous = FabricAgentClient::new(tcp(&url, &tls(None)).await.unwrap());
    let e = anonymous.get_node(pb::GetNodeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    let mut unlisted =
        FabricAgentClient::new(tcp(&url, &tls(Some((other_crt, other_key)))).await.unwrap());
    let e = unlisted.get_node(pb::GetNodeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("intruder.example"), "{}", e.message());

    // A certificate from another CA fails the handshake: no call succeeds.
    let refused = match tcp(&url, &tls(Some((rogue_crt, rogue_key)))).await {
        Err(_) => true,
        Ok(ch) => FabricAgentClient::new(ch)
            .get_node(pb::GetNodeRequest {})
            .await
            .is_err(),
    };
    assert!(refused, "a certificate from an unknown CA must be refused");

    // Plain HTTP/2 on the TLS port is refused too.
    let plain = tcp(&format!("http://127.0.0.1:{port}"), &ClientTls::default()).await;
    if let Ok(ch) = plain {
        assert!(FabricAgentClient::new(ch)
            .get_node(pb::GetNodeRequest {})
            .await
            .is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_tcp_serves_on_loopback_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = format!(
        "[listen]\nunix_socket = \"{}\"\ntcp = \"127.0.0.1:{port}\"\ninsecure_plaintext_for_tests = true\n",
        tmp.path().join("agent.sock").display()
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
    let ch = tcp(&format!("http://127.0.0.1:{port}"), &ClientTls::default())
        .await
        .unwrap();
    let mut c = FabricAgentClient::new(ch);
    assert!(c.get_node(pb::GetNodeRequest {}).await.is_ok());
    // Health and reflection are served as well.
    let ch = tcp(&format!("http://127.0.0.1:{port}"), &ClientTls::default())
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "fabric.agent.v1.FabricAgent".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}
