//! Node identity on the SM host: `fabric.sm.v1.Partitions` served over the agent's own
//! reloadable TLS acceptor and call gate (in process). node1's certificate may write and read
//! node1 only: writing or reading node2 is PERMISSION_DENIED and changes nothing; an operator
//! reads every node but writes none; every SetNodeMemberships leaves one audit line.
//! Certificates are generated here.

use testkit::common;

use common::pki::Pki;
use common::sm_host::opensm_backend;
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::api::gate::{LiveTlsAccess, TlsAccess, TlsService};
use fabric_agent::api::PartitionsService;
use fabric_agent::api::{ClientAllowlist, Guarded, NodeMapping, Policy, TlsReloader};
use fabric_agent::config::TlsConfig;
use fabric_agent::proto::sm as pb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use std::path::PathBuf;
use std::sync::Arc;
use tonic::transport::{Channel, Server};
use tonic::Code;

/// The log lines of this test's thread: the test runs on a current-thread runtime, so the
/// server's tasks log through the thread's default subscriber, and the other tests of this
/// binary (running on their own threads) do not reach it.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn install() -> (Captured, tracing::subscriber::DefaultGuard) {
        let c = Captured::default();
        let writer = c.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        (c, tracing::subscriber::set_default(subscriber))
    }

    fn audit(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains("fabric_agent::audit"))
            .map(str::to_owned)
            .collect()
    }
}

struct SmHost {
    dir: tempfile::TempDir,
    pki: Pki,
    partitions: PathBuf,
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl SmHost {
    async fn start() -> SmHost {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let pki = Pki::new("fab2 CA");
        pki.write_ca(&d.join("ca.pem"));
        let (cert, key) = pki.issue(d, "server", &["localhost"], "smhost");
        let tls = TlsConfig {
            cert,
            key,
            client_ca: d.join("ca.pem"),
            allowed_clients: ClientAllowlist::parse(&["dns:control-plane.example".into()]).unwrap(),
            partitions_clients: ClientAllowlist::parse(&["dns:*.nodes.fab2.example".into()])
                .unwrap(),
            operator_clients: ClientAllowlist::parse(&["dns:ops.fab2.example".into()]).unwrap(),
            nodes: NodeMapping::from_config(Some("{node}.nodes.fab2.example"), &Default::default())
                .unwrap(),
        };
        let partitions = d.join("partitions.conf");
        std::fs::write(&partitions, "").unwrap();
        let backend = opensm_backend(&partitions);
        let (reloader, _) = TlsReloader::load(&tls).unwrap();
        let access = LiveTlsAccess::new(TlsAccess::new(
            tls.allowed_clients.clone(),
            tls.partitions_clients.clone(),
            tls.operator_clients.clone(),
            tls.nodes.clone(),
        ));
        let policy = Policy::LiveTls {
            access: access.clone(),
            service: TlsService::Partitions,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let limits = fabric_agent::api::gate::conn_limits::ConnLimits::new(
            64,
            16,
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(3600),
        );
        let incoming =
            tokio_stream::wrappers::ReceiverStream::new(reloader.incoming(listener, limits));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = Server::builder().add_service(Guarded::new(
            PartitionsService::new(backend)
                .with_live_node_mapping(access)
                .into_server(),
            policy,
        ));
        tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        SmHost {
            dir,
            pki,
            partitions,
            url: format!("https://127.0.0.1:{port}"),
            _stop: stop,
        }
    }

    async fn client(&self, sans: &[&str], cn: &str) -> PartitionsClient<Channel> {
        let file = format!("client-{}", sans.first().copied().unwrap_or(cn));
        let identity = self.pki.issue(self.dir.path(), &file, sans, cn);
        let tls = ClientTls {
            ca: Some(self.dir.path().join("ca.pem")),
            identity: Some(identity),
            domain: Some("localhost".into()),
        };
        PartitionsClient::new(tcp(&self.url, &tls).await.unwrap())
    }

    fn file(&self) -> String {
        std::fs::read_to_string(&self.partitions).unwrap()
    }
}

fn set(node: &str, guid: &str, pkey: u32, generation: u64) -> pb::SetNodeMembershipsRequest {
    pb::SetNodeMembershipsRequest {
        memberships: Some(pb::NodeMemberships {
            node_id: node.into(),
            port_guids: vec![guid.into()],
            keys: vec![pb::KeyMembership {
                pkey,
                full: true,
                name: format!("t{pkey:x}"),
                port_guids: Vec::new(),
            }],
            generation,
            grants: Vec::new(),
        }),
    }
}

fn get(node: &str) -> pb::GetNodeMembershipsRequest {
    pb::GetNodeMembershipsRequest {
        node_id: node.into(),
    }
}

const NODE1_PORT: &str = "0x0002c903000e0b01";
const NODE2_PORT: &str = "0x0002c903000e0b02";

#[tokio::test(flavor = "current_thread")]
async fn a_node_certificate_speaks_only_for_its_node() {
    let (log, _logging) = Captured::install();
    let host = SmHost::start().await;
    let mut node1 = host.client(&["node1.nodes.fab2.example"], "node1").await;
    let mut node2 = host.client(&["node2.nodes.fab2.example"], "node2").await;
    let mut ops = host.client(&["ops.fab2.example"], "ops").await;

    node2
        .set_node_memberships(set("node2", NODE2_PORT, 0x0b, 1))
        .await
        .unwrap();
    let before = host.file();
    assert!(before.contains(NODE2_PORT), "{before}");

    // node1 overwriting node2's set (even with the highest generation) is refused, nothing
    // written.
    let e = node1
        .set_node_memberships(set("node2", NODE1_PORT, 0x0c, 1 << 53))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("node2"), "{}", e.message());
    assert_eq!(host.file(), before);
    let held = node2
        .get_node_memberships(get("node2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.generation, 1);
    assert_eq!(held.port_guids, vec![NODE2_PORT.to_owned()]);

    // node1 reading node2's tenancy is refused too.
    let e = node1.get_node_memberships(get("node2")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // Its own node is fine.
    node1
        .set_node_memberships(set("node1", NODE1_PORT, 0x0d, 1))
        .await
        .unwrap();
    assert!(host.file().contains(NODE1_PORT));
    node1.get_node_memberships(get("node1")).await.unwrap();

    // The operator reads every node and writes none.
    for n in ["node1", "node2"] {
        ops.get_node_memberships(get(n)).await.unwrap();
    }
    let after = host.file();
    let e = ops
        .set_node_memberships(set("node1", NODE1_PORT, 0x0e, 2))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(host.file(), after);

    // A certificate outside partitions_clients (the control plane's) is refused here, and a
    // SAN-less certificate whose CN is a node id does not pass as that node.
    let mut cp = host.client(&["control-plane.example"], "cp").await;
    let e = cp.get_node_memberships(get("node1")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let mut cn_only = host.client(&[], "node1").await;
    let e = cn_only
        .set_node_memberships(set("node1", NODE1_PORT, 0x0f, 3))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(host.file(), after);

    // One outcome line per SetNodeMemberships: 2 served, 3 refused (the operator's and the
    // CN-only one at the gate); each of the 3 calls that reached the handler was recorded when
    // admitted, before anything.
    let audit = log.audit();
    let sets: Vec<_> = audit
        .iter()
        .filter(|l| l.contains("SetNodeMemberships") && l.contains("result="))
        .collect();
    assert_eq!(sets.len(), 5, "{audit:#?}");
    let admitted = audit
        .iter()
        .filter(|l| l.contains("SetNodeMemberships") && l.contains("phase=\"admitted\""))
        .count();
    assert_eq!(admitted, 3, "{audit:#?}");
    let denied = sets
        .iter()
        .find(|l| l.contains("node=\"node2\"") && l.contains("PermissionDenied"))
        .unwrap_or_else(|| panic!("{audit:#?}"));
    for field in [
        "caller=cert dns:node1.nodes.fab2.example",
        "keys=\"0x000c:full\"",
        "ports=1",
        "generation=9007199254740992",
    ] {
        assert!(denied.contains(field), "{field} in {denied}");
    }
    assert!(
        sets.iter()
            .any(|l| l.contains("caller=cert dns:node2.nodes.fab2.example")
                && l.contains("result=Ok")),
        "{audit:#?}"
    );

    // A generation near u64::MAX would fence the node for good (no later set could be newer):
    // above 2^53 it is refused from any caller, its own node included, and nothing is written.
    let before = host.file();
    for generation in [(1 << 53) + 1, u64::MAX - 1, u64::MAX] {
        let e = node2
            .set_node_memberships(set("node2", NODE2_PORT, 0x0c, generation))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("generation"), "{}", e.message());
        assert_eq!(host.file(), before);
    }
    // The node goes on with its own counter.
    node2
        .set_node_memberships(set("node2", NODE2_PORT, 0x0c, 2))
        .await
        .unwrap();
    let held = node2
        .get_node_memberships(get("node2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.generation, 2);
}
