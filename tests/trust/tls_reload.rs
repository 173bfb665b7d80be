//! SIGHUP replaces the mTLS listener's allowlists in a running daemon: an identity taken off
//! `allowed_clients` is refused (PERMISSION_DENIED) at its next call, on a fresh connection and
//! on one opened before the reload, while another listed identity still calls; the log says the
//! list was applied, and says a changed certificate path needs a restart.

use testkit::common;

use common::pki::Pki;
use common::*;
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

/// A channel with this identity (certificate, key), trusting `ca` for the agent.
async fn channel(url: &str, ca: &Path, identity: &(PathBuf, PathBuf)) -> Channel {
    let tls = ClientTls {
        ca: Some(ca.to_owned()),
        identity: Some(identity.clone()),
        domain: Some("localhost".into()),
    };
    tcp(url, &tls).await.unwrap()
}

async fn get_node(ch: Channel) -> Result<(), tonic::Status> {
    FabricAgentClient::new(ch)
        .get_node(pb::GetNodeRequest {})
        .await
        .map(|_| ())
}

/// Waits until the log holds `text` `count` times.
fn wait_log(d: &Daemon, text: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.log().matches(text).count() < count {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in the log: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The log line holding `text` last.
fn last_line(d: &Daemon, text: &str) -> String {
    let log = d.log();
    log.lines()
        .rev()
        .find(|l| l.contains(text))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_taken_off_the_allowlist_is_refused_after_sighup() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = Pki::new("test CA");
    let (crt, key) = pki.issue(dir, "server", &["localhost"], "node1");
    let client_ca = dir.join("client-ca.pem");
    pki.write_ca(&client_ca);
    let port = free_port();
    let config = |allowed: &str, cert: &Path| {
        format!(
            "[listen]\nunix_socket = \"{}\"\ntcp = \"127.0.0.1:{port}\"\n[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nallowed_clients = {allowed}\n",
            dir.join("agent.sock").display(),
            cert.display(),
            key.display(),
            client_ca.display(),
        )
    };
    let both = "[\"dns:a.example\", \"dns:b.example\"]";
    let mut d = Daemon::prepare(dir, &config(both, &crt));
    d.spawn(&[]);
    let url = format!("https://127.0.0.1:{port}");
    let a = pki.issue(dir, "a", &["a.example"], "a");
    let b = pki.issue(dir, "b", &["b.example"], "b");
    let a_open = channel(&url, &client_ca, &a).await;
    get_node(a_open.clone()).await.unwrap();
    get_node(channel(&url, &client_ca, &b).await).await.unwrap();

    // b only: the next call of a is refused, on the open connection and a fresh one.
    std::fs::write(
        &d.config,
        base_config(dir, &config("[\"dns:b.example\"]", &crt)),
    )
    .unwrap();
    nix::sys::signal::kill(d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_log(&d, "SIGHUP: changed and applied", 1);
    let applied = last_line(&d, "SIGHUP: changed and applied");
    assert!(applied.contains("listen.tls.allowed_clients"), "{applied}");
    assert!(
        !d.log().contains("NOT applied"),
        "nothing left undone: {}",
        d.log()
    );
    for ch in [a_open.clone(), channel(&url, &client_ca, &a).await] {
        let e = get_node(ch).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e}");
        assert!(e.message().contains("dns:a.example"), "{}", e.message());
    }
    get_node(channel(&url, &client_ca, &b).await)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));

    // A new certificate path is not applied in place: said so, and the old list stays.
    let moved = dir.join("server-moved.crt");
    std::fs::copy(&crt, &moved).unwrap();
    std::fs::write(
        &d.config,
        base_config(dir, &config("[\"dns:b.example\"]", &moved)),
    )
    .unwrap();
    nix::sys::signal::kill(d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_log(&d, "NOT applied until a restart", 1);
    let restart = last_line(&d, "NOT applied until a restart");
    assert!(restart.contains("listen.tls.cert"), "{restart}");
    assert_eq!(
        d.log().matches("SIGHUP: changed and applied").count(),
        1,
        "{}",
        d.log()
    );
    assert_eq!(
        get_node(a_open).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert!(d.stop().success());
}
