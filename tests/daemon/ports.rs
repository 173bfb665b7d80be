//! Ports per attachment, through the daemon: an attach names its instance's ports (or none, for
//! the whole node); a port carries one partition at a time, so a new tenant on ports whose
//! previous partition is not yet RELEASED is refused (the turnover story, through the CLI); a
//! partial-node attachment puts its key on its own port only; bad port names change nothing;
//! and a covered port that vanishes, or whose table cannot be read, blocks RELEASED with its
//! name until it is back and read without the key.

use testkit::common;

use common::fixtures::MLX5_8X_IB as IB;
use common::*;
use fabric_agent::proto::agent as pb;
use std::path::Path;
use std::time::Duration;

/// `fabric-agent attach` arguments for `instance` in `partition` (P_Key `pkey`), plus `extra`.
fn attach_cli<'a>(
    instance: &'a str,
    partition: &'a str,
    pkey: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "attach",
        "--instance",
        instance,
        "--partition",
        partition,
        "--name",
        "p",
        "--workspace",
        "ws",
        "--account",
        "acct",
        "--pkey",
        pkey,
    ];
    args.extend_from_slice(extra);
    args
}

/// The tenant keys (16-bit values) port `n` of the embedded fabric holds.
async fn port_keys(
    c: &mut pb::fabric_agent_client::FabricAgentClient<tonic::transport::Channel>,
    n: u32,
) -> Vec<u32> {
    let node = node(c).await;
    let p = node
        .ports
        .iter()
        .find(|p| p.port_number == n)
        .expect("port listed");
    p.pkeys
        .iter()
        .copied()
        .filter(|k| *k != 0 && (*k & 0x7fff) != 0x7fff)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_tenant_waits_for_the_previous_partition_to_be_released_on_its_ports() {
    let mut d = Daemon::start_with_fault(
        None,
        "",
        "[reconciler]\nbackoff_initial_ms = 100\nbackoff_max_ms = 300\n",
    );
    let fault = d.fault_file();
    let sock = d.socket.clone();
    let mut c = d.client().await;

    // Partial node: vm-a on port 1 (partition A), vm-c on port 2 (partition C).
    let o = cli(
        &sock,
        &attach_cli(
            "vm-a",
            "ibpart_a",
            "0a01",
            &["--port", "sim0/1", "--wait", "10"],
        ),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("sim0/1"), "{}", stdout(&o));
    let port2_guid = node(&mut c)
        .await
        .ports
        .iter()
        .find(|p| p.port_number == 2)
        .unwrap()
        .port_guid
        .clone();
    let o = cli(
        &sock,
        &attach_cli(
            "vm-c",
            "ibpart_c",
            "0c01",
            &["--port", &port2_guid, "--wait", "10", "--json"],
        ),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(json["state"], "ACTIVE", "{json}");
    assert_eq!(json["named_ports"], true, "{json}");
    assert_eq!(json["ports"][0]["port"], 2, "{json}");
    assert_eq!(port_keys(&mut c, 1).await, vec![0x8a01], "A only on port 1");
    assert_eq!(port_keys(&mut c, 2).await, vec![0x8c01], "C only on port 2");
    let a = get(&mut c, "vm-a").await;
    assert!(a.named_ports);
    assert_eq!(
        a.ports.iter().map(|p| p.port_number).collect::<Vec<_>>(),
        vec![1]
    );

    // The subnet manager becomes unreachable and vm-a is terminated: RELEASING.
    std::fs::write(&fault, "unreachable").unwrap();
    let o = cli(&sock, &["release", "--instance", "vm-a"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        state(&get(&mut c, "vm-a").await),
        pb::AttachmentState::Releasing
    );

    // The next tenant on port 1 is refused, naming the holder, its partition and state; a
    // whole-node attach overlaps port 1 too. Nothing is stored.
    for extra in [&["--port", "sim0/1"][..], &[][..]] {
        let o = cli(&sock, &attach_cli("vm-b", "ibpart_b", "0b01", extra));
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {}", stderr(&o));
        let err = stderr(&o);
        for says in [
            "FAILED_PRECONDITION",
            "vm-a",
            "ibpart_a",
            "RELEASING",
            "sim0/1",
        ] {
            assert!(err.contains(says), "{extra:?}: {says:?} not in {err}");
        }
    }
    let o = cli(&sock, &["attachments", "--instance", "vm-b", "--json"]);
    assert_eq!(stdout(&o).trim(), "[]", "a refused attach stores nothing");
    // The same partition may share the port: its key is the one the port carries anyway.
    let o = cli(
        &sock,
        &attach_cli("vm-a2", "ibpart_a", "0a01", &["--port", "sim0/1"]),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = cli(&sock, &["release", "--instance", "vm-a2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The subnet manager is back: vm-a goes RELEASED, and vm-b is accepted on port 1.
    std::fs::write(&fault, "").unwrap();
    let o = cli(&sock, &["release", "--instance", "vm-a", "--wait", "10"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = cli(
        &sock,
        &attach_cli(
            "vm-b",
            "ibpart_b",
            "0b01",
            &["--port", "sim0/1", "--wait", "10"],
        ),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(port_keys(&mut c, 1).await, vec![0x8b01]);
    assert_eq!(port_keys(&mut c, 2).await, vec![0x8c01], "vm-c untouched");
    assert_eq!(
        state(&get(&mut c, "vm-c").await),
        pb::AttachmentState::Active
    );

    // The events name the ports.
    let o = cli(&sock, &["events", "--json"]);
    assert!(stdout(&o).contains("\"ports\""), "{}", stdout(&o));
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_port_names_are_refused_with_the_name_and_store_nothing() {
    let mut d = Daemon::start("");
    let mut c = d.client().await;
    let named = |ports: Vec<pb::PortName>| {
        let mut r = attach("vm-x", partition("ibpart_x", 0x0d01), None);
        r.ports = ports;
        r
    };
    let dev = |device: &str, n: u32| pb::PortName {
        device: device.into(),
        port_number: n,
        port_guid: String::new(),
    };
    let guid = |g: &str| pb::PortName {
        port_guid: g.into(),
        ..Default::default()
    };
    let cases = [
        (
            vec![dev("mlx5_9", 1)],
            tonic::Code::FailedPrecondition,
            "mlx5_9/1",
        ),
        (
            vec![dev("sim0", 3)],
            tonic::Code::FailedPrecondition,
            "sim0/3",
        ),
        (
            vec![guid("0x00000000deadbeef")],
            tonic::Code::FailedPrecondition,
            "0x00000000deadbeef",
        ),
        (vec![guid("zz")], tonic::Code::InvalidArgument, "zz"),
        (
            vec![dev("sim0", 0)],
            tonic::Code::InvalidArgument,
            "port number 0",
        ),
        (
            vec![dev("sim0", 1), dev("sim0", 1)],
            tonic::Code::InvalidArgument,
            "sim0/1",
        ),
        (
            vec![dev("sim0", 1), dev("sim0", 2), dev("sim0", 1)],
            tonic::Code::InvalidArgument,
            "3 ports named",
        ),
    ];
    for (ports, code, says) in cases {
        let e = c
            .attach_partition(named(ports.clone()))
            .await
            .expect_err("refused");
        assert_eq!(e.code(), code, "{ports:?}: {e:?}");
        assert!(e.message().contains(says), "{ports:?}: {}", e.message());
    }
    let list = c
        .list_attachments(pb::ListAttachmentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.attachments.is_empty(), "{list:?}");
    d.stop();
}

/// `dev`'s directory moved out of the tree at `root` into `aside` (the device is gone from the
/// listing), or back.
fn vanish(root: &Path, aside: &Path, dev: &str, gone: bool) {
    let (from, to) = (root.join(dev), aside.join(dev));
    if gone {
        std::fs::rename(from, to).unwrap();
    } else {
        std::fs::rename(to, from).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_covered_port_that_vanishes_blocks_released_until_it_is_read_without_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    mlx5_8x_active(&root);
    set_pkey(&root, "mlx5_3", 1, 0);
    let extra = format!(
        "allow_full_default = true\n{}",
        mlx5_8x_config(&root, "fast_poll_ms = 20\n")
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
    let mut c = d.client().await;
    let wait = |c: &mut pb::fabric_agent_client::FabricAgentClient<tonic::transport::Channel>,
                want: pb::AttachmentState| {
        let mut c = c.clone();
        async move {
            poll_attachment(&mut c, "gpu-1", Duration::from_secs(5), |a| {
                state(a) == want
            })
            .await
        }
    };

    // gpu-1 covers two of the eight ports: only those must hold the key.
    let mut r = attach("gpu-1", partition("ibpart_train", 0x0c33), None);
    r.ports = ["mlx5_0", "mlx5_1"]
        .iter()
        .map(|d| pb::PortName {
            device: (*d).into(),
            port_number: 1,
            port_guid: String::new(),
        })
        .collect();
    c.attach_partition(r).await.unwrap();
    set_pkey(&root, IB[0], 10, 0x8c33);
    // Polled, not read after a fixed pause: on a loaded machine the apply's acknowledgement can
    // come later than any pause, and PROGRAMMING stands until the second port holds the key.
    let a = wait(&mut c, pb::AttachmentState::Programming).await;
    assert_eq!(
        state(&a),
        pb::AttachmentState::Programming,
        "one covered port of two holds the key: {a:?}"
    );
    set_pkey(&root, IB[1], 10, 0x8c33);
    let a = wait(&mut c, pb::AttachmentState::Active).await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");

    // Released: the key leaves mlx5_0, while mlx5_1 vanishes (a driver reset) still holding
    // it. No RELEASED on the ports that remain; the reason names the missing port.
    release(&mut c, "gpu-1", None).await;
    let aside = tmp.path().join("aside");
    std::fs::create_dir_all(&aside).unwrap();
    vanish(&root, &aside, "mlx5_1", true);
    set_pkey(&root, IB[0], 10, 0);
    let a = poll_attachment(&mut c, "gpu-1", Duration::from_secs(5), |a| {
        a.reason.contains("mlx5_1/1")
    })
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Releasing, "{a:?}");
    assert!(a.reason.contains("missing"), "{}", a.reason);

    // Back without its `pkeys` directory: its table is unreadable, not empty.
    vanish(&root, &aside, "mlx5_1", false);
    let pkeys = port_file(&root, "mlx5_1", "pkeys");
    let pkeys_aside = aside.join("mlx5_1-pkeys");
    std::fs::rename(&pkeys, &pkeys_aside).unwrap();
    let a = poll_attachment(&mut c, "gpu-1", Duration::from_secs(5), |a| {
        a.reason.contains("unknown state")
    })
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Releasing, "{a:?}");
    assert!(a.reason.contains("mlx5_1/1"), "{}", a.reason);

    // Readable again, still holding the key: RELEASING; without it: RELEASED.
    std::fs::rename(&pkeys_aside, &pkeys).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state(&get(&mut c, "gpu-1").await),
        pb::AttachmentState::Releasing
    );
    set_pkey(&root, IB[1], 10, 0);
    let a = wait(&mut c, pb::AttachmentState::Released).await;
    assert_eq!(state(&a), pb::AttachmentState::Released, "{a:?}");
    d.stop();
}
