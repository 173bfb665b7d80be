//! The UFM broker end to end: the real binary as the broker (backend `ufm`,
//! `[subnet_manager.ufm_broker]`, grants required, `fabric.sm.v1` over mTLS) in front of the fake
//! UFM, and a node agent with the `remote` backend toward it (no UFM credential on the node).
//! Through the public APIs, with certificates made here: node1's attach with a valid grant
//! reaches ACTIVE and the fake UFM holds its GUID; node2 without a grant, with node1's grant,
//! naming a GUID UFM shows in node1 or does not list at all, and under a case variant of its
//! node id, is PERMISSION_DENIED and the fake UFM receives no write (UFM's port inventory
//! unreadable: UNAVAILABLE, nothing written); a grant consumed by a
//! release is refused when replayed, also after the broker restarted (as is an older
//! generation); `RevokeInstance` removes node1's GUID from the key in the
//! fake UFM; `ListPartitionMembers` answers from UFM. A second test times attach -> ACTIVE
//! through the broker and directly against the fake UFM.

use testkit::common;
use testkit::fake_ufm;

use common::grants::{grant, GrantSigner};
use common::pki::Pki;
use common::process::DaemonProcess;
use common::*;
use fabric_agent::api::client::{tcp, ClientTls};
use fabric_agent::domain::Membership;
use fabric_agent::proto::agent as pb_agent;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use fabric_agent::proto::grant as gpb;
use fabric_agent::proto::sm as pb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fake_ufm::{FakePort, FakeUfm, MembershipChange};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

const PASSWORD: &str = "Br0ker-only-pw-7c1";
const TENANT_A: u32 = 0x0a11;
const TENANT_B: u32 = 0x0b22;
/// A GUID no inventory lists.
const STRANGER: u64 = 0x0002_c903_000e_0b72;

/// A copy of the `mlx5-8x` sysfs tree whose P_Key tables play the ports' hardware: the fake
/// UFM's change hook writes the keys UFM holds for each of its GUIDs (like an SM sweeping).
struct Tree {
    root: PathBuf,
    devices: BTreeMap<u64, String>,
}

impl Tree {
    fn new(root: &Path) -> Arc<Tree> {
        mlx5_8x_active(root);
        let mut devices = BTreeMap::new();
        for dev in MLX5_8X_IB {
            for i in 1..table_size(root, dev) {
                set_pkey(root, dev, i, 0);
            }
            set_pkey(root, dev, 0, 0x7fff);
            devices.insert(port_guid(root, dev), dev.to_owned());
        }
        Arc::new(Tree {
            root: root.to_owned(),
            devices,
        })
    }

    fn guid(&self, dev: &str) -> u64 {
        *self
            .devices
            .iter()
            .find(|(_, d)| *d == dev)
            .expect("device in the tree")
            .0
    }

    fn apply(&self, change: &MembershipChange) {
        for (guid, keys) in &change.guid_keys {
            let Some(dev) = self.devices.get(guid) else {
                continue;
            };
            let size = table_size(&self.root, dev);
            let mut values: Vec<u16> = keys
                .iter()
                .map(|(k, m)| match m {
                    Membership::Full => k | 0x8000,
                    Membership::Limited => *k,
                })
                .collect();
            values.resize(size - 1, 0);
            for (i, v) in values.into_iter().enumerate() {
                set_pkey(&self.root, dev, i + 1, v);
            }
        }
    }
}

/// Writes a secret file 0600, as the daemon requires.
fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn table_size(root: &Path, dev: &str) -> usize {
    std::fs::read_dir(port_file(root, dev, "pkeys"))
        .unwrap()
        .count()
}

fn port_guid(root: &Path, dev: &str) -> u64 {
    let gid = std::fs::read_to_string(port_file(root, dev, "gids/0")).unwrap();
    let low: String = gid.trim().split(':').skip(4).collect();
    u64::from_str_radix(&low, 16).unwrap()
}

/// The broker's files: certificates, the UFM credential, the grant key.
struct Setup {
    dir: PathBuf,
    pki: Pki,
    signer: GrantSigner,
}

impl Setup {
    fn new(dir: &Path) -> Setup {
        let pki = Pki::new("fab1 CA");
        pki.write_ca(&dir.join("ca.pem"));
        Setup {
            dir: dir.to_owned(),
            pki,
            signer: GrantSigner::new("cp-2026"),
        }
    }

    fn grants_section(&self) -> String {
        format!("[grants]\nrequire = true\n{}", self.signer.config_entry(""))
    }

    /// The broker's config and directory; `port` its TCP listener.
    fn broker(&self, fake: &FakeUfm, port: u16) -> (PathBuf, PathBuf) {
        let dir = self.dir.join("broker");
        std::fs::create_dir_all(&dir).unwrap();
        let (crt, key) = self.pki.issue(&dir, "broker", &["localhost"], "broker");
        let cred = dir.join("ufm.cred");
        write_secret(&cred, &format!("admin:{PASSWORD}\n"));
        let tree = Tree::new(&dir.join("sys"));
        let config = format!(
            "node_id = \"mgmt1\"\nfabric = \"fab1\"\nstate_dir = \"{d}/state\"\n\
             [listen]\nunix_socket = \"{d}/agent.sock\"\ntcp = \"127.0.0.1:{port}\"\n\
             [listen.tls]\ncert = \"{crt}\"\nkey = \"{key}\"\nclient_ca = \"{ca}\"\n\
             partitions_clients = [\"dns:*.nodes.fab1.example\"]\n\
             operator_clients = [\"dns:control-plane.fab1.example\"]\n\
             node_name_template = \"{{node}}.nodes.fab1.example\"\n\
             [subnet_manager]\nbackend = \"ufm\"\n\
             [subnet_manager.ufm]\nurl = \"{url}\"\ncredentials_file = \"{cred}\"\n\
             connect_timeout_ms = 500\nrequest_timeout_ms = 2000\nretries = 1\n\
             backoff_initial_ms = 20\nbackoff_max_ms = 100\nmax_skipped_rechecks = 0\n\
             [subnet_manager.ufm_broker]\nenabled = true\n\
             {grants}\
             [observer]\nkind = \"sysfs\"\nsysfs_root = \"{root}\"\nfast_poll_ms = 20\nslow_poll_ms = 200\n\
             [ports]\ndevices = [\"mlx5_0\"]\n",
            d = dir.display(),
            crt = crt.display(),
            key = key.display(),
            ca = self.dir.join("ca.pem").display(),
            url = fake.url(),
            cred = cred.display(),
            grants = self.grants_section(),
            root = tree.root.display(),
        );
        let path = dir.join("config.toml");
        std::fs::write(&path, config).unwrap();
        (path, dir)
    }

    /// A node's config (remote backend toward the broker, or `direct` to UFM) and directory;
    /// its fabric port is `dev` of its own tree.
    fn node(&self, node: &str, dev: &str, upstream: Upstream<'_>) -> (PathBuf, PathBuf, Arc<Tree>) {
        let dir = self.dir.join(node);
        std::fs::create_dir_all(&dir).unwrap();
        let tree = Tree::new(&dir.join("sys"));
        let sm = match upstream {
            Upstream::Broker(port) => {
                let (crt, key) =
                    self.pki
                        .issue(&dir, node, &[&format!("{node}.nodes.fab1.example")], node);
                format!(
                    "[subnet_manager]\nbackend = \"remote\"\n\
                     [subnet_manager.remote]\nendpoint = \"https://127.0.0.1:{port}\"\n\
                     ca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ndomain_name = \"localhost\"\n",
                    self.dir.join("ca.pem").display(),
                    crt.display(),
                    key.display()
                )
            }
            Upstream::Direct(fake) => {
                let cred = dir.join("ufm.cred");
                write_secret(&cred, &format!("admin:{PASSWORD}\n"));
                format!(
                    "[subnet_manager]\nbackend = \"ufm\"\n\
                     [subnet_manager.ufm]\nurl = \"{}\"\ncredentials_file = \"{}\"\n\
                     connect_timeout_ms = 500\nrequest_timeout_ms = 2000\nretries = 1\n\
                     backoff_initial_ms = 20\nbackoff_max_ms = 100\nmax_skipped_rechecks = 0\n",
                    fake.url(),
                    cred.display()
                )
            }
        };
        let config = format!(
            "node_id = \"{node}\"\nfabric = \"fab1\"\nstate_dir = \"{d}/state\"\n\
             [listen]\nunix_socket = \"{d}/agent.sock\"\n\
             {sm}{grants}\
             [observer]\nkind = \"sysfs\"\nsysfs_root = \"{root}\"\nfast_poll_ms = 20\nslow_poll_ms = 200\n\
             [ports]\ndevices = [\"{dev}\"]\n\
             [reconciler]\nbackoff_initial_ms = 50\nbackoff_max_ms = 500\n",
            d = dir.display(),
            grants = self.grants_section(),
            root = tree.root.display(),
        );
        let path = dir.join("config.toml");
        std::fs::write(&path, config).unwrap();
        (path, dir, tree)
    }

    async fn partitions(&self, name: &str, san: &str, url: &str) -> PartitionsClient<Channel> {
        let identity = self.pki.issue(&self.dir, name, &[san], name);
        let tls = ClientTls {
            ca: Some(self.dir.join("ca.pem")),
            identity: Some(identity),
            domain: Some("localhost".into()),
        };
        PartitionsClient::new(tcp(url, &tls).await.unwrap())
    }
}

enum Upstream<'a> {
    Broker(u16),
    Direct(&'a FakeUfm),
}

fn start(config: &Path, dir: &Path) -> DaemonProcess {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("NOTIFY_SOCKET").env_remove("WATCHDOG_USEC");
    DaemonProcess::start(
        cmd,
        &dir.file_name().unwrap().to_string_lossy(),
        config,
        &dir.join("agent.sock"),
        &dir.join("daemon.log"),
    )
}

fn set(
    node: &str,
    guid: u64,
    keys: &[u32],
    generation: u64,
    grants: Vec<gpb::SignedGrant>,
) -> pb::SetNodeMembershipsRequest {
    pb::SetNodeMembershipsRequest {
        memberships: Some(pb::NodeMemberships {
            node_id: node.into(),
            port_guids: vec![format!("{guid:#018x}")],
            keys: keys
                .iter()
                .map(|pkey| pb::KeyMembership {
                    pkey: *pkey,
                    full: true,
                    name: format!("t{pkey:x}"),
                    port_guids: Vec::new(),
                })
                .collect(),
            generation,
            grants,
        }),
    }
}

fn attach_granted(
    instance: &str,
    pkey: u32,
    g: gpb::SignedGrant,
) -> pb_agent::AttachPartitionRequest {
    let mut req = attach(
        instance,
        partition(&format!("ibpart_{pkey:04x}"), pkey),
        Some(10_000),
    );
    req.grant = Some(g);
    req
}

/// Waits until the attachment is in `want`.
async fn wait_state(
    c: &mut FabricAgentClient<Channel>,
    instance: &str,
    want: pb_agent::AttachmentState,
    log: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = get(c, instance).await;
        if state(&a) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{instance}: {a:?}, expected {want:?}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn full(guids: &[u64]) -> BTreeMap<u64, Membership> {
    guids.iter().map(|g| (*g, Membership::Full)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_reach_ufm_only_through_the_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new(tmp.path());
    let fake = FakeUfm::start_with(fake_ufm::FakeAuth::Basic {
        user: "admin".into(),
        password: PASSWORD.into(),
    })
    .await;
    let port = free_port();
    let (broker_conf, broker_dir) = s.broker(&fake, port);
    let (node1_conf, node1_dir, tree1) = s.node("node1", "mlx5_1", Upstream::Broker(port));
    let guid1 = tree1.guid("mlx5_1");
    let guid2 = tree1.guid("mlx5_2"); // node2's port (node2 calls the broker directly below)
    fake.set_ports(vec![
        FakePort::host(guid1, "node1", "mlx5_1"),
        FakePort::host(guid2, "node2", "mlx5_2"),
    ]);
    let hook = tree1.clone();
    fake.on_change(Duration::from_millis(50), move |c| hook.apply(c));
    let broker = start(&broker_conf, &broker_dir);
    let node1 = start(&node1_conf, &node1_dir);
    let logs = || {
        format!(
            "broker:\n{}\nnode1:\n{}",
            broker.log_text(),
            node1.log_text()
        )
    };

    // The node holds no UFM credential in the documented layout.
    for entry in walk(&node1_dir) {
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(PASSWORD),
            "{} holds the UFM credential",
            entry.display()
        );
        assert!(
            !entry.ends_with("ufm.cred"),
            "{} on a node",
            entry.display()
        );
    }
    let node1_config = std::fs::read_to_string(&node1_conf).unwrap();
    assert!(!node1_config.contains("[subnet_manager.ufm]"));

    // node1 with a valid grant: ACTIVE, and UFM holds its GUID.
    let mut c1 = node1.client_for(&node1_dir).await;
    let g1 = s.signer.sign(&grant(
        "g-a-1",
        "fab1",
        "node1",
        "i-1",
        TENANT_A,
        Membership::Full,
    ));
    attach_now(&mut c1, attach_granted("i-1", TENANT_A, g1)).await;
    wait_state(&mut c1, "i-1", pb_agent::AttachmentState::Active, &logs).await;
    assert_eq!(fake.members(TENANT_A as u16), full(&[guid1]));

    // The refusals: PERMISSION_DENIED, and nothing written to UFM.
    let url = format!("https://127.0.0.1:{port}");
    let mut n2 = s
        .partitions("node2", "node2.nodes.fab1.example", &url)
        .await;
    let g2 = s.signer.sign(&grant(
        "g-b-2",
        "fab1",
        "node2",
        "i-2",
        TENANT_B,
        Membership::Full,
    ));
    let g_b_for_node1 = s.signer.sign(&grant(
        "g-b-1",
        "fab1",
        "node1",
        "i-9",
        TENANT_B,
        Membership::Full,
    ));
    fake.clear_requests();
    let cases: Vec<(&str, pb::SetNodeMembershipsRequest, &str)> = vec![
        (
            "no grant",
            set("node2", guid2, &[TENANT_B], 1, vec![]),
            "no grant for key",
        ),
        (
            "node1's grant",
            set("node2", guid2, &[TENANT_B], 1, vec![g_b_for_node1]),
            "is for node \"node1\", not \"node2\"",
        ),
        (
            "a GUID UFM shows in node1",
            set("node2", guid1, &[TENANT_B], 1, vec![g2.clone()]),
            "port ownership",
        ),
        (
            "a GUID UFM does not list",
            set("node2", STRANGER, &[TENANT_B], 1, vec![g2.clone()]),
            "does not list",
        ),
        (
            "a case variant of the node id",
            set("NODE2", guid2, &[TENANT_B], 1, vec![g2.clone()]),
            "does not map",
        ),
    ];
    for (what, req, says) in cases {
        let e = n2.set_node_memberships(req).await.expect_err(what);
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
        assert!(e.message().contains(says), "{what}: {}", e.message());
    }
    assert!(
        fake.writes().is_empty(),
        "refused sets reached UFM: {:?}",
        fake.writes()
    );
    assert!(fake.members(TENANT_B as u16).is_empty());

    // UFM's port inventory cannot be read: the claim is refused (fail closed), nothing written.
    // (node2's last read stands in for a fresh one for NODE_READ_INTERVAL: let it age first.)
    tokio::time::sleep(fabric_agent::sm::ufm::broker::inventory::NODE_READ_INTERVAL).await;
    fake.outage_503(Duration::from_millis(800));
    let e = n2
        .set_node_memberships(set("node2", guid2, &[TENANT_B], 1, vec![g2.clone()]))
        .await
        .expect_err("inventory unreadable");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("port inventory"), "{}", e.message());
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());

    // node2 with its grant: UFM holds its GUID; released: gone, and the grant is consumed.
    n2.set_node_memberships(set("node2", guid2, &[TENANT_B], 1, vec![g2.clone()]))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", logs()));
    assert_eq!(fake.members(TENANT_B as u16), full(&[guid2]));
    n2.set_node_memberships(set("node2", guid2, &[], 2, vec![]))
        .await
        .unwrap();
    assert!(fake.members(TENANT_B as u16).is_empty());
    fake.clear_requests();
    let g2_again = g2.clone();
    let e = n2
        .set_node_memberships(set("node2", guid2, &[TENANT_B], 3, vec![g2]))
        .await
        .expect_err("replayed grant");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("consumed"), "{}", e.message());
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());

    // A restarted broker still knows: the consumed grant and node2's generation are stored.
    broker.stop();
    let broker = start(&broker_conf, &broker_dir);
    let logs = || {
        format!(
            "broker:\n{}\nnode1:\n{}",
            broker.log_text(),
            node1.log_text()
        )
    };
    let mut n2 = s
        .partitions("node2b", "node2.nodes.fab1.example", &url)
        .await;
    let e = n2
        .set_node_memberships(set("node2", guid2, &[TENANT_B], 3, vec![g2_again.clone()]))
        .await
        .expect_err("replayed grant after a restart");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = n2
        .set_node_memberships(set("node2", guid2, &[], 1, vec![]))
        .await
        .expect_err("an older generation after a restart");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());

    // The control plane: UFM's view of the key, then a revocation that removes node1's GUID.
    let mut cp = s.partitions("cp", "control-plane.fab1.example", &url).await;
    let members = cp
        .list_partition_members(pb::ListPartitionMembersRequest { pkey: TENANT_A })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(members.source, "ufm");
    assert_eq!(members.members.len(), 1, "{members:?}");
    assert_eq!(members.members[0].node_id, "node1");
    assert_eq!(members.members[0].port_guid, format!("{guid1:#018x}"));
    let e = n2
        .revoke_instance(pb::RevokeInstanceRequest {
            node_id: "node1".into(),
            instance_id: "i-1".into(),
        })
        .await
        .expect_err("a node may not revoke");
    assert_eq!(e.code(), Code::PermissionDenied);
    let out = cp
        .revoke_instance(pb::RevokeInstanceRequest {
            node_id: "node1".into(),
            instance_id: "i-1".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", logs()))
        .into_inner();
    assert_eq!(out.revoked_grant_ids, vec!["g-a-1".to_owned()]);
    assert_eq!(out.removed_pkeys, vec![TENANT_A]);
    assert!(
        fake.members(TENANT_A as u16).is_empty(),
        "{:?}",
        fake.members(TENANT_A as u16)
    );
    // node1 keeps sending its set: refused, and UFM stays without its GUID.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(fake.members(TENANT_A as u16).is_empty());
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

trait ClientFor {
    async fn client_for(&self, dir: &Path) -> FabricAgentClient<Channel>;
}

impl ClientFor for DaemonProcess {
    async fn client_for(&self, dir: &Path) -> FabricAgentClient<Channel> {
        common::process::client(&dir.join("agent.sock")).await
    }
}

/// attach -> ACTIVE, `rounds` times on a fresh key each, through `c`; the times.
async fn time_attaches(
    c: &mut FabricAgentClient<Channel>,
    s: &Setup,
    node: &str,
    rounds: u32,
    log: &dyn Fn() -> String,
) -> Vec<Duration> {
    let mut out = Vec::new();
    for i in 0..rounds {
        let pkey = 0x0c00 + i;
        let instance = format!("{node}-t{i}");
        let g = s.signer.sign(&grant(
            &format!("g-{node}-{i}"),
            "fab1",
            node,
            &instance,
            pkey,
            Membership::Full,
        ));
        let t = Instant::now();
        attach_now(c, attach_granted(&instance, pkey, g)).await;
        wait_state(c, &instance, pb_agent::AttachmentState::Active, log).await;
        out.push(t.elapsed());
        release(c, &instance, Some(10_000)).await;
        wait_state(c, &instance, pb_agent::AttachmentState::Released, log).await;
    }
    out
}

fn median_ms(mut d: Vec<Duration>) -> f64 {
    d.sort();
    d[d.len() / 2].as_secs_f64() * 1000.0
}

/// The figure in docs/PERFORMANCE.md: attach -> ACTIVE through the broker and directly, the
/// median of 9 attaches each, against the fake UFM (its 50 ms "sweep" included in both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_to_active_through_the_broker_and_directly() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new(tmp.path());
    let fake = FakeUfm::start_with(fake_ufm::FakeAuth::Basic {
        user: "admin".into(),
        password: PASSWORD.into(),
    })
    .await;
    let port = free_port();
    let (broker_conf, broker_dir) = s.broker(&fake, port);
    let (via_conf, via_dir, via_tree) = s.node("node1", "mlx5_1", Upstream::Broker(port));
    let (direct_conf, direct_dir, direct_tree) = s.node("node3", "mlx5_3", Upstream::Direct(&fake));
    fake.set_ports(vec![FakePort::host(
        via_tree.guid("mlx5_1"),
        "node1",
        "mlx5_1",
    )]);
    let (a, b) = (via_tree.clone(), direct_tree.clone());
    fake.on_change(Duration::from_millis(50), move |c| {
        a.apply(c);
        b.apply(c);
    });
    let broker = start(&broker_conf, &broker_dir);
    let via = start(&via_conf, &via_dir);
    let direct = start(&direct_conf, &direct_dir);
    let log = || {
        format!(
            "broker:\n{}\nnode1:\n{}\nnode3:\n{}",
            broker.log_text(),
            via.log_text(),
            direct.log_text()
        )
    };
    let mut cv = via.client_for(&via_dir).await;
    let mut cd = direct.client_for(&direct_dir).await;
    let through = time_attaches(&mut cv, &s, "node1", 9, &log).await;
    let straight = time_attaches(&mut cd, &s, "node3", 9, &log).await;
    let (t, d) = (median_ms(through), median_ms(straight));
    println!("attach -> ACTIVE, median of 9: through the broker {t:.1} ms, direct {d:.1} ms");
}
