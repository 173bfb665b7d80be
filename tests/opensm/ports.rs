//! One partition per port, on an ibsim fabric with a real OpenSM and the SM-host agent: a host
//! with two HCAs (ibsim's `node1` and `node2`, the host's `mlx5_0` and `mlx5_1`) runs instance
//! X on mlx5_0 in partition A and instance Y on mlx5_1 in partition B. `smpquery` shows each
//! key on its own HCA only; releasing X leaves Y untouched; while X is RELEASING (the SM-host
//! agent stopped), an attach of partition C naming mlx5_0 is refused with the reason, and it
//! is accepted once X is RELEASED.
//!
//! A second story: a covered HCA leaves the host during a release. While the subnet manager
//! still shows its port, RELEASED waits; once the SA (asked through the host's other HCA) no
//! longer shows it (asked through a port that is a full member of the default partition; a
//! limited member's "no record" proves nothing and the release keeps waiting), RELEASED; a key
//! left on the port while it was outside the fabric is gone once OpenSM sweeps it back in.
//!
//! The host's agent reads its ports through sysfs, which the rig keeps equal to the fabric's
//! tables (`rig/two_hca.rs`): ibsim attaches a process to one port only, as the kernel's
//! sysfs shows every HCA of a real host. Skipped (with a message) when ibsim/OpenSM or the
//! shim are not installed.

use testkit::common;
use testkit::rig;
use testkit::rig::two_hca;

use common::{
    attach_on, free_port, get, has_base, partition, release, state, wait_state, CONVERGE,
};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::event::Kind;
use rig::agents::{sm_config, Agent};
use rig::process::DaemonProcess;
use rig::Fabric;
use std::path::{Path, PathBuf};
use tonic::Code;

/// The operator's file: ports are limited members of the default partition.
const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";

const HOST: &str = "host1";

/// The host's agent config: remote backend to the SM-host agent, sysfs observer on the
/// mirror's tree (`observer` added to its table), listening on `socket`; `top` adds top-level
/// settings.
fn host_config(
    dir: &Path,
    sysfs: &Path,
    sm_port: u16,
    socket: &Path,
    top: &str,
    observer: &str,
) -> String {
    format!(
            "node_id = \"{HOST}\"\nfabric = \"fab1\"\nstate_dir = \"{d}/{HOST}-state\"\n{top}\
             [listen]\nunix_socket = \"{s}\"\n\
             [subnet_manager]\nbackend = \"remote\"\n\
             [subnet_manager.remote]\nendpoint = \"http://127.0.0.1:{sm_port}\"\n\
             [observer]\nkind = \"sysfs\"\nsysfs_root = \"{r}\"\nfast_poll_ms = 50\nslow_poll_ms = 1000\n{observer}\
             [reconciler]\nbackoff_max_ms = 1000\n",
        d = dir.display(),
        s = socket.display(),
        r = sysfs.display(),
    )
}

/// The host's agent outside the shim (it talks to no umad device).
fn start_host_agent(dir: &Path, sysfs: &Path, sm_port: u16) -> (DaemonProcess, PathBuf) {
    let socket = dir.join(format!("{HOST}.sock"));
    let config = dir.join(format!("{HOST}.toml"));
    std::fs::write(&config, host_config(dir, sysfs, sm_port, &socket, "", ""))
        .expect("write host config");
    let cmd = std::process::Command::new(rig::process::BIN);
    let log = dir.join(format!("{HOST}-agent.log"));
    let agent = DaemonProcess::start(cmd, "host agent", &config, &socket, &log);
    (agent, socket)
}

/// The P_Key table of `node`'s port as `smpquery` reads it.
fn keys_of(fabric: &Fabric, node: &str) -> Vec<u16> {
    fabric.pkeys(node)
}

/// Asserts that `node` holds `base` and none of `absent`.
fn assert_keys(fabric: &Fabric, node: &str, base: u16, absent: &[u16]) {
    let keys = keys_of(fabric, node);
    assert!(
        has_base(&keys, base),
        "{node}: {base:#x} missing: {keys:x?}"
    );
    for other in absent {
        assert!(
            !has_base(&keys, *other),
            "{node}: {other:#x} present: {keys:x?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hcas_carry_one_partition_each_and_a_new_tenant_waits_for_released() {
    let Some(fabric) = Fabric::start(&two_hca::spec(HOST), OPERATOR) else {
        common::skip("ibsim, OpenSM or umad2sim not installed");
        return;
    };
    let root = fabric.dir().join("host1-sys");
    let mirror = two_hca::SysfsMirror::start(&fabric, &root, &two_hca::HCAS);
    let sm_port = free_port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, sm_port));
    let (host, socket) = start_host_agent(fabric.dir(), mirror.root(), sm_port);
    let mut c = rig::process::client(&socket).await;

    // The host reports both HCAs as its ports.
    let node = common::node(&mut c).await;
    let devices: Vec<&str> = node.ports.iter().map(|p| p.device.as_str()).collect();
    assert_eq!(devices, ["mlx5_0", "mlx5_1"], "{node:?}");

    // X on mlx5_0 in A, Y on mlx5_1 in B: both ACTIVE, each key on its own HCA only.
    let (a, b, cc) = (0x0a01u16, 0x0b01u16, 0x0c01u16);
    for (instance, id, key, port) in [
        ("vm-x", "ibpart_a", a, "mlx5_0/1"),
        ("vm-y", "ibpart_b", b, "mlx5_1/1"),
    ] {
        let r = attach_on(instance, partition(id, key.into()), &[port], None);
        c.attach_partition(r).await.expect("attach");
    }
    wait_state(&mut c, "vm-x", pb::AttachmentState::Active, CONVERGE).await;
    wait_state(&mut c, "vm-y", pb::AttachmentState::Active, CONVERGE).await;
    assert_keys(&fabric, "node1", a, &[b]);
    assert_keys(&fabric, "node2", b, &[a]);
    let x = get(&mut c, "vm-x").await;
    assert!(x.named_ports, "{x:?}");
    assert_eq!(x.ports.len(), 1, "{x:?}");
    assert_eq!(x.ports[0].device, "mlx5_0", "{x:?}");

    // The SM-host agent stops (by pid) and X is released: RELEASING, A still on mlx5_0.
    sm.stop();
    release(&mut c, "vm-x", None).await;
    assert_eq!(
        state(&get(&mut c, "vm-x").await),
        pb::AttachmentState::Releasing
    );

    // Partition C on mlx5_0 is refused with the reason; a whole-node attach too (it covers
    // mlx5_0). Nothing is stored.
    for ports in [&["mlx5_0/1"][..], &[][..]] {
        let r = attach_on("vm-z", partition("ibpart_c", cc.into()), ports, None);
        let e = c.attach_partition(r).await.expect_err("refused");
        assert_eq!(e.code(), Code::FailedPrecondition, "{ports:?}: {e:?}");
        for says in ["vm-x", "ibpart_a", "RELEASING", "mlx5_0/1"] {
            assert!(
                e.message().contains(says),
                "{says:?} not in {}",
                e.message()
            );
        }
    }
    let stored = c
        .get_attachment(pb::GetAttachmentRequest {
            instance_id: "vm-z".into(),
        })
        .await;
    assert_eq!(
        stored
            .map(|r| r.into_inner())
            .expect_err("nothing stored")
            .code(),
        Code::NotFound
    );
    mirror.sync();
    assert_eq!(
        state(&get(&mut c, "vm-x").await),
        pb::AttachmentState::Releasing
    );
    assert_keys(&fabric, "node1", a, &[b]);

    // The SM-host agent is back: X goes RELEASED once A has left mlx5_0; B stays on mlx5_1.
    sm.spawn(&fabric);
    wait_state(&mut c, "vm-x", pb::AttachmentState::Released, CONVERGE).await;
    let keys = keys_of(&fabric, "node1");
    assert!(!has_base(&keys, a), "node1 still holds A: {keys:x?}");
    assert_keys(&fabric, "node2", b, &[a]);
    assert_eq!(
        state(&get(&mut c, "vm-y").await),
        pb::AttachmentState::Active
    );

    // Now C on mlx5_0 is accepted and goes ACTIVE there only.
    let r = attach_on(
        "vm-z",
        partition("ibpart_c", cc.into()),
        &["mlx5_0/1"],
        None,
    );
    c.attach_partition(r)
        .await
        .expect("accepted after RELEASED");
    wait_state(&mut c, "vm-z", pb::AttachmentState::Active, CONVERGE).await;
    assert_keys(&fabric, "node1", cc, &[a, b]);
    assert_keys(&fabric, "node2", b, &[a, cc]);

    // Y was never touched: its one transition is to ACTIVE.
    let log = common::events(&mut c, 0).await;
    let y: Vec<i32> = log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::AttachmentChanged(ch)) if ch.instance_id == "vm-y" => Some(ch.to),
            _ => None,
        })
        .collect();
    assert_eq!(
        y.last(),
        Some(&(pb::AttachmentState::Active as i32)),
        "{y:?}"
    );
    let actives = y
        .iter()
        .filter(|s| **s == pb::AttachmentState::Active as i32)
        .count();
    assert_eq!(actives, 1, "vm-y left ACTIVE and came back: {y:?}");

    host.stop();
    sm.stop();
    drop(mirror);
}

/// Polls `done` on `instance` until it holds or `CONVERGE` passes; the last attachment seen.
async fn poll(
    c: &mut pb::fabric_agent_client::FabricAgentClient<tonic::transport::Channel>,
    instance: &str,
    done: impl Fn(&pb::Attachment) -> bool,
) -> pb::Attachment {
    common::poll_attachment(c, instance, CONVERGE, done).await
}

/// The reason of `instance`'s RELEASED event.
async fn released_reason(
    c: &mut pb::fabric_agent_client::FabricAgentClient<tonic::transport::Channel>,
    instance: &str,
) -> String {
    common::events(c, 0)
        .await
        .into_iter()
        .find_map(|e| match e.kind {
            Some(Kind::AttachmentChanged(ch))
                if ch.instance_id == instance && ch.to == pb::AttachmentState::Released as i32 =>
            {
                Some(ch.reason)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no RELEASED event of {instance}"))
}

/// A fabric whose ports are limited members of the default partition (mlx5_1 a full member
/// when `full_asking_port`), the mirror, the SM-host agent and the host's agent under the shim
/// as mlx5_1 (ibsim's node2), asking the SA through it (the shim's umad0); X attached on
/// mlx5_0 in A and ACTIVE.
struct Story {
    // Drop order: the agents (under the shim) before ibsim goes.
    host: Agent,
    sm: Agent,
    mirror: two_hca::SysfsMirror,
    fabric: Fabric,
}

const A: u16 = 0x0a01;

async fn x_active_on_mlx5_0(full_asking_port: bool) -> Option<Story> {
    let Some(fabric) = Fabric::start(&two_hca::spec(HOST), OPERATOR) else {
        common::skip("ibsim, OpenSM or umad2sim not installed");
        return None;
    };
    let mut top = "";
    if full_asking_port {
        // The operator makes mlx5_1 a full member of the default partition (a management
        // port); the host's agent accepts that posture.
        let guid = fabric.node_info("node2").port_guid;
        fabric.set_partitions(&format!(
            "Default=0x7fff : ALL=limited, SELF=full, {guid:#018x}=full ;\n"
        ));
        common::wait_for("mlx5_1 a full default member", CONVERGE, || {
            keys_of(&fabric, "node2").contains(&0xffff)
        });
        top = "allow_full_default = true\n";
    }
    let root = fabric.dir().join("host1-sys");
    let mirror = two_hca::SysfsMirror::start(&fabric, &root, &two_hca::HCAS);
    let sm_port = free_port();
    let sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, sm_port));
    let socket = fabric.dir().join("node2.sock");
    let config = host_config(
        fabric.dir(),
        &root,
        sm_port,
        &socket,
        top,
        "sa_umad_device = \"/dev/infiniband/umad0\"\n",
    );
    let host = Agent::start(&fabric, "node2", &config);
    let mut c = host.client().await;
    let r = attach_on("vm-x", partition("ibpart_a", A.into()), &["mlx5_0/1"], None);
    c.attach_partition(r).await.expect("attach");
    wait_state(&mut c, "vm-x", pb::AttachmentState::Active, CONVERGE).await;
    assert_keys(&fabric, "node1", A, &[]);
    Some(Story {
        fabric,
        mirror,
        sm,
        host,
    })
}

impl Story {
    /// mlx5_0 leaves the host (its sysfs directory is gone) while its port stays in the
    /// fabric, and X is released: OpenSM drops A from the port, the host cannot see that, and
    /// X stays RELEASING, naming the port, for as long as this waits.
    async fn release_x_without_mlx5_0(&mut self) {
        let mut c = self.host.client().await;
        self.mirror.hide("mlx5_0");
        release(&mut c, "vm-x", None).await;
        common::wait_for("A off node1", CONVERGE, || {
            !has_base(&keys_of(&self.fabric, "node1"), A)
        });
        std::thread::sleep(std::time::Duration::from_secs(2));
        let x = get(&mut c, "vm-x").await;
        assert_eq!(state(&x), pb::AttachmentState::Releasing, "{x:?}");
        assert!(
            x.reason.contains("mlx5_0/1") && x.reason.contains("missing"),
            "{}",
            x.reason
        );
    }

    fn stop(mut self) {
        self.host.stop();
        self.sm.stop();
        drop(self.mirror);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_hca_blocks_released_when_the_sa_hides_ports_from_the_asking_port() {
    // Tenant ports are limited members of the default partition: the SA shows mlx5_1 no port
    // outside its partitions, so its "no record" for mlx5_0 proves nothing.
    let Some(mut story) = x_active_on_mlx5_0(false).await else {
        return;
    };
    story.release_x_without_mlx5_0().await;
    let mut c = story.host.client().await;
    // Back on the host and read without the key: RELEASED.
    story.mirror.show("mlx5_0");
    let x = poll(&mut c, "vm-x", |x| {
        state(x) == pb::AttachmentState::Released
    })
    .await;
    assert_eq!(state(&x), pb::AttachmentState::Released, "{x:?}");
    let why = released_reason(&mut c, "vm-x").await;
    assert!(!why.contains("no longer shown"), "{why}");
    story.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_covered_hca_gone_from_the_fabric_is_released_by_the_subnet_managers_word() {
    // mlx5_1 is a full member of the default partition: the SA shows it every port.
    let Some(mut story) = x_active_on_mlx5_0(true).await else {
        return;
    };
    story.release_x_without_mlx5_0().await;
    let mut c = story.host.client().await;
    let guid = get(&mut c, "vm-x").await.ports[0].port_guid.clone();

    // The port leaves the fabric (its link is cut) and OpenSM sweeps: the SA no longer shows
    // its GUID, and the release completes on the subnet manager's word.
    story
        .fabric
        .ibsim_console("Unlink \"node1\"")
        .expect("unlink");
    story.fabric.hup_opensm();
    let x = poll(&mut c, "vm-x", |x| {
        state(x) == pb::AttachmentState::Released
    })
    .await;
    assert_eq!(state(&x), pb::AttachmentState::Released, "{x:?}");
    let why = released_reason(&mut c, "vm-x").await;
    assert!(
        why.contains("no longer shown") && why.contains("mlx5_0/1"),
        "{why}"
    );

    // Back in the fabric and on the host, without the key; X stays RELEASED.
    story
        .fabric
        .ibsim_console("ReLink \"node1\"")
        .expect("relink");
    story.fabric.hup_opensm();
    story.mirror.show("mlx5_0");
    common::until_node(&mut c, CONVERGE, "mlx5_0 back on the host", |n| {
        n.ports.iter().any(|p| p.port_guid == guid)
    })
    .await;
    assert!(!has_base(&keys_of(&story.fabric, "node1"), A));
    assert_eq!(
        state(&get(&mut c, "vm-x").await),
        pb::AttachmentState::Released
    );
    story.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_left_on_a_port_outside_the_fabric_is_gone_when_the_port_returns() {
    let Some(mut story) = x_active_on_mlx5_0(true).await else {
        return;
    };
    let mut c = story.host.client().await;
    // X is released while the SM-host agent is stopped, mlx5_0 leaves the host and its port
    // leaves the fabric still holding A (OpenSM cannot reach it to take A off).
    story.sm.stop();
    story.mirror.hide("mlx5_0");
    release(&mut c, "vm-x", None).await;
    story
        .fabric
        .ibsim_console("Unlink \"node1\"")
        .expect("unlink");
    story.fabric.hup_opensm();
    // The SM-host agent is back: the set without A is acknowledged, the SA has no record of
    // the port, RELEASED.
    story.sm.spawn(&story.fabric);
    let x = poll(&mut c, "vm-x", |x| {
        state(x) == pb::AttachmentState::Released
    })
    .await;
    assert_eq!(state(&x), pb::AttachmentState::Released, "{x:?}");
    assert!(released_reason(&mut c, "vm-x")
        .await
        .contains("no longer shown"));
    assert!(
        has_base(&keys_of(&story.fabric, "node1"), A),
        "the port outside the fabric kept A"
    );
    // The port returns: OpenSM sweeps it in and programs it from partitions without A.
    story
        .fabric
        .ibsim_console("ReLink \"node1\"")
        .expect("relink");
    story.fabric.hup_opensm();
    common::wait_for("OpenSM took A off the returning port", CONVERGE, || {
        !has_base(&keys_of(&story.fabric, "node1"), A)
    });
    story.mirror.show("mlx5_0");
    assert_eq!(
        state(&get(&mut c, "vm-x").await),
        pb::AttachmentState::Released
    );
    story.stop();
}
