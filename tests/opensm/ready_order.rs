//! READY=1 (sd_notify) of an SM-host agent with peers comes only after its catch-up: here the
//! peer accepts connections and never answers, so the catch-up ends at its timeout (2 s); READY
//! arrives no earlier, after the log's `SM host start: peers pulled`, with the `ready` line
//! logged after it, and SM_HOST_NOT_CAUGHT_UP stands, naming the peer. Skipped when
//! ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::{free_port, wait_until};
use rig::ha::{ha_sm_config, SmFiles};
use rig::{agents::BIN, Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_comes_after_the_catch_up_or_its_timeout_with_a_standing_condition() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 1), LIMITED_DEFAULT_PARTITIONS) else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    // A peer that takes the connection and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let peer = silent.local_addr().expect("addr").port();
    let files = SmFiles {
        partitions: &fabric.partitions_path(),
        log: &fabric.opensm_log_path(),
        pid: &fabric.opensm_pid_path(),
        metrics: free_port(),
    };
    let config = ha_sm_config(&fabric, "smhost", free_port(), &files, &[peer])
        .replace("catch_up_timeout_ms = 5000", "catch_up_timeout_ms = 2000");
    assert!(config.contains("catch_up_timeout_ms = 2000"));
    let dir = fabric.dir();
    let path = dir.join("smhost.toml");
    std::fs::write(&path, config).expect("config");
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let log_path = dir.join("smhost-agent.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .arg("serve")
        .env("NOTIFY_SOCKET", &notify_path)
        .env_remove("WATCHDOG_USEC")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("spawn the agent");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let mut buf = [0u8; 4096];
    let (ready_after, log_at_ready) = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60)
                && child.try_wait().expect("wait").is_none(),
            "no READY: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        if let Ok(n) = notify.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "READY=1")
            {
                break (
                    started.elapsed(),
                    std::fs::read_to_string(&log_path).unwrap_or_default(),
                );
            }
        }
    };
    eprintln!("READY=1 after {ready_after:?}");
    assert!(
        ready_after >= Duration::from_secs(2),
        "{ready_after:?}\n{log_at_ready}"
    );
    let pulled = log_at_ready
        .find("SM host start: peers pulled")
        .unwrap_or_else(|| panic!("READY before the catch-up ended:\n{log_at_ready}"));
    let ready_line = log_at_ready
        .find("\"ready\"")
        .or_else(|| log_at_ready.find(" ready "));
    assert!(
        ready_line.is_some_and(|r| r > pulled),
        "the ready line before the catch-up:\n{log_at_ready}"
    );
    let socket = dir.join("smhost.sock");
    wait_until(
        "SM_HOST_NOT_CAUGHT_UP stands",
        Duration::from_secs(30),
        || async {
            let node = rig::process::client(&socket)
                .await
                .get_node(fabric_agent::proto::agent::GetNodeRequest {})
                .await
                .expect("GetNode")
                .into_inner();
            node.conditions.iter().any(|c| {
                c.kind == "SM_HOST_NOT_CAUGHT_UP" && c.detail.contains(&format!("127.0.0.1:{peer}"))
            })
        },
    )
    .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    assert!(child.wait().expect("wait").success());
    drop(silent);
}
