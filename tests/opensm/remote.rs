//! RemoteSm against the SM host's Partitions service over loopback: plaintext, mTLS, refusals
//! and an unreachable SM host.

use testkit::common;

use common::pki::{self_signed, write, Pki};
use common::sm_host::opensm_backend;
use fabric_agent::api::gate::{LiveTlsAccess, TlsAccess, TlsService};
use fabric_agent::api::sm_v1::convert::sm_host_status;
use fabric_agent::api::PartitionsService;
use fabric_agent::api::RemoteSm;
use fabric_agent::api::{ClientAllowlist, Guarded, NodeMapping, Policy};
use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fabric_agent::proto::sm::GetNodeMembershipsRequest;
use fabric_agent::sm::remote::RemoteConfig;
use fabric_agent::sm::{SmError, SubnetManager};
use std::net::SocketAddr;
use std::path::PathBuf;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

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

impl SmHost {
    /// A remote backend reaching this SM host in plaintext.
    fn plaintext_client(&self) -> RemoteSm {
        RemoteSm::new(&RemoteConfig {
            endpoint: format!("http://{}", self.addr),
            ..RemoteConfig::default()
        })
        .unwrap()
    }
}

/// The SM host's Partitions service behind the call gate: plaintext loopback runs under the
/// test-rig policy (what `insecure_plaintext_for_tests = true` selects); TLS under an allowlist
/// whose node certificates map to their node ids.
async fn sm_host(operator: &str, tls: Option<ServerTlsConfig>) -> SmHost {
    let dir = tempfile::tempdir().unwrap();
    let partitions = dir.path().join("partitions.conf");
    std::fs::write(&partitions, operator).unwrap();
    let backend = opensm_backend(&partitions);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut builder = Server::builder();
    let policy = match tls {
        Some(tls) => {
            builder = builder.tls_config(tls).unwrap();
            Policy::LiveTls {
                access: LiveTlsAccess::new(TlsAccess::new(
                    ClientAllowlist::default(),
                    ClientAllowlist::parse(&["dns:node-7".into()]).unwrap(),
                    ClientAllowlist::default(),
                    NodeMapping::default(),
                )),
                service: TlsService::Partitions,
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
        node_id: fabric_agent::domain::NodeId::parse("node-7").unwrap(),
        port_guids: vec![Guid(0x0002_c903_000e_0b72)],
        keys: keys
            .iter()
            .map(|k| {
                (
                    PKey::new(*k).unwrap(),
                    KeySetting {
                        membership: Membership::Full,
                        name: "tenant-a".into(),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}

#[tokio::test]
async fn plaintext_loopback_apply_reaches_the_file() {
    let host = sm_host("", None).await;
    let sm = host.plaintext_client();
    sm.apply(&desired(&[0x0a12]), 1).await.unwrap();
    let text = std::fs::read_to_string(&host.partitions).unwrap();
    assert!(
        text.contains("fa.0a12=0x0a12 :\n    0x0002c903000e0b72=full;"),
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
    let sm = host.plaintext_client();
    let err = sm.apply(&desired(&[0x0100]), 3).await.unwrap_err();
    assert!(matches!(&err, SmError::Refused(_)), "{err:?}");
    let status = sm_host_status(&err).expect("the SM host's status");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("0x0100"),
        "names the key: {status:?}"
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

#[tokio::test]
async fn mutual_tls() {
    // reqwest and tonic enable both rustls providers; the server side needs one chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new("fab1 CA");
    let ca = pki.ca.pem();
    let server = pki.leaf(&["localhost"], None, |_| {});
    let client = pki.leaf(&["node-7"], None, |_| {});
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&server.0, &server.1))
        .client_ca_root(Certificate::from_pem(&ca));
    let host = sm_host("", Some(tls)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = RemoteConfig {
        endpoint: format!("https://{}", host.addr),
        ca: Some(write(dir.path(), "ca.pem", &ca)),
        cert: Some(write(dir.path(), "cert.pem", &client.0)),
        key: Some(write(dir.path(), "key.pem", &client.1)),
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
    let stranger = self_signed("stranger");
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
