//! Per-identity quotas on the TCP listener, end to end against the daemon with real mTLS
//! clients: one node's certificate that opens connections and streams until refused gets a
//! RESOURCE_EXHAUSTED naming its quota, while another node's calls and an operator's calls still
//! succeed; once the nodes together hold the shared pool, the operator still gets the slots kept
//! for it. Certificates are made here.

use testkit::common;

use common::pki::Pki;
use common::*;
use fabric_agent::api::client::{tcp, ClientTls};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

struct Agent {
    _d: Daemon,
    addr: SocketAddr,
    ca: PathBuf,
    dir: PathBuf,
    pki: Pki,
}

fn start(dir: &Path) -> Agent {
    let pki = Pki::new("quota CA");
    let (crt, key) = pki.issue(dir, "server", &["localhost"], "smhost");
    let ca = dir.join("ca.pem");
    pki.write_ca(&ca);
    let port = free_port();
    let extra = format!(
        "[listen]\nunix_socket = \"{}\"\ntcp = \"127.0.0.1:{port}\"\n[listen.tls]\ncert = \"{}\"\n\
         key = \"{}\"\nclient_ca = \"{}\"\nallowed_clients = [\"dns:control-plane.example\"]\n\
         partitions_clients = [\"dns:*.nodes.example\"]\noperator_clients = [\"dns:ops.example\"]\n\
         [limits]\nmax_connections = 24\nreserved_connections = 8\n\
         max_connections_per_identity = 3\nmax_watch_streams = 8\nreserved_watch_streams = 2\n\
         max_watch_streams_per_identity = 2\n",
        dir.join("agent.sock").display(),
        crt.display(),
        key.display(),
        ca.display(),
    );
    let mut d = Daemon::prepare(dir, &extra);
    d.spawn(&[]);
    Agent {
        _d: d,
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        ca,
        dir: dir.to_owned(),
        pki,
    }
}

impl Agent {
    /// A new mTLS connection presenting a certificate for `name`.
    async fn connect(&self, name: &str) -> HealthClient<Channel> {
        let identity = self.pki.issue(&self.dir, name, &[name], name);
        let tls = ClientTls {
            ca: Some(self.ca.clone()),
            identity: Some(identity),
            domain: Some("localhost".into()),
        };
        HealthClient::new(tcp(&format!("https://{}", self.addr), &tls).await.unwrap())
    }
}

async fn check(c: &mut HealthClient<Channel>) -> Result<HealthCheckResponse, tonic::Status> {
    c.check(HealthCheckRequest::default())
        .await
        .map(|r| r.into_inner())
}

async fn watch(
    c: &mut HealthClient<Channel>,
) -> Result<tonic::Streaming<HealthCheckResponse>, tonic::Status> {
    c.watch(HealthCheckRequest::default())
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_exhausts_its_quota_and_other_nodes_and_operators_get_through() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = start(tmp.path());
    let node_a = "a.nodes.example";

    // Connections: node a holds its 3; the 4th is served only to be refused, with the reason.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = agent.connect(node_a).await;
        check(&mut c).await.expect("node a within its quota");
        held.push(c);
    }
    let mut over = agent.connect(node_a).await;
    let e = check(&mut over)
        .await
        .expect_err("a 4th connection of node a");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("max_connections_per_identity"),
        "{}",
        e.message()
    );
    assert!(
        e.message().contains("dns:a.nodes.example"),
        "{}",
        e.message()
    );
    // Another node and an operator are not affected.
    let mut node_b = agent.connect("b.nodes.example").await;
    check(&mut node_b).await.expect("node b's call");
    let mut ops = agent.connect("ops.example").await;
    check(&mut ops).await.expect("the operator's call");

    // Streams: node a opens Health.Watch streams until refused.
    let mut streams = Vec::new();
    for _ in 0..2 {
        streams.push(
            watch(&mut held[0])
                .await
                .expect("node a within its stream quota"),
        );
    }
    let e = watch(&mut held[1])
        .await
        .expect_err("a 3rd stream of node a");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("max_watch_streams_per_identity"),
        "{}",
        e.message()
    );
    streams.push(watch(&mut node_b).await.expect("node b's stream"));
    streams.push(watch(&mut ops).await.expect("the operator's stream"));

    // The nodes fill the shared pool (8 - 2 reserved): b's second, then c's two.
    streams.push(watch(&mut node_b).await.expect("node b's 2nd stream"));
    let mut node_c = agent.connect("c.nodes.example").await;
    streams.push(watch(&mut node_c).await.expect("node c's stream"));
    streams.push(watch(&mut node_c).await.expect("node c's 2nd stream"));
    let mut node_d = agent.connect("d.nodes.example").await;
    let e = watch(&mut node_d)
        .await
        .expect_err("the shared pool is full");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("reserved_watch_streams"),
        "{}",
        e.message()
    );
    // The operator still gets the slot kept for it, and unary calls are still answered.
    streams.push(
        watch(&mut ops)
            .await
            .expect("the operator's 2nd stream, from the reserve"),
    );
    check(&mut node_d).await.expect("node d's unary call");

    // A stream given back is there for the node again.
    drop(streams.remove(0));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match watch(&mut held[2]).await {
            Ok(s) => {
                streams.push(s);
                break;
            }
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the freed stream slot never came back: {e:?}"),
        }
    }
}
