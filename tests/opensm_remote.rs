//! RemoteSm against the SM host's Partitions service over loopback: plaintext, mTLS, refusals
//! and an unreachable SM host.

use async_trait::async_trait;
use fabric_agent::api::partitions::PartitionsService;
use fabric_agent::api::sm_client::RemoteSm;
use fabric_agent::api::{ClientAllowlist, Guarded, Policy};
use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fabric_agent::proto::sm::GetNodeMembershipsRequest;
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader};
use fabric_agent::sm::opensm::OwnershipConfig;
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend, OpenSmConfig};
use fabric_agent::sm::remote::RemoteConfig;
use fabric_agent::sm::{SmError, SubnetManager};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

struct AcceptingReloader;

#[async_trait]
impl Reloader for AcceptingReloader {
    fn checkpoint(&self) -> u64 {
        0
    }
    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        Ok(ReloadReport { file_read: true })
    }
}

struct SmHost {
    _dir: tempfile::TempDir,
    partitions: PathBuf,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for SmHost {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// The SM host's Partitions service behind the call gate: plaintext loopback runs under the
/// test-rig policy (what `insecure_plaintext_for_tests = true` selects); TLS under an allowlist
/// whose node certificates map to their node ids.
async fn sm_host(operator: &str, tls: Option<ServerTlsConfig>) -> SmHost {
    let dir = tempfile::tempdir().unwrap();
    let partitions = dir.path().join("partitions.conf");
    std::fs::write(&partitions, operator).unwrap();
    let backend = OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: partitions.clone(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::new(InMemoryNodeStore::default()),
        Arc::new(AcceptingReloader),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut builder = Server::builder();
    let policy = match tls {
        Some(tls) => {
            builder = builder.tls_config(tls).unwrap();
            Policy::Tls {
                allowed: ClientAllowlist::parse(&["dns:node-7".into()]).unwrap(),
                operators: ClientAllowlist::default(),
            }
        }
        None => Policy::InsecureTest,
    };
    let router = builder.add_service(Guarded::new(
        PartitionsService::new(backend).into_server(),
        policy,
    ));
    tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
    });
    SmHost {
        _dir: dir,
        partitions,
        addr,
        stop: Some(stop),
    }
}

fn desired(keys: &[u32]) -> NodeMemberships {
    NodeMemberships {
        node_id: "node-7".into(),
        port_guids: vec![Guid(0x0002_c903_000e_0b72)],
        keys: keys
            .iter()
            .map(|k| {
                (
                    PKey::new(*k).unwrap(),
                    KeySetting {
                        membership: Membership::Full,
                        name: "tenant-a".into(),
                    },
                )
            })
            .collect(),
    }
}

#[tokio::test]
async fn plaintext_loopback_apply_reaches_the_file() {
    let host = sm_host("", None).await;
    let sm = RemoteSm::new(&RemoteConfig {
        endpoint: format!("http://{}", host.addr),
        ..RemoteConfig::default()
    })
    .unwrap();
    sm.apply(&desired(&[0x0a12]), 1).await.unwrap();
    let text = std::fs::read_to_string(&host.partitions).unwrap();
    assert!(
        text.contains("tenant-a=0x0a12 :\n    0x0002c903000e0b72=full;"),
        "{text}"
    );

    // The SM host answers what it holds.
    let mut client = PartitionsClient::connect(format!("http://{}", host.addr))
        .await
        .unwrap();
    let held = client
        .get_node_memberships(GetNodeMembershipsRequest {
            node_id: "node-7".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.keys.len(), 1);
    let missing = client
        .get_node_memberships(GetNodeMembershipsRequest {
            node_id: "node-8".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // A later apply replaces the set (generations increase).
    sm.apply(&desired(&[]), 2).await.unwrap();
    assert!(!std::fs::read_to_string(&host.partitions)
        .unwrap()
        .contains("0x0a12"));
}

#[tokio::test]
async fn refusals_and_unreachable_hosts() {
    let host = sm_host("storage=0x0100 : ALL=full;\n", None).await;
    let sm = RemoteSm::new(&RemoteConfig {
        endpoint: format!("http://{}", host.addr),
        ..RemoteConfig::default()
    })
    .unwrap();
    let err = sm.apply(&desired(&[0x0100]), 3).await.unwrap_err();
    assert!(
        matches!(&err, SmError::Refused(m) if m.contains("0x0100")),
        "{err:?}"
    );

    let addr = host.addr;
    drop(host);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let gone = RemoteSm::new(&RemoteConfig {
        endpoint: format!("http://{addr}"),
        connect_timeout_ms: Some(500),
        ..RemoteConfig::default()
    })
    .unwrap();
    let err = gone.apply(&desired(&[1]), 4).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
}

struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: leaf("localhost"),
        client: leaf("node-7"),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test]
async fn mutual_tls() {
    // reqwest and tonic enable both rustls providers; the server side needs one chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = pki();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server.0, &pki.server.1))
        .client_ca_root(Certificate::from_pem(&pki.ca));
    let host = sm_host("", Some(tls)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = RemoteConfig {
        endpoint: format!("https://localhost:{}", host.addr.port()),
        ca: Some(write(dir.path(), "ca.pem", &pki.ca)),
        cert: Some(write(dir.path(), "cert.pem", &pki.client.0)),
        key: Some(write(dir.path(), "key.pem", &pki.client.1)),
        domain_name: Some("localhost".into()),
        ..RemoteConfig::default()
    };
    RemoteSm::new(&config)
        .unwrap()
        .apply(&desired(&[0x0a12]), 5)
        .await
        .unwrap();
    assert!(std::fs::read_to_string(&host.partitions)
        .unwrap()
        .contains("0x0a12"));

    // A client whose certificate the SM host does not trust is turned away.
    let stranger = pki_stranger();
    let bad = RemoteConfig {
        cert: Some(write(dir.path(), "s-cert.pem", &stranger.0)),
        key: Some(write(dir.path(), "s-key.pem", &stranger.1)),
        ..config
    };
    assert!(RemoteSm::new(&bad)
        .unwrap()
        .apply(&desired(&[1]), 6)
        .await
        .is_err());
}

fn pki_stranger() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["stranger".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}
