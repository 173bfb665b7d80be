//! Operator edits through the agent (`operator_file`), on an ibsim fabric with a real OpenSM and
//! the SM-host agent: a broken edit of the operator's file never reaches OpenSM (node2's P_Key
//! table, polled with smpquery through the whole change, never shows 0xffff), `opensm check` and
//! `opensm apply` refuse it with its line (exit 65) and GetNode shows it; the fixed edit is
//! installed by `opensm apply` (exit 0) and reaches the live file. Skipped when ibsim/OpenSM are
//! not installed.

use testkit::common;
use testkit::rig;

use common::process::{wait_timeout, BIN};
use common::sm_requests::set_memberships;
use common::{free_port, node, wait_until, CONVERGE};
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use rig::agents::{sm_config, Agent};
use rig::{parse_pkeys, Fabric, FabricSpec, UMAD2SIM};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const OPERATOR: &str = "# operator's partitions\n\
Default=0x7fff : ALL=limited, SELF=full ;\n\
storage=0x0100, ipoib : ALL_SWITCHES=full, SELF=full ;\n";

/// Runs `fabric-agent --config <config> <args>`: its exit code and output.
fn run(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = config.with_extension("run.out");
    let file = std::fs::File::create(&out).unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("fabric-agent {args:?} did not exit");
    };
    (status.code(), std::fs::read_to_string(&out).unwrap())
}

/// Polls node2's P_Key table with smpquery until `stop`: counts the polls and the tables that
/// held 0xffff (node2 a full member of the default partition: OpenSM fell back to ALL=full).
fn poll_node2(
    dir: std::path::PathBuf,
    sock: String,
    stop: Arc<AtomicBool>,
    polls: Arc<AtomicUsize>,
    full: Arc<AtomicUsize>,
) {
    while !stop.load(Ordering::SeqCst) {
        let out = Command::new("smpquery")
            .args(["-D", "pkeys", "0", "1"])
            .env("LD_PRELOAD", UMAD2SIM)
            .env("SIM_HOST", "node2")
            .env("IBSIM_SOCKNAME", &sock)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output();
        if let Ok(out) = out {
            if out.status.success() {
                polls.fetch_add(1, Ordering::SeqCst);
                if parse_pkeys(&String::from_utf8_lossy(&out.stdout)).contains(&0xffff) {
                    full.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_operator_file_never_reaches_opensm_and_is_refused_with_its_line() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let d = fabric.dir().to_owned();
    let op = d.join("partitions.operator.conf");
    std::fs::write(&op, OPERATOR).unwrap();
    let port = free_port();
    let config_text = sm_config(&fabric, port).replace(
        "[subnet_manager.opensm]\n",
        &format!(
            "[subnet_manager.opensm]\noperator_file = \"{}\"\nwatch_ms = 200\n",
            op.display()
        ),
    );
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &config_text);
    let mut client = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let g1 = fabric.node_info("node1").port_guid;
    client
        .set_node_memberships(set_memberships("node1", &[g1], &[0x0a51], 1))
        .await
        .unwrap();
    wait_until("0x8a51 on node1", CONVERGE, || async {
        fabric.pkeys("node1").contains(&0x8a51)
    })
    .await;
    let live_before = std::fs::read_to_string(fabric.partitions_path()).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicUsize::new(0));
    let full = Arc::new(AtomicUsize::new(0));
    let poller = {
        let (dir, sock) = (d.clone(), fabric.sock_name().to_owned());
        let (stop, polls, full) = (stop.clone(), polls.clone(), full.clone());
        std::thread::spawn(move || poll_node2(dir, sock, stop, polls, full))
    };

    // The operator's broken edit: refused by check and apply with its line, never installed.
    let line = "oops=0x0c0c : 0xzz ;";
    let broken = OPERATOR.replacen("storage=0x0100", &format!("{line}\nstorage=0x0100"), 1);
    std::fs::write(&op, &broken).unwrap();
    let (code, out) = run(&sm.config, &["opensm", "check", op.to_str().unwrap()]);
    assert_eq!(code, Some(65), "{out}");
    assert!(out.contains("line 3") && out.contains(line), "{out}");
    let (code, out) = run(&sm.config, &["opensm", "apply"]);
    assert_eq!(code, Some(65), "{out}");
    assert!(
        out.contains(line) && out.contains("nothing was written"),
        "{out}"
    );
    // The daemon's own commits keep the previous operator part and show the refusal.
    let g2 = fabric.node_info("node2").port_guid;
    client
        .set_node_memberships(set_memberships("node2", &[g2], &[0x0b52], 1))
        .await
        .unwrap();
    wait_until("0x8b52 on node2", CONVERGE, || async {
        fabric.pkeys("node2").contains(&0x8b52)
    })
    .await;
    let live = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(!live.contains("oops"), "{live}");
    assert!(live.starts_with(OPERATOR), "{live}");
    wait_until("the refusal shown in GetNode", CONVERGE, || async {
        let mut c = sm.client().await;
        node(&mut c)
            .await
            .conditions
            .iter()
            .any(|c| c.kind == "PARTITIONS_FILE_REJECTED" && c.detail.contains(line))
    })
    .await;
    // OpenSM re-reads the live file on its own sweeps too: still nothing broken reaches it.
    fabric.hup_opensm();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The fixed edit is installed by apply and confirmed by OpenSM.
    let fixed = OPERATOR.replacen(
        "storage=0x0100",
        "extra=0x0c0c : ALL_SWITCHES=full ;\nstorage=0x0100",
        1,
    );
    std::fs::write(&op, &fixed).unwrap();
    let (code, out) = run(&sm.config, &["opensm", "check", op.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(&sm.config, &["opensm", "apply"]);
    assert_eq!(code, Some(0), "{out}");
    let live = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(live.starts_with(&fixed), "{live}");
    assert!(live.contains("0x0b52"), "the region was kept: {live}");
    wait_until("the refusal cleared", CONVERGE, || async {
        let mut c = sm.client().await;
        !node(&mut c)
            .await
            .conditions
            .iter()
            .any(|c| c.kind == "PARTITIONS_FILE_REJECTED")
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    let (polls, full) = (polls.load(Ordering::SeqCst), full.load(Ordering::SeqCst));
    eprintln!("node2 polled {polls} times, 0xffff seen {full} times");
    assert!(polls >= 10, "only {polls} polls");
    assert_eq!(full, 0, "node2 became a full default member");
    assert!(!fabric.opensm_log().contains("PARSE ERROR"));
    assert_ne!(live_before, live);
    assert!(sm.stop().success());
}
