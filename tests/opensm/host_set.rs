//! The SM-host set comes from the fabric side, in process: two SM hosts' Partitions services on
//! loopback (OpenSM backends on their own files, reloads accepted), each pulling the other over
//! the real `PullNodeSets` client and stating its name, the hosts it knows and the ones it holds
//! fenced; a node's real remote backend:
//! - with both hosts as endpoints, an apply is acknowledged, naming both;
//! - with one of them only, it is never acknowledged, the reason names the missing host, and the
//!   node raises `SM_HOST_SET_INCOMPLETE`;
//! - two endpoints reaching one host (two spellings) are refused as one host;
//! - one host's service gone and held fenced by the other (a fixed evidence that its SM is
//!   silent): the apply is acknowledged, the fenced host excused; the evidence saying its SM
//!   answers instead: not acknowledged, the reason says why and what to do.

use testkit::common;

use async_trait::async_trait;
use common::sm_host::opensm_backend;
use fabric_agent::api::{Guarded, PartitionsService, Policy, RemoteSm};
use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::opensm::fabric_side::OpenSmSide;
use fabric_agent::sm::opensm::fence::{FenceEvidence, Fences, PeerIdentity};
use fabric_agent::sm::opensm::opensm_state::LogStateReader;
use fabric_agent::sm::opensm::opensm_state::OpenSmState;
use fabric_agent::sm::opensm::peers::PeersConfig;
use fabric_agent::sm::opensm::sminfo::{PeerSmCheck, SmRole};
use fabric_agent::sm::opensm::sync::PeerSync;
use fabric_agent::sm::opensm::InMemoryNodeStore;
use fabric_agent::sm::remote::RemoteConfig;
use fabric_agent::sm::{SmError, SubnetManager};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Server;

/// What the fake evidence says of any SM port.
struct Evidence(Mutex<PeerSmCheck>);

#[async_trait]
impl FenceEvidence for Evidence {
    async fn check(&self, _guid: u64) -> PeerSmCheck {
        self.0.lock().unwrap().clone()
    }
}

struct Host {
    dir: tempfile::TempDir,
    backend: fabric_agent::sm::opensm::OpenSmBackend,
    sync: Arc<PeerSync>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Host {
    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SM host `name` serving on `listener`, pulling `peer_name` at `peer_port`.
fn host(
    name: &str,
    listener: tokio::net::TcpListener,
    peer_name: &str,
    peer_port: u16,
    evidence: Arc<Evidence>,
    role: Option<Arc<SmRole>>,
    fence_after: Duration,
) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let partitions = dir.path().join("partitions.conf");
    std::fs::write(&partitions, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let backend = opensm_backend(&partitions);
    let endpoint = format!("http://127.0.0.1:{peer_port}");
    let peers = fabric_agent::api::sm_v1::peers::peers(&PeersConfig {
        peers: vec![endpoint.clone()],
        request_timeout_ms: 2000,
        ..PeersConfig::default()
    })
    .unwrap();
    let fences = Fences::new(
        name.into(),
        vec![PeerIdentity {
            endpoint,
            name: Some(peer_name.into()),
            sm_port_guid: Some(0x22),
        }],
        Some(evidence as Arc<dyn FenceEvidence>),
        Some(Arc::new(InMemoryNodeStore::default())),
        fence_after,
    )
    .unwrap();
    let sync = PeerSync::with_fences(backend.clone(), name.into(), peers, role, Arc::new(fences));
    let side = OpenSmSide::new(backend.clone(), None).with_sync(Some(sync.clone()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let router = Server::builder().add_service(Guarded::new(
        PartitionsService::new(side).into_server(),
        Policy::InsecureTest,
    ));
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
    });
    Host {
        dir,
        backend,
        sync,
        stop: Some(stop),
    }
}

fn node(endpoints: &[String]) -> RemoteSm {
    RemoteSm::new(&RemoteConfig {
        endpoints: endpoints.to_vec(),
        request_timeout_ms: Some(3000),
        connect_timeout_ms: Some(1000),
        ..RemoteConfig::default()
    })
    .unwrap()
}

fn desired(key: u32) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse("node-7").unwrap(),
        port_guids: vec![Guid(0x0002_c903_000e_0b72)],
        keys: [(
            PKey::new(key).unwrap(),
            KeySetting {
                membership: Membership::Full,
                name: "tenant-a".into(),
                ports: None,
            },
        )]
        .into_iter()
        .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_counts_the_hosts_the_sm_hosts_state_by_identity() {
    let la = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (pa, pb) = (
        la.local_addr().unwrap().port(),
        lb.local_addr().unwrap().port(),
    );
    let evidence = Arc::new(Evidence(Mutex::new(PeerSmCheck::Answers(
        OpenSmState::Standby,
    ))));
    let a = host("sma", la, "smb", pb, evidence.clone(), None, Duration::ZERO);
    let mut b = host("smb", lb, "sma", pa, evidence.clone(), None, Duration::ZERO);
    let (ea, eb) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    a.sync.round().await;
    b.sync.round().await;

    // Both hosts: acknowledged, naming both.
    let both = node(&[ea.clone(), eb.clone()]);
    let ok = both.apply(&desired(0x0a11), 1).await.unwrap();
    assert!(ok.detail.contains("sma, smb"), "{}", ok.detail);
    assert!(both.conditions().is_empty());

    // One host only: never acknowledged, and the node says why.
    let one = node(std::slice::from_ref(&ea));
    for generation in 2..4 {
        let err = one.apply(&desired(0x0a11), generation).await.unwrap_err();
        assert!(matches!(err, SmError::Refused(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("\"smb\" (known to sma") && text.contains("not among"),
            "{text}"
        );
    }
    let c = one.conditions();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].kind.name(), "SM_HOST_SET_INCOMPLETE");
    assert!(c[0].detail.contains("smb"), "{}", c[0].detail);

    // Two spellings of one host.
    let twice = node(&[ea.clone(), format!("http://localhost:{pa}"), eb.clone()]);
    let err = twice.apply(&desired(0x0a11), 4).await.unwrap_err();
    assert!(
        err.to_string().contains("answer as one SM host \"sma\""),
        "{err}"
    );

    // smb's service goes away. While sma's evidence says its SM answers, nothing is excused and
    // the reason says what to do.
    b.stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.sync.round().await;
    let err = both.apply(&desired(0x0a12), 5).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("smb is not fenced") && text.contains("answers SMInfo") && text.contains(&eb),
        "{text}"
    );
    assert!(a
        .sync
        .conditions()
        .iter()
        .any(|c| c.kind.name() == "SM_HOST_AGENT_SILENT"));
    // Its SM proven silent: sma fences smb, states it, and the node's apply is acknowledged with
    // smb excused (the node knows smb's endpoint by the name it stated earlier).
    *evidence.0.lock().unwrap() = PeerSmCheck::Silent("SMInfo: no answer".into());
    a.sync.round().await;
    assert_eq!(a.sync.fences().fenced()[0].host, "smb");
    let ok = both.apply(&desired(0x0a12), 6).await.unwrap();
    assert!(ok.detail.contains("excused: smb"), "{}", ok.detail);
    // A node that never heard smb's name cannot excuse its endpoint (plaintext: no identity).
    let fresh = node(&[ea.clone(), eb.clone()]);
    assert!(fresh.apply(&desired(0x0a12), 7).await.is_err());
}

/// A host whose own OpenSM is not running, whose peers' agents are silent while a peer's SM
/// answers SMInfo, may have been fenced by that peer: it holds every stored set back (its file
/// loses their keys, so an OpenSM restarted alone there programs none a release may have ended)
/// until a peer answers again and confirms them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_may_have_been_fenced_holds_every_set_back_until_a_peer_confirms_it() {
    let la = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (pa, pb) = (
        la.local_addr().unwrap().port(),
        lb.local_addr().unwrap().port(),
    );
    let evidence = Arc::new(Evidence(Mutex::new(PeerSmCheck::Answers(
        OpenSmState::Master,
    ))));
    let log_dir = tempfile::tempdir().unwrap();
    let dead = Arc::new(
        SmRole::from_log(Arc::new(LogStateReader::new(log_dir.path().join("log"))))
            .with_pid_check(Some(Box::new(|| Err("OpenSM's pid 9 is gone".into())))),
    );
    let bound = Duration::from_millis(300);
    let a = host("sma", la, "smb", pb, evidence.clone(), Some(dead), bound);
    let mut b = host("smb", lb, "sma", pa, evidence.clone(), None, Duration::ZERO);
    a.sync.round().await;
    b.sync.round().await;
    let both = node(&[
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    ]);
    both.apply(&desired(0x0a21), 1).await.unwrap();
    let file = || std::fs::read_to_string(a.dir.path().join("partitions.conf")).unwrap();
    assert!(file().contains("0x0a21"));
    // Peers answer: nothing is held back, whatever its OpenSM.
    a.sync.round().await;
    assert!(!a.backend.node("node-7").unwrap().gated);

    // smb's agent goes silent while its SM is seen alive: sma holds node-7's set back.
    b.stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.sync.round().await;
    assert!(
        !a.backend.node("node-7").unwrap().gated,
        "silent for less than the bound"
    );
    tokio::time::sleep(bound).await;
    a.sync.round().await;
    assert!(a.backend.node("node-7").unwrap().gated);
    assert!(!file().contains("0x0a21"), "{}", file());
    assert!(!a.sync.status().caught_up);
    // The node's next set confirms it again (any set from the node confirms).
    let err = both.apply(&desired(0x0a21), 2).await.unwrap_err();
    let n = a.backend.node("node-7").unwrap();
    assert!(!n.gated, "{err}\n{n:?}");
    assert!(file().contains("0x0a21"));
}
