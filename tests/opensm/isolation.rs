//! Failure isolation on the SM host, on an ibsim fabric with a real OpenSM, cross-checked with
//! `smpquery`: one node's unprovable port GUID refuses that port's keys only (the node's
//! release and its keys on proven ports go through), a stored set the operator's part now
//! conflicts with is quarantined (left out of the file, refused naming the node), and neither
//! stops another node's release, which reaches RELEASED through its own agent; nor does
//! another node's addition that OpenSM rejects (held back after the rejection): the release is
//! written without it and acknowledged at once. Skipped when ibsim/OpenSM are not installed. The
//! same rules in process: `tests/opensm/isolation_backend.rs`, `tests/opensm/rejection.rs`.

use testkit::common;
use testkit::rig;

use async_trait::async_trait;
use common::sm_requests::set_memberships;
use common::{attach, attach_now, free_port, has_base, partition, release, state, wait_until};
use fabric_agent::domain::{Membership, NodeMemberships, PKey};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fabric_agent::sm::opensm::members::members_of;
use fabric_agent::sm::opensm::reload::{OpenSmReloader, ReloadError, ReloadReport, Reloader};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, OpenSmBackend, OpenSmConfig, OpenSmError, OwnershipConfig, Rejection,
};
use rig::agents::{node_config, Agent};
use rig::{Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS, SM_HOST};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Code;

const CONVERGE: Duration = Duration::from_secs(30);
/// A port GUID the fabric does not have: never provable.
const UNKNOWN_GUID: u64 = 0x0002_c903_000e_0b72;
/// Tenant ports are limited members of the default partition (else no tenant key is served).
const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n\
storage=0x0100, ipoib : ALL_SWITCHES=full, SELF=full ;\n";

/// The SM-host agent: port ownership checked through the SA (ibsim names its HCAs `node1`, so
/// the bare node id is a pattern), the operator's own file, and a sysfs fixture as its own
/// ports (under umad2sim the ownership check's SA session cannot share the process with an
/// SMP observer; see docs/OPENSM.md).
fn sm_config(fabric: &Fabric, port: u16) -> String {
    let d = fabric.dir().display();
    rig::agents::sm_config_with(
        fabric,
        port,
        "description_patterns = [\"{node}\", \"{node} *\"]\n\
         sa_timeout_ms = 300\nsa_retries = 1\nsa_deadline_ms = 2000\n",
        &format!(
            "kind = \"sysfs\"\nsysfs_root = \"{}\"\nslow_poll_ms = 2000\n",
            std::fs::canonicalize("tests/fixtures/sysfs/mlx5-8x")
                .expect("fixture")
                .display(),
        ),
    )
    .replace(
        "[subnet_manager.opensm.ownership]\n",
        &format!(
            "operator_file = \"{d}/partitions.operator.conf\"\n[subnet_manager.opensm.ownership]\n"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprovable_port_and_a_quarantined_set_do_not_stop_another_nodes_release() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 3), OPERATOR) else {
        return;
    };
    let operator_file = fabric.dir().join("partitions.operator.conf");
    std::fs::write(&operator_file, OPERATOR).unwrap();
    let port = free_port();
    let mut sm = Agent::start(&fabric, SM_HOST, &sm_config(&fabric, port));
    let mut client = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the SM host");
    let (g1, g2) = (
        fabric.node_info("node1").port_guid,
        fabric.node_info("node2").port_guid,
    );

    // node1 and node2 (stock clients) hold one key each; node3's own agent attaches one.
    for (node, guid, key) in [("node1", g1, 0x0a61), ("node2", g2, 0x0a62)] {
        client
            .set_node_memberships(set_memberships(node, &[guid], &[key], 1))
            .await
            .unwrap_or_else(|e| panic!("{node}: {e:?}"));
    }
    let mut n3 = Agent::start(&fabric, "node3", &node_config(&fabric, "node3", port));
    let mut c3 = n3.client().await;
    let a = attach_now(
        &mut c3,
        attach("i-3", partition("ibpart_c", 0x0a63), Some(20_000)),
    )
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    wait_until("0x0a61 on node1, 0x0a62 on node2", CONVERGE, || async {
        has_base(&fabric.pkeys("node1"), 0x0a61) && has_base(&fabric.pkeys("node2"), 0x0a62)
    })
    .await;

    // The operator takes node2's key into their own part: node2's stored set now conflicts.
    std::fs::write(
        &operator_file,
        format!("{OPERATOR}opx=0x0a62 : ALL_SWITCHES=full ;\n"),
    )
    .unwrap();

    // node1 releases 0x0a61 and asks for 0x0a64 on every port, one of which the fabric does
    // not have: refused, naming that port; the release and the key on its proven port go
    // through, and node2's set is left out of the file.
    let status = client
        .set_node_memberships(set_memberships("node1", &[g1, UNKNOWN_GUID], &[0x0a64], 2))
        .await
        .expect_err("the unknown port is refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains(&format!("{UNKNOWN_GUID:#018x}")),
        "{status:?}"
    );
    wait_until(
        "node1: 0x0a61 gone, 0x0a64 on; node2: 0x0a62 gone",
        CONVERGE,
        || async {
            let (k1, k2) = (fabric.pkeys("node1"), fabric.pkeys("node2"));
            !has_base(&k1, 0x0a61) && has_base(&k1, 0x0a64) && !has_base(&k2, 0x0a62)
        },
    )
    .await;
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(
        !text.contains(&format!("{UNKNOWN_GUID:#018x}")),
        "the refused port is not in the file:\n{text}"
    );
    // node2's own set is refused while it conflicts, naming node2.
    let status = client
        .set_node_memberships(set_memberships("node2", &[g2], &[0x0a62], 1))
        .await
        .expect_err("quarantined");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("quarantined") && status.message().contains("\"node2\""),
        "{status:?}"
    );

    // node3's release is not held up by either: RELEASED, and smpquery agrees.
    let r = release(&mut c3, "i-3", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    let k3 = fabric.pkeys("node3");
    assert!(
        !has_base(&k3, 0x0a63),
        "RELEASED with 0x0a63 on node3: {k3:x?}"
    );

    // node1's release with its unprovable port (keyless there) is answered OK.
    client
        .set_node_memberships(set_memberships("node1", &[g1, UNKNOWN_GUID], &[], 3))
        .await
        .expect("a release with a keyless unprovable port");
    wait_until("0x0a64 gone from node1", CONVERGE, || async {
        !has_base(&fabric.pkeys("node1"), 0x0a64)
    })
    .await;
    // node2's release of the conflicting key ends its quarantine: answered OK.
    client
        .set_node_memberships(set_memberships("node2", &[g2], &[], 2))
        .await
        .expect("node2's release");
    assert!(n3.stop().success());
    assert!(sm.stop().success());
}

/// The real reloader (SIGHUP, OpenSM's log, the sweep fence), except that OpenSM rejects every
/// file giving `key` to port `guid`: such a file is swapped for a copy with a broken line while
/// OpenSM re-reads it, so the real OpenSM logs PARSE ERROR for it. The agent writes only bytes
/// its strict parser (OpenSM's, re-implemented) accepts, so no addition of its own draws a real
/// rejection; this stands in for one that does.
struct RejectingOpenSm {
    inner: OpenSmReloader,
    path: PathBuf,
    key: u32,
    guid: u64,
}

fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("swap");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[async_trait]
impl Reloader for RejectingOpenSm {
    fn checkpoint(&self) -> u64 {
        self.inner.checkpoint()
    }
    async fn reload(&self, checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        let written = std::fs::read(&self.path).unwrap();
        let rejected = members_of(&written, PKey::new(self.key).unwrap())
            .is_some_and(|m| m.iter().any(|m| m.guid.0 == self.guid));
        if !rejected {
            return self.inner.reload(checkpoint).await;
        }
        let mut broken = written.clone();
        broken.extend_from_slice(b"broken=0x0c0c : 0xzz ;\n");
        replace(&self.path, &broken);
        let verdict = self.inner.reload(checkpoint).await;
        replace(&self.path, &written);
        verdict
    }
    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        self.inner.rejections_since(offset)
    }
    fn log_identity(&self) -> Option<(u64, u64)> {
        self.inner.log_identity()
    }
}

fn one_port(node: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    common::memberships(
        node,
        [guid],
        keys.iter().map(|k| (*k, Membership::Full)),
        |k| format!("t{k:x}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_addition_does_not_hold_up_another_nodes_release() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    let (g1, g2) = (
        fabric.node_info("node1").port_guid,
        fabric.node_info("node2").port_guid,
    );
    let config = OpenSmConfig {
        partitions_file: fabric.partitions_path(),
        log_file: fabric.opensm_log_path(),
        pid_file: Some(fabric.opensm_pid_path()),
        ownership: OwnershipConfig::disabled(),
        watch_ms: 0,
        ..OpenSmConfig::default()
    };
    let reloader = Arc::new(RejectingOpenSm {
        inner: OpenSmReloader::new(&config),
        path: fabric.partitions_path(),
        key: 0x0a62,
        guid: g2,
    });
    let sm = OpenSmBackend::with_reloader(
        config,
        SM_HOST.into(),
        Arc::new(InMemoryNodeStore::default()),
        reloader,
    )
    .unwrap();
    sm.set_node(one_port("node1", g1, &[0x0a61]), 1)
        .await
        .unwrap();
    sm.set_node(one_port("node2", g2, &[0x0a63]), 1)
        .await
        .unwrap();
    wait_until("0x0a61 on node1, 0x0a63 on node2", CONVERGE, || async {
        has_base(&fabric.pkeys("node1"), 0x0a61) && has_base(&fabric.pkeys("node2"), 0x0a63)
    })
    .await;

    // node2's addition of 0x0a62, never answered OK: its refusal.
    let node2_adds = || async {
        sm.set_node(one_port("node2", g2, &[0x0a63, 0x0a62]), 2)
            .await
            .expect_err("node2's addition answered OK")
    };
    let held_for = |e: OpenSmError| match e {
        OpenSmError::Rejected(Rejection::Repeated { wait_s, .. }) => wait_s,
        other => panic!("node2's addition during the hold: {other}"),
    };
    // node2 adds 0x0a62: OpenSM rejects the file, the accepted one is put back, and the
    // addition is held back (its retry is refused without a write).
    let log_at = fabric.opensm_log().len();
    let e = node2_adds().await;
    assert!(
        matches!(e, OpenSmError::Rejected(Rejection::Written { .. })),
        "{e}"
    );
    assert!(fabric.opensm_log()[log_at..].contains("PARSE ERROR"));
    let hold_s = held_for(node2_adds().await);

    // node1 releases 0x0a61 during node2's hold, retrying every second like a node would.
    let started = Instant::now();
    let mut answers = Vec::new();
    let took = loop {
        match sm.set_node(one_port("node1", g1, &[]), 2).await {
            Ok(_) => break started.elapsed(),
            Err(e) => answers.push(e.to_string()),
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node1's release not acknowledged within 30 s of node2's {hold_s} s hold: {answers:#?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "node1's release acknowledged {took:?} after it was first sent, during node2's {hold_s} s hold ({} refusals before)",
        answers.len()
    );
    assert!(answers.is_empty(), "{answers:#?}");
    // smpquery: 0x0a61 left node1's port; node2 keeps 0x0a63 and never got 0x0a62.
    wait_until(
        "0x0a61 gone from node1",
        Duration::from_secs(10),
        || async { !has_base(&fabric.pkeys("node1"), 0x0a61) },
    )
    .await;
    let k2 = fabric.pkeys("node2");
    assert!(has_base(&k2, 0x0a63) && !has_base(&k2, 0x0a62), "{k2:x?}");
    // node2's addition is still held.
    held_for(node2_adds().await);
}
