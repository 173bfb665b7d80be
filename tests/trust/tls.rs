//! The mTLS listener's identity checks, end to end against the daemon: typed allowlist entries
//! (a CN counts only for a certificate without SANs), an expired client certificate refused with
//! UNAUTHENTICATED, the audit line of an attach over mTLS, and the client CA bundle and the
//! agent's own certificate reloaded on SIGHUP (a bad new bundle keeps the old material). Certificates are generated here.

use testkit::common;

use common::pki::Pki;
use common::*;
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use rcgen::ExtendedKeyUsagePurpose;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::Code;

struct Tls {
    d: Daemon,
    url: String,
    ca: PathBuf,
}

impl Tls {
    fn start(dir: &Path, pki: &Pki, client_ca: &Path, allowed: &str) -> Tls {
        let (crt, key) = pki.issue(dir, "server", &["localhost"], "node1");
        let port = free_port();
        let extra = format!(
            "[listen]\nunix_socket = \"{}\"\ntcp = \"127.0.0.1:{port}\"\n[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nallowed_clients = {allowed}\n",
            dir.join("agent.sock").display(),
            crt.display(),
            key.display(),
            client_ca.display(),
        );
        let mut d = Daemon::prepare(dir, &extra);
        d.spawn(&[]);
        let ca = dir.join("server-ca.pem");
        std::fs::write(&ca, pki.ca.pem()).unwrap();
        Tls {
            d,
            url: format!("https://127.0.0.1:{port}"),
            ca,
        }
    }

    /// GetNode over a fresh connection with this identity.
    async fn get_node(&self, identity: &(PathBuf, PathBuf)) -> Result<(), tonic::Status> {
        self.get_node_trusting(&self.ca, identity).await
    }

    /// GetNode over a fresh connection that trusts `server_ca` for the agent's certificate.
    async fn get_node_trusting(
        &self,
        server_ca: &Path,
        identity: &(PathBuf, PathBuf),
    ) -> Result<(), tonic::Status> {
        let tls = ClientTls {
            ca: Some(server_ca.to_owned()),
            identity: Some(identity.clone()),
            domain: Some("localhost".into()),
        };
        let ch = tcp(&self.url, &tls)
            .await
            .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
        FabricAgentClient::new(ch)
            .get_node(pb::GetNodeRequest {})
            .await
            .map(|_| ())
    }

    /// A channel to the agent with this identity, trusting the agent's CA.
    async fn channel(&self, identity: &(PathBuf, PathBuf)) -> tonic::transport::Channel {
        let tls = ClientTls {
            ca: Some(self.ca.clone()),
            identity: Some(identity.clone()),
            domain: Some("localhost".into()),
        };
        tcp(&self.url, &tls).await.unwrap()
    }

    fn wait_log(&self, text: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.d.log().matches(text).count() < count {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log: {}",
                self.d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A certificate and key file.
type Identity = (PathBuf, PathBuf);

/// A client CA rotation under way: the agent trusts the old CA only (its `client-ca.pem`), and
/// the control plane has a certificate from each: (old CA, new CA, the agent's client CA file,
/// the agent, the certificate by the old CA, the one by the new CA).
fn rotation(dir: &Path) -> (Pki, Pki, PathBuf, Tls, Identity, Identity) {
    let old = Pki::new("old client CA");
    let new = Pki::new("new client CA");
    let ca = dir.join("client-ca.pem");
    std::fs::write(&ca, old.ca.pem()).unwrap();
    let t = Tls::start(dir, &old, &ca, "[\"dns:control-plane.example\"]");
    let by_old = old.issue(dir, "cp-old", &["control-plane.example"], "cp");
    let by_new = new.issue(dir, "cp-new", &["control-plane.example"], "cp");
    (old, new, ca, t, by_old, by_new)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_identities_validity_and_the_audit_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = Pki::new("fabric test CA");
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, pki.ca.pem()).unwrap();
    let mut t = Tls::start(
        dir,
        &pki,
        &ca,
        "[\"dns:control-plane.example\", \"cn:legacy-cp\"]",
    );
    let cp = pki.issue(dir, "cp", &["control-plane.example"], "cp");
    t.get_node(&cp)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", t.d.log()));

    // A CN on the list does not count when the certificate carries SANs.
    let cn_with_san = pki.issue(dir, "cn-san", &["other.example"], "legacy-cp");
    let e = t.get_node(&cn_with_san).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("dns:other.example"), "{}", e.message());
    let cn_only = pki.issue(dir, "cn-only", &[], "legacy-cp");
    t.get_node(&cn_only)
        .await
        .expect("a SAN-less certificate is named by its CN");

    // Expired and not-yet-valid certificates from the trusted CA: UNAUTHENTICATED with a reason.
    let expired = pki.issue_with(
        dir,
        "expired",
        &["control-plane.example"],
        Some("cp"),
        |p| {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        },
    );
    let e = t.get_node(&expired).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("expired"), "{}", e.message());
    let early = pki.issue_with(dir, "early", &["control-plane.example"], Some("cp"), |p| {
        p.not_before = rcgen::date_time_ymd(2990, 1, 1);
        p.not_after = rcgen::date_time_ymd(2991, 1, 1);
    });
    let e = t.get_node(&early).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("not valid yet"), "{}", e.message());

    // A certificate for servers only never gets an answer.
    let server_only = pki.issue_with(dir, "srv", &["control-plane.example"], Some("cp"), |p| {
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    });
    assert!(t.get_node(&server_only).await.is_err());

    // An attach over mTLS leaves one audit line naming the certificate identity; an attach
    // with an expired certificate is refused and audited too.
    let ch = t.channel(&cp).await;
    let mut c = FabricAgentClient::new(ch);
    c.attach_partition(attach("vm-7", partition("ibpart_b7", 0x0b07), None))
        .await
        .unwrap();
    let ch = t.channel(&expired).await;
    let e = FabricAgentClient::new(ch)
        .attach_partition(attach("vm-8", partition("ibpart_b8", 0x0b08), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    t.d.stop();
    let log = t.d.log();
    let audit: Vec<_> = log
        .lines()
        .filter(|l| l.contains("fabric_agent::audit"))
        .collect();
    let ok: Vec<_> = audit
        .iter()
        .filter(|l| l.contains("caller=cert dns:control-plane.example") && l.contains("result="))
        .collect();
    assert_eq!(ok.len(), 1, "{audit:#?}");
    // The call was recorded when it was admitted, before it could change anything.
    assert!(
        audit
            .iter()
            .any(|l| l.contains("caller=cert dns:control-plane.example")
                && l.contains("phase=\"admitted\"")
                && l.contains("instance=\"vm-7\"")),
        "{audit:#?}"
    );
    for field in [
        "method=\"AttachPartition\"",
        "instance=\"vm-7\"",
        "partition=\"ibpart_b7\"",
        "pkey=0x8b07",
        "pkey_base=0x0b07",
        "membership=\"FULL\"",
        "result=Ok",
    ] {
        assert!(ok[0].contains(field), "{field} in {}", ok[0]);
    }
    let refused: Vec<_> = audit
        .iter()
        .filter(|l| l.contains("AttachPartition") && l.contains("result=Unauthenticated"))
        .collect();
    assert_eq!(refused.len(), 1, "{audit:#?}");
    assert!(
        refused[0].contains("dns:control-plane.example"),
        "{}",
        refused[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_client_ca_and_keeps_it_on_a_bad_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (old, new, ca, t, by_old, by_new) = rotation(dir);
    t.get_node(&by_old).await.unwrap();
    assert!(
        t.get_node(&by_new).await.is_err(),
        "not trusted before the reload"
    );

    // Rotate: the bundle now holds both CAs; SIGHUP; new connections see it.
    std::fs::write(&ca, format!("{}{}", old.ca.pem(), new.ca.pem())).unwrap();
    nix::sys::signal::kill(t.d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    t.wait_log("TLS material reloaded", 1);
    assert!(t.d.log().contains("client CA bundle of 2"), "{}", t.d.log());
    t.get_node(&by_new)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", t.d.log()));
    t.get_node(&by_old).await.unwrap();

    // The agent's own certificate and key rotate the same way: a client trusting only the new
    // CA for the server is refused before the SIGHUP and served after.
    let new_ca = dir.join("new-server-ca.pem");
    std::fs::write(&new_ca, new.ca.pem()).unwrap();
    assert!(t.get_node_trusting(&new_ca, &by_new).await.is_err());
    new.issue(dir, "server", &["localhost"], "node1");
    nix::sys::signal::kill(t.d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    t.wait_log("TLS material reloaded", 2);
    t.get_node_trusting(&new_ca, &by_new)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", t.d.log()));
    assert!(
        t.get_node(&by_new).await.is_err(),
        "the old server certificate is gone"
    );

    // A broken bundle is reported and the material in use is kept.
    std::fs::write(&ca, "not a certificate\n").unwrap();
    nix::sys::signal::kill(t.d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    t.wait_log("TLS reload failed", 1);
    assert!(t.d.log().contains("client-ca.pem"), "{}", t.d.log());
    t.get_node_trusting(&new_ca, &by_new).await.unwrap();
    t.get_node_trusting(&new_ca, &by_old).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_client_ca_file_is_reloaded_without_a_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (old, new, ca, t, by_old, by_new) = rotation(dir);
    t.get_node(&by_old).await.unwrap();
    assert!(t.get_node(&by_new).await.is_err(), "not trusted yet");

    // Replaced the way rotation tools do it: written beside, then renamed over the old file.
    let staged = dir.join(".client-ca.pem.new");
    std::fs::write(&staged, format!("{}{}", old.ca.pem(), new.ca.pem())).unwrap();
    std::fs::rename(&staged, &ca).unwrap();
    t.wait_log("TLS files changed: material reloaded", 1);
    assert!(t.d.log().contains("client CA bundle of 2"), "{}", t.d.log());
    t.get_node(&by_new)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", t.d.log()));

    // Rewritten in place with something that does not parse: reported, old material kept.
    std::fs::write(&ca, "not a certificate\n").unwrap();
    t.wait_log("TLS files changed but do not load", 1);
    t.get_node(&by_new).await.unwrap();
    // Rewritten in place with only the new CA: the old client is no longer trusted.
    std::fs::write(&ca, new.ca.pem()).unwrap();
    t.wait_log("TLS files changed: material reloaded", 2);
    t.get_node(&by_new).await.unwrap();
    assert!(t.get_node(&by_old).await.is_err(), "old CA dropped");
    assert!(
        !t.d.log().contains("SIGHUP"),
        "no signal was involved: {}",
        t.d.log()
    );
}
