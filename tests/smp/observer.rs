//! The SMP observer against a real OpenSM on the ibsim fabric: its inventory equals what
//! `smpquery` reports for every node, and it sees a P_Key table change on an affected node
//! soon after it lands while an unaffected node sees none.
//!
//! umad2sim must be preloaded into the process doing umad I/O, so the observer runs in a child:
//! this test binary re-executed with `FABRIC_AGENT_SMP_CHILD` set, running only
//! `observer_child_process`, under the shim as a given node.

use testkit::common;
use testkit::rig;

use common::wait_for;

use fabric_agent::config::ObserverConfig;
use fabric_agent::observe::smp::SmpObserver;
use fabric_agent::observe::PortObserver;
use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const CHILD_ENV: &str = "FABRIC_AGENT_SMP_CHILD";
const LINE_PREFIX: &str = "SMP-OBSERVER ";
const PEER_ENV: &str = "FABRIC_AGENT_SMP_PEER";
const PEER_GUID_ENV: &str = "FABRIC_AGENT_SMP_PEER_GUID";

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The observer side. Does nothing in a normal test run; in a re-executed child it prints the
/// inventory (`inventory` mode) or, in `watch` mode, one line per distinct P_Key table until
/// its stdin closes (exiting normally lets the shim clean up and free its ibsim slot).
/// Ignored in normal runs: the tests below run it with `--ignored` in a child.
#[test]
#[ignore = "the observer side of the tests below; runs only in their children"]
fn observer_child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let config = ObserverConfig {
            fast_poll_ms: 50,
            ..ObserverConfig::default()
        };
        let observer = SmpObserver::open(&config).expect("open umad0");
        match mode.as_str() {
            "inventory" => {
                let inventory = observer.inventory().await.expect("inventory");
                println!(
                    "{LINE_PREFIX}{}",
                    serde_json::to_string(&inventory).unwrap()
                );
            }
            "watch" => {
                let (eof_tx, mut eof) = tokio::sync::oneshot::channel::<()>();
                std::thread::spawn(move || {
                    let mut sink = String::new();
                    while std::io::stdin()
                        .read_line(&mut sink)
                        .map(|n| n > 0)
                        .unwrap_or(false)
                    {}
                    let _ = eof_tx.send(());
                });
                let mut last = None;
                loop {
                    let port = observer
                        .inventory()
                        .await
                        .expect("inventory")
                        .ports
                        .remove(0);
                    let keys: Vec<u16> = port.pkeys.iter().map(|k| k.0).collect();
                    if last.as_ref() != Some(&keys) {
                        let line = serde_json::json!({ "t_ms": now_ms() as u64, "pkeys": keys });
                        println!("{LINE_PREFIX}{line}");
                        last = Some(keys);
                    }
                    tokio::select! {
                        _ = observer.changed(true) => {}
                        _ = &mut eof => break,
                    }
                }
            }
            "path" => {
                let peer: u16 = std::env::var(PEER_ENV).unwrap().parse().unwrap();
                let port = observer.port().await.expect("port");
                let path = observer
                    .path_between(port.sm_lid, port.lid, peer)
                    .await
                    .expect("PathRecord query");
                // The same question by GIDs (subnet prefix + port GUID) must agree.
                let gid = |guid: u64| (0xfe80_0000_0000_0000u128 << 64) | u128::from(guid);
                let peer_guid: u64 = std::env::var(PEER_GUID_ENV).unwrap().parse().unwrap();
                let by_gid = observer
                    .path_between_gids(port.sm_lid, gid(port.port_guid.0), gid(peer_guid))
                    .await
                    .expect("PathRecord query by GID");
                assert_eq!(by_gid.map(|p| p.pkey), path.map(|p| p.pkey), "by GID");
                let line = serde_json::json!({ "pkey": path.map(|p| p.pkey) });
                println!("{LINE_PREFIX}{line}");
            }
            other => panic!("unknown child mode {other}"),
        }
    });
}

fn child(fabric: &rig::Fabric, node: &str, mode: &str) -> std::process::Command {
    let mut cmd = fabric.client_command(node, std::env::current_exe().unwrap());
    cmd.args([
        testkit::test_name(module_path!(), "observer_child_process").as_str(),
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, mode)
    .stderr(Stdio::inherit());
    cmd
}

/// The JSON after the marker (the test harness may print its own text before it).
fn after_prefix(line: &str) -> Option<&str> {
    line.find(LINE_PREFIX)
        .map(|i| &line[i + LINE_PREFIX.len()..])
}

fn observer_lines(stdout: ChildStdout) -> mpsc::Receiver<serde_json::Value> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(json) = after_prefix(&line) {
                if tx.send(serde_json::from_str(json).unwrap()).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

fn inventory_of(fabric: &rig::Fabric, node: &str) -> serde_json::Value {
    child_output(fabric, node, "inventory", None)
}

fn child_output(
    fabric: &rig::Fabric,
    node: &str,
    mode: &str,
    peer: Option<(u16, u64)>,
) -> serde_json::Value {
    let mut cmd = child(fabric, node, mode);
    if let Some((lid, guid)) = peer {
        cmd.env(PEER_ENV, lid.to_string())
            .env(PEER_GUID_ENV, guid.to_string());
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "observer child for {node}: {}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text
        .lines()
        .find_map(after_prefix)
        .unwrap_or_else(|| panic!("no inventory from {node}: {text}"));
    serde_json::from_str(json).unwrap()
}

fn guid(fabric: &rig::Fabric, node: &str) -> String {
    format!("{:#018x}", fabric.node_info(node).port_guid)
}

#[test]
fn observer_inventory_matches_smpquery() {
    let spec = rig::FabricSpec::new(2, 4);
    let Some(fabric) = rig::Fabric::start(&spec, rig::DEFAULT_PARTITIONS) else {
        return;
    };
    // node1 and node2 share 0x8001; node3 holds 40 tenant keys so its table spills into the
    // second 32-entry block.
    let (g1, g2, g3) = (
        guid(&fabric, "node1"),
        guid(&fabric, "node2"),
        guid(&fabric, "node3"),
    );
    let mut partitions =
        format!("Default=0x7fff : ALL=full ;\nt1=0x8001 : {g1}=full, {g2}=limited ;\n");
    for i in 0..40 {
        partitions.push_str(&format!("m{i}=0x{:04x} : {g3}=full ;\n", 0x0100 + i));
    }
    fabric.set_partitions(&partitions);
    wait_for("node3's 41 keys", Duration::from_secs(10), || {
        fabric.pkeys("node3").iter().filter(|k| **k != 0).count() == 41
    });

    let mut nodes = vec![rig::SM_HOST.to_owned()];
    nodes.extend(fabric.hcas());
    for node in &nodes {
        let expected_node = fabric.node_info(node);
        let expected_port = fabric.port_info(node);
        let expected_keys = fabric.pkeys(node);
        let inventory = inventory_of(&fabric, node);
        let ports = inventory["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 1, "{node}");
        let port = &ports[0];
        assert_eq!(
            port["node_guid"],
            serde_json::json!(expected_node.node_guid),
            "{node}"
        );
        assert_eq!(
            port["port_guid"],
            serde_json::json!(expected_node.port_guid),
            "{node}"
        );
        assert_eq!(
            port["port_number"],
            serde_json::json!(expected_node.local_port),
            "{node}"
        );
        assert_eq!(port["lid"], serde_json::json!(expected_port.lid), "{node}");
        assert_eq!(
            port["sm_lid"],
            serde_json::json!(expected_port.sm_lid),
            "{node}"
        );
        assert_eq!(expected_port.state, "Active");
        assert_eq!(port["state"], "ACTIVE", "{node}");
        assert_eq!(port["link_layer"], "infiniband", "{node}");
        assert_eq!(port["device"], "ibsim0", "{node}");
        let keys: Vec<u16> = serde_json::from_value(port["pkeys"].clone()).unwrap();
        assert_eq!(
            keys.len(),
            usize::from(expected_node.partition_cap),
            "{node}"
        );
        assert_eq!(keys, expected_keys, "{node}: every P_Key table entry");
    }
    let node3 = inventory_of(&fabric, "node3");
    let keys: Vec<u16> = serde_json::from_value(node3["ports"][0]["pkeys"].clone()).unwrap();
    assert!(keys[32..].iter().any(|k| *k != 0), "block 1 was read");
    assert!(keys.contains(&0x8127), "the 40th tenant key, full member");
    // Clients exited normally: only OpenSM's shim dir remains.
    assert_eq!(fabric.shim_litter().len(), 1, "{:?}", fabric.shim_litter());
}

#[test]
fn observer_sees_a_pkey_change_within_500ms_and_others_see_none() {
    let spec = rig::FabricSpec::new(2, 4);
    let Some(fabric) = rig::Fabric::start(&spec, rig::DEFAULT_PARTITIONS) else {
        return;
    };
    let g1 = guid(&fabric, "node1");
    let mut watchers = Vec::new();
    for node in ["node1", "node2"] {
        let mut process = child(&fabric, node, "watch")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = observer_lines(process.stdout.take().unwrap());
        let first = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{node}: no first observation"));
        assert_eq!(first["pkeys"][0], 0xffff, "{node}");
        watchers.push((node, process, lines));
    }

    fabric.set_partitions(&format!(
        "Default=0x7fff : ALL=full ;\nt2=0x8002 : {g1}=full ;\n"
    ));
    let hup = now_ms();
    let mut visible = None;
    while visible.is_none() {
        assert!(now_ms() - hup < 10_000, "0x8002 never reached node1");
        if fabric.pkeys("node1").contains(&0x8002) {
            visible = Some(now_ms());
        }
    }
    let visible = visible.unwrap();
    let change = watchers[0]
        .2
        .recv_timeout(Duration::from_secs(2))
        .expect("node1's observer saw no change");
    let detected = change["t_ms"].as_u64().unwrap() as u128;
    let keys: Vec<u16> = serde_json::from_value(change["pkeys"].clone()).unwrap();
    assert!(keys.contains(&0x8002), "{keys:?}");
    assert!(
        detected <= visible + 500,
        "detected {} ms after smpquery saw it",
        detected as i128 - visible as i128
    );
    eprintln!(
        "HUP -> smpquery sees key: {} ms; observer: {} ms",
        visible - hup,
        detected as i128 - hup as i128
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        watchers[1].2.try_recv().is_err(),
        "node2's table did not change, its observer must not report one"
    );
    for (node, mut process, _) in watchers {
        drop(process.stdin.take()); // EOF: the child exits normally
        let status = process.wait().unwrap();
        assert!(status.success(), "{node}: {status}");
    }
    assert_eq!(fabric.shim_litter().len(), 1, "{:?}", fabric.shim_litter());
}

#[test]
fn path_records_show_which_ports_share_a_partition() {
    let spec = rig::FabricSpec::new(2, 4);
    let Some(fabric) = rig::Fabric::start(&spec, rig::DEFAULT_PARTITIONS) else {
        return;
    };
    let (g1, g2) = (guid(&fabric, "node1"), guid(&fabric, "node2"));
    // Everyone a limited member of the default partition: only node1 and node2 share a key.
    fabric.set_partitions(&format!(
        "Default=0x7fff : ALL=limited, SELF=full ;\nt1=0x8001 : {g1}=full, {g2}=full ;\n"
    ));
    wait_for("node2 gets 0x8001", Duration::from_secs(10), || {
        fabric.pkeys("node2").contains(&0x8001)
    });
    let lid = |node: &str| fabric.port_info(node).lid;
    let port_guid = |node: &str| fabric.node_info(node).port_guid;
    let l1 = lid("node1");
    for (peer_node, expected) in [("node2", Some(0x8001u16)), ("node3", None)] {
        let peer = lid(peer_node);
        let sa = fabric.path_pkey("node1", l1, peer);
        assert_eq!(sa, expected, "saquery node1 -> LID {peer}");
        let ours = child_output(&fabric, "node1", "path", Some((peer, port_guid(peer_node))));
        assert_eq!(
            ours["pkey"],
            serde_json::json!(expected),
            "observer node1 -> LID {peer}"
        );
    }
}

#[test]
fn observer_reports_a_port_unlinked_in_ibsim_as_down() {
    let spec = rig::FabricSpec::new(2, 4);
    let Some(mut fabric) = rig::Fabric::start(&spec, rig::DEFAULT_PARTITIONS) else {
        return;
    };
    fabric.ibsim_console("Unlink \"node3\"").unwrap();
    wait_for("node3 down", Duration::from_secs(10), || {
        fabric.port_info("node3").state == "Down"
    });
    let inventory = inventory_of(&fabric, "node3");
    assert_eq!(inventory["ports"][0]["state"], "DOWN");
    fabric.ibsim_console("ReLink \"node3\"").unwrap();
    fabric.hup_opensm();
    wait_for("node3 active again", Duration::from_secs(10), || {
        fabric.port_info("node3").state == "Active"
    });
    assert_eq!(
        inventory_of(&fabric, "node3")["ports"][0]["state"],
        "ACTIVE"
    );
}
