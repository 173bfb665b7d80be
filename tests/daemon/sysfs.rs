//! The daemon on a host seen through sysfs (a fixture tree shaped like an 8x ConnectX GPU host
//! plus a RoCE storage device): keys appearing in the ports' tables drive ACTIVE, vanishing
//! drives RELEASED, a DOWN port counts as released, and the excluded RoCE device blocks neither.

use testkit::common;

use common::fixtures::MLX5_8X_IB as IB;
use common::*;
use fabric_agent::proto::agent as pb;
use std::time::Duration;

/// gpu-1 once it is in state `want`, or as it is after 5 s.
async fn wait_state(
    c: &mut fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient<
        tonic::transport::Channel,
    >,
    want: pb::AttachmentState,
) -> pb::Attachment {
    poll_attachment(c, "gpu-1", Duration::from_secs(5), |a| state(a) == want).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_tables_in_sysfs_drive_active_and_released() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    // Bring the DOWN port up for the attach half (its stale key goes away with the reset).
    mlx5_8x_active(&root);
    set_pkey(&root, "mlx5_3", 1, 0);
    // The fixture's ports are full members of the default partition (0xffff), as with OpenSM's
    // stock Default; the operator accepts that posture here.
    let extra = format!(
        "allow_full_default = true\n{}",
        mlx5_8x_config(&root, "fast_poll_ms = 20\n")
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
    let mut c = d.client().await;
    let node = common::node(&mut c).await;
    assert_eq!(node.observer, "sysfs", "{}", node.observer_reason);
    let bond = node
        .ports
        .iter()
        .find(|p| p.device == "mlx5_bond_0")
        .expect("RoCE device listed");
    assert!(!bond.fabric_port);
    assert_eq!(node.ports.iter().filter(|p| p.fabric_port).count(), 8);

    let r = c
        .attach_partition(attach(
            "gpu-1",
            partition("ibpart_train", 0x0c33),
            Some(300),
        ))
        .await
        .unwrap();
    assert_eq!(
        state(&r.into_inner().attachment.unwrap()),
        pb::AttachmentState::Programming
    );
    // The "SM" programs seven of eight ports: still not ACTIVE.
    for dev in &IB[..7] {
        set_pkey(&root, dev, 10, 0x8c33);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state(&wait_state(&mut c, pb::AttachmentState::Programming).await),
        pb::AttachmentState::Programming
    );
    set_pkey(&root, IB[7], 10, 0x8c33);
    assert_eq!(
        state(&wait_state(&mut c, pb::AttachmentState::Active).await),
        pb::AttachmentState::Active
    );

    release(&mut c, "gpu-1", None).await;
    // The key leaves every port but mlx5_3, which goes DOWN still listing it: that counts as
    // released (the SM reprograms a port before it can go ACTIVE again).
    for dev in IB.iter().filter(|d| **d != "mlx5_3") {
        set_pkey(&root, dev, 10, 0);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state(&wait_state(&mut c, pb::AttachmentState::Releasing).await),
        pb::AttachmentState::Releasing
    );
    std::fs::write(port_file(&root, "mlx5_3", "state"), "1: DOWN\n").unwrap();
    assert_eq!(
        state(&wait_state(&mut c, pb::AttachmentState::Released).await),
        pb::AttachmentState::Released
    );

    let evs = events(&mut c, 0).await;
    assert_gap_free(&evs);
    assert!(evs.iter().any(
        |e| matches!(&e.kind, Some(pb::event::Kind::PortStateChanged(p)) if p.device == "mlx5_3")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rxe_rig_lists_roce_and_completes_against_the_embedded_tables() {
    let tmp = tempfile::tempdir().unwrap();
    // `auto` finds no verbs device on this kernel and falls back to sysfs at this root: the
    // same inventory an rxe rig shows.
    let extra = format!(
        "[observer]\nkind = \"auto\"\nsysfs_root = \"{}\"\n",
        std::fs::canonicalize("tests/fixtures/sysfs/rxe")
            .unwrap()
            .display()
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
    let mut c = d.client().await;
    let node = common::node(&mut c).await;
    let rxe = node
        .ports
        .iter()
        .find(|p| p.device == "rxe0")
        .expect("rxe0 listed");
    assert_eq!(rxe.link_layer, pb::LinkLayer::Ethernet as i32);
    assert!(!rxe.fabric_port, "RoCE is not an InfiniBand fabric port");
    assert_eq!(rxe.pkeys, vec![0xffff]);
    assert!(
        node.observer_reason.contains("embedded"),
        "{}",
        node.observer_reason
    );
    // This kernel has no RDMA: the daemon says so and why it fell back to sysfs.
    assert_eq!(node.observer, "sysfs", "{}", node.observer_reason);
    assert!(
        node.observer_reason.contains("libibverbs found no devices"),
        "{}",
        node.observer_reason
    );
    let a = c
        .attach_partition(attach("gpu-1", partition("ibpart_demo", 0x21), Some(5000)))
        .await
        .unwrap();
    assert_eq!(
        state(&a.into_inner().attachment.unwrap()),
        pb::AttachmentState::Active
    );
    let r = c
        .release_instance(pb::ReleaseInstanceRequest {
            instance_id: "gpu-1".into(),
            wait_ms: Some(5000),
        })
        .await
        .unwrap();
    assert_eq!(
        state(&r.into_inner().attachment.unwrap()),
        pb::AttachmentState::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_table_change_across_a_failed_read_is_reported() {
    // The ports become unreadable, a key appears meanwhile, the ports come back: the change is
    // reported against the last good read; PORTS_UNREADABLE stood meanwhile and clears.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    let away = tmp.path().join("sys-away");
    mlx5_8x_active(&root);
    let extra = format!(
        "allow_full_default = true\n{}",
        mlx5_8x_config(&root, "fast_poll_ms = 20\nslow_poll_ms = 100\n")
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
    let mut c = d.client().await;
    let unreadable =
        |n: &pb::GetNodeResponse| n.conditions.iter().any(|c| c.kind == "PORTS_UNREADABLE");
    // The first read is done (the socket accepts connections before it is).
    until_node(&mut c, Duration::from_secs(10), "the first read", |n| {
        n.ports.iter().any(|p| p.device == IB[0])
    })
    .await;
    std::fs::rename(&root, &away).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || d
            .log()
            .contains("reading ports failed")),
        "{}",
        d.log()
    );
    // The condition, as node shows it while the ports are away (checked at the end, so the
    // port-table check below stands on its own).
    let mut seen = None;
    for _ in 0..100 {
        let n = common::node(&mut c).await;
        if let Some(cond) = n.conditions.iter().find(|c| c.kind == "PORTS_UNREADABLE") {
            seen = Some(cond.detail.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    set_pkey(&away, IB[0], 11, 0x8c44);
    std::fs::rename(&away, &root).unwrap();
    let table_changed = |evs: &[pb::Event]| {
        evs.iter().any(|e| matches!(
            &e.kind,
            Some(pb::event::Kind::PkeyTableChanged(p)) if p.device == IB[0] && p.added == [0x8c44]
        ))
    };
    for _ in 0..100 {
        if table_changed(&events(&mut c, 0).await) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let evs = events(&mut c, 0).await;
    assert!(table_changed(&evs), "{evs:?}");
    let detail = seen.expect("PORTS_UNREADABLE while the ports were away");
    assert!(
        detail.starts_with("the last port read failed: "),
        "{detail}"
    );
    until_node(
        &mut c,
        Duration::from_secs(10),
        "the condition cleared",
        |n| !unreadable(n),
    )
    .await;
    let evs = events(&mut c, 0).await;
    let conditions: Vec<(String, bool)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::ConditionChanged(c))
                if c.condition
                    .as_ref()
                    .is_some_and(|c| c.kind == "PORTS_UNREADABLE") =>
            {
                Some((
                    c.condition
                        .as_ref()
                        .map(|c| c.kind.clone())
                        .unwrap_or_default(),
                    c.active,
                ))
            }
            _ => None,
        })
        .collect();
    // Raised (again with each new detail, when the read fails differently as the tree moves),
    // then cleared once.
    let mut states: Vec<bool> = conditions.iter().map(|(_, active)| *active).collect();
    states.dedup();
    assert_eq!(states, [true, false], "{conditions:?}");
}
