//! A node agent whose store is put back from a copy, on an ibsim fabric with a real OpenSM,
//! through the public API and `smpquery`: a key released after the copy never goes back on the
//! port. The restored attachment is withheld (PENDING, `RESTORED_UNCONFIRMED`) until the control
//! plane sends its attach again or releases it. Both ways a rollback is found are covered: the
//! database put back under its newer mirror (seen at open), and the whole state directory put
//! back (seen from the SM host's newer generation). Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::{attach, attach_now, free_port, get, has_base, node, partition, release, state};
use common::{wait_until, CONVERGE};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use rig::agents::{node_config, sm_config, Agent};
use rig::{Fabric, FabricSpec};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Code;

const OPERATOR: &str = "# operator's partitions\n\
Default=0x7fff : ALL=limited, SELF=full ;\n";

/// Tenant A's key, released after the copy; tenant B's key, given to the node after that.
const KEY_A: u16 = 0x0a61;
const KEY_B: u16 = 0x0a62;

/// How a copy of the node's state is put back.
#[derive(Clone, Copy, Debug)]
enum Restore {
    /// The database file only: its side file (the mirror) still names the newer store.
    Database,
    /// The whole state directory, mirror included.
    WholeDirectory,
}

/// Whether a standing condition of this kind is shown by GetNode; its detail.
fn condition(n: &pb::GetNodeResponse, kind: &str) -> Option<String> {
    n.conditions
        .iter()
        .find(|c| c.kind == kind)
        .map(|c| c.detail.clone())
}

/// A fabric with the SM host and node1 after tenant A was attached (ACTIVE) and node1 stopped
/// for a copy of its state directory.
struct Copied {
    fabric: Fabric,
    sm: Agent,
    /// Stopped.
    n1: Agent,
    /// node1's state directory, and the copy of it.
    dir: PathBuf,
    copy: PathBuf,
}

impl Copied {
    /// Stops node1, puts the copy back as `how` says and starts node1 again.
    fn restore(&mut self, how: Restore) {
        assert!(self.n1.stop().success());
        put_back(how, &self.dir, &self.copy);
        self.n1.spawn(&self.fabric);
    }
}

/// Starts the fabric (None: ibsim/OpenSM not installed), attaches tenant A, stops node1 and
/// copies its state directory.
async fn attached_then_copied() -> Option<Copied> {
    let fabric = Fabric::start(&FabricSpec::new(1, 2), OPERATOR)?;
    let port = free_port();
    let sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let mut n1 = Agent::start(&fabric, "node1", &node_config(&fabric, "node1", port));
    let mut c = n1.client().await;
    let a = partition("ibpart_a", KEY_A.into());
    let a = attach_now(&mut c, attach("tenant-a", a, Some(20_000))).await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    assert!(n1.stop().success());
    let dir = fabric.dir().join("node1-state");
    let copy = fabric.dir().join("node1-state-copy");
    common::copy_tree(&dir, &copy);
    Some(Copied {
        fabric,
        sm,
        n1,
        dir,
        copy,
    })
}

/// The node attached tenant A (ACTIVE), a copy of its state was taken, A was released
/// (RELEASED) and tenant B attached on the same port (ACTIVE); then the copy is put back.
/// Tenant A's key must never be on the port again, until the control plane decides.
async fn restored_node_never_puts_a_released_key_back(restore: Restore) {
    let Some(mut rig) = attached_then_copied().await else {
        return;
    };
    rig.n1.spawn(&rig.fabric);
    let mut c = rig.n1.client().await;
    hand_over(&mut c, &rig.fabric).await;
    rig.restore(restore);
    let c = rig.n1.client().await;
    // The restored attachment is withheld: PENDING, the condition naming it.
    let withheld = wait_until("tenant-a withheld", CONVERGE, || {
        let mut c = c.clone();
        async move {
            let n = node(&mut c).await;
            condition(&n, "RESTORED_UNCONFIRMED").is_some_and(|d| d.contains("tenant-a"))
        }
    });
    watch_port_while(&rig.fabric, withheld).await;
    let mut c = c.clone();
    let a = get(&mut c, "tenant-a").await;
    assert_eq!(state(&a), pb::AttachmentState::Pending, "{a:?}");
    assert!(a.reason.contains("withheld"), "{a:?}");
    // Nothing asks for either key now (B's attach went with the rollback): for a while, and
    // after the SM host acknowledged the node's set, neither is on the port.
    watch_port_while(&rig.fabric, tokio::time::sleep(Duration::from_secs(3))).await;
    wait_until(
        "tenant-b's key gone with its lost attach",
        CONVERGE,
        || async { !has_base(&rig.fabric.pkeys("node1"), KEY_B) },
    )
    .await;

    // The control plane resynchronises: it releases A again and attaches B again.
    hand_over(&mut c, &rig.fabric).await;
    let n = node(&mut c).await;
    assert_eq!(condition(&n, "RESTORED_UNCONFIRMED"), None, "{n:?}");
    assert!(rig.n1.stop().success());
    assert!(rig.sm.stop().success());
}

/// The control plane releases tenant A (RELEASED) and gives the port to tenant B (ACTIVE):
/// only B's key is on it.
async fn hand_over(c: &mut FabricAgentClient<Channel>, fabric: &Fabric) {
    let r = release(c, "tenant-a", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    let b = partition("ibpart_b", KEY_B.into());
    let b = attach_now(c, attach("tenant-b", b, Some(20_000))).await;
    assert_eq!(state(&b), pb::AttachmentState::Active, "{b:?}");
    let keys = fabric.pkeys("node1");
    assert!(
        has_base(&keys, KEY_B) && !has_base(&keys, KEY_A),
        "{keys:x?}"
    );
}

/// Puts the copy back.
fn put_back(restore: Restore, dir: &Path, copy: &Path) {
    match restore {
        Restore::Database => {
            std::fs::copy(copy.join("state.redb"), dir.join("state.redb")).expect("database back")
        }
        Restore::WholeDirectory => {
            std::fs::remove_dir_all(dir).expect("state dir removed");
            common::copy_tree(copy, dir);
            0
        }
    };
}

/// Reads the node's port table with `smpquery` until `until` completes: tenant A's key must
/// never be on it.
async fn watch_port_while(fabric: &Fabric, until: impl std::future::Future) {
    tokio::pin!(until);
    loop {
        let keys = fabric.pkeys("node1");
        assert!(
            !has_base(&keys, KEY_A),
            "the key released before the restore is back on the port: {keys:x?}"
        );
        tokio::select! {
            _ = &mut until => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_put_back_under_its_mirror_never_puts_a_released_key_back() {
    restored_node_never_puts_a_released_key_back(Restore::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_state_directory_put_back_never_puts_a_released_key_back() {
    restored_node_never_puts_a_released_key_back(Restore::WholeDirectory).await;
}

/// The whole state directory put back (mirror included): the node cannot see the rollback
/// itself. The SM host's newer generation with a set the store never recorded as sent (nor as
/// acknowledged) is the evidence, found by the start check before any apply, and the node raises
/// STORE_ROLLED_BACK and starts a new log epoch above every seq it handed out, instead of
/// moving past it silently; the followed cursor gets OUT_OF_RANGE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restored_with_its_whole_state_dir_raises_store_rolled_back() {
    let Some(mut rig) = attached_then_copied().await else {
        return;
    };
    rig.n1.spawn(&rig.fabric);
    let mut c = rig.n1.client().await;
    let r = release(&mut c, "tenant-a", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    let followed = node(&mut c).await;
    rig.restore(Restore::WholeDirectory);
    let c = rig.n1.client().await;
    let raised = |log: &[pb::Event]| {
        log.iter().any(|e| {
            matches!(&e.kind, Some(pb::event::Kind::ConditionChanged(cc))
                if cc.active && cc.condition.as_ref().is_some_and(|k| k.kind == "STORE_ROLLED_BACK"
                    && k.detail.contains("SM host") && k.detail.contains("the store lost writes")))
        })
    };
    wait_until("STORE_ROLLED_BACK raised", CONVERGE, || {
        let mut c = c.clone();
        async move {
            // The log may restart between GetNode and the watch: OUT_OF_RANGE, ask again.
            let n = node(&mut c.clone()).await;
            let request = pb::WatchEventsRequest {
                after_seq: n.first_event_seq.saturating_sub(1),
                no_follow: true,
                log_epoch: Some(n.log_epoch),
            };
            let Ok(stream) = c.watch_events(request).await else {
                return false;
            };
            let log: Vec<pb::Event> = stream.into_inner().filter_map(Result::ok).collect().await;
            raised(&log)
        }
    })
    .await;
    let mut c: FabricAgentClient<Channel> = c.clone();
    let after = node(&mut c).await;
    assert_ne!(after.log_epoch, followed.log_epoch, "a new epoch");
    assert!(
        after.first_event_seq > followed.last_event_seq,
        "seqs reused: first {} after the followed {}",
        after.first_event_seq,
        followed.last_event_seq
    );
    let old = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: followed.last_event_seq,
            no_follow: true,
            log_epoch: Some(followed.log_epoch.clone()),
        })
        .await
        .expect_err("the followed cursor belongs to the old log");
    assert_eq!(old.code(), Code::OutOfRange, "{old:?}");
    assert!(rig.n1.stop().success());
    assert!(rig.sm.stop().success());
}
