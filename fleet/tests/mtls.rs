//! The fleet client over mTLS to a real `fabric-agent` daemon (TCP on loopback, a throw-away
//! CA from rcgen): the expected server identity (`domain`) is checked, the client certificate
//! is the agent's allowed control plane.

mod common;

use common::agent::Agent;
use common::{attach, fake_sm, fleet, partition, state_of, wait_for};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "fleet test CA");
        Pki {
            ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn issue(&self, dir: &Path, name: &str, san: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec![san.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        // The agent refuses a private key readable beyond its owner and group.
        std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        (c, k)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_and_attaches_over_mtls_and_refuses_another_identity() {
    let pki = std::sync::Arc::new(Pki::new());
    let port = free_port();
    let server_pki = pki.clone();
    let agent = Agent::start_with("tls-1", move |dir| {
        let (crt, key) = server_pki.issue(dir, "server", "tls-1.agents.example");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, server_pki.ca.pem()).unwrap();
        format!(
            "tcp = \"127.0.0.1:{port}\"\n[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
             client_ca = \"{}\"\nallowed_clients = [\"dns:control-plane.example\"]\n",
            crt.display(),
            key.display(),
            ca.display()
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pki.ca.pem()).unwrap();
    let (crt, key) = pki.issue(dir.path(), "control-plane", "control-plane.example");
    let (_sm, sm_url) = fake_sm::start().await;
    let text = |domain: &str| {
        format!(
            "[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             [follow]\nbackoff_initial_ms = 50\nbackoff_max_ms = 500\n\
             [[node]]\nid = \"tls-1\"\nendpoint = \"https://127.0.0.1:{port}\"\ndomain = \"{domain}\"\n\
             [[sm_host]]\nfabric = \"fab1\"\nendpoint = \"{sm_url}\"\n",
            ca.display(),
            crt.display(),
            key.display()
        )
    };

    // The wrong expected identity: the handshake fails, the node is never followed.
    let wrong = fleet(
        &text("tls-2.agents.example"),
        &dir.path().join("wrong.redb"),
    );
    let err = wait_for("a TLS failure", WAIT, || {
        wrong.with_view(|v| {
            let n = v.nodes.get("tls-1")?;
            n.live
                .unreachable_since_ms
                .map(|_| n.live.last_error.clone())
        })
    })
    .await;
    assert!(err.contains("not valid for name"), "{err}");
    assert!(
        wrong.with_view(|v| v.nodes["tls-1"].durable.epoch.is_empty()),
        "{err}"
    );
    wrong.shutdown().await;

    let f = fleet(
        &text("tls-1.agents.example"),
        &dir.path().join("fleet.redb"),
    );
    assert!(f.wait_settled(WAIT).await);
    assert!(f.with_view(|v| v.nodes["tls-1"].live.reachable));
    let p = partition("ibpart_tls", 0x41);
    attach(&f, "tls-1", "i-tls", &p).await;
    wait_for("ACTIVE over mTLS", WAIT, || {
        (state_of(&f, "tls-1", "i-tls").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    drop(agent);
}
