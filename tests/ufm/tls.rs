//! The UFM backend over HTTPS: a private CA from `ca_file` and client-certificate
//! authentication (`/ufmRestV2`), against the fake UFM behind TLS that requires a client
//! certificate.

use testkit::fake_ufm;

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, UfmConfig, UfmLedgerStore, UfmSm};
use fabric_agent::sm::SubnetManager;
use fake_ufm::{FakeAuth, FakeUfm};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const G1: u64 = 0x0002_c903_000e_0b72;

fn fresh_ledger() -> Arc<dyn UfmLedgerStore> {
    Arc::new(MemoryLedgerStore::new())
}

struct Pki {
    ca_pem: String,
    server: rustls::ServerConfig,
    client_cert_pem: String,
    client_key_pem: String,
}

fn pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client_cert = CertificateParams::new(vec!["node-a.example".to_string()])
        .unwrap()
        .signed_by(&client_key, &ca)
        .unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from(server_cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server,
        client_cert_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn desired() -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse("node-a").unwrap(),
        port_guids: vec![Guid(G1)],
        keys: [(
            PKey::new(0x0a12).unwrap(),
            KeySetting {
                membership: Membership::Full,
                name: "p".into(),
                ports: None,
            },
        )]
        .into(),
    }
}

fn config(fake: &FakeUfm, dir: &Path, pki: &Pki) -> UfmConfig {
    let mut c = UfmConfig::with_credentials_file(fake.url(), PathBuf::new());
    c.credentials_file = None;
    c.ca_file = Some(write(dir, "ca.pem", &pki.ca_pem));
    c.client_cert = Some(write(dir, "client.pem", &pki.client_cert_pem));
    c.client_key = Some(write(dir, "client.key", &pki.client_key_pem));
    c.connect_timeout_ms = 1_000;
    c.retries = 1;
    c.backoff_initial_ms = 1;
    c.backoff_max_ms = 2;
    c
}

#[tokio::test]
async fn client_certificate_and_private_ca() {
    let pki = pki();
    let fake = FakeUfm::start_tls(FakeAuth::Open, Arc::new(pki.server.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let sm = UfmSm::new(&config(&fake, dir.path(), &pki), fresh_ledger()).unwrap();
    sm.apply(&desired(), 1).await.unwrap();
    let log = fake.requests();
    // Stamp, list (start-up scan), add, read back.
    assert_eq!(log.len(), 4, "{log:?}");
    assert!(
        log.iter().all(|r| r.path.starts_with("/ufmRestV2/")),
        "{log:?}"
    );
    assert_eq!(fake.keys_of(G1), [(0x0a12, Membership::Full)]);
}

#[tokio::test]
async fn an_untrusted_server_or_a_missing_client_certificate_gets_nothing() {
    let pki = pki();
    let fake = FakeUfm::start_tls(FakeAuth::Open, Arc::new(pki.server.clone())).await;
    let dir = tempfile::tempdir().unwrap();

    // Server certificate from a CA the agent does not trust.
    let other = self::pki();
    let mut c = config(&fake, dir.path(), &pki);
    c.ca_file = Some(write(dir.path(), "other-ca.pem", &other.ca_pem));
    let err = UfmSm::new(&c, fresh_ledger())
        .unwrap()
        .apply(&desired(), 2)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // A client certificate from a CA the server does not trust.
    let mut c = config(&fake, dir.path(), &pki);
    c.client_cert = Some(write(dir.path(), "other.pem", &other.client_cert_pem));
    c.client_key = Some(write(dir.path(), "other.key", &other.client_key_pem));
    let err = UfmSm::new(&c, fresh_ledger())
        .unwrap()
        .apply(&desired(), 3)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");

    assert_eq!(fake.request_count(), 0, "no request got through");
    assert!(fake.keys_of(G1).is_empty());
}

#[tokio::test]
async fn a_rotated_client_certificate_is_picked_up_without_restart() {
    let pki = pki();
    let fake = FakeUfm::start_tls(FakeAuth::Open, Arc::new(pki.server.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let other = self::pki();
    let mut c = config(&fake, dir.path(), &pki);
    // Start with a certificate the server does not trust...
    write(dir.path(), "client.pem", &other.client_cert_pem);
    write(dir.path(), "client.key", &other.client_key_pem);
    c.client_cert = Some(dir.path().join("client.pem"));
    c.client_key = Some(dir.path().join("client.key"));
    let sm = UfmSm::new(&c, fresh_ledger()).unwrap();
    assert!(sm.apply(&desired(), 4).await.is_err());
    // ...then the operator installs the right one.
    write(dir.path(), "client.pem", &pki.client_cert_pem);
    write(dir.path(), "client.key", &pki.client_key_pem);
    sm.apply(&desired(), 5).await.unwrap();
    assert_eq!(fake.keys_of(G1), [(0x0a12, Membership::Full)]);
}
