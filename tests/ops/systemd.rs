//! systemd integration: the unit passes `systemd-analyze verify`, and the daemon speaks the
//! notify protocol on a real NOTIFY_SOCKET: READY=1 only once it serves, WATCHDOG=1 while the
//! reconciler runs, STOPPING=1 on SIGTERM, then exit 0.

use testkit::common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

#[test]
fn unit_file_passes_systemd_analyze_verify() {
    let Ok(out) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    else {
        return skip("systemd-analyze not installed");
    };
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string("systemd/fabric-agent.service").unwrap();
    // Point ExecStart at the binary under test; everything else is verified as shipped.
    let unit = unit.replace("/usr/bin/fabric-agent", BIN);
    let path = dir.path().join("fabric-agent.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let relevant: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("fabric-agent.service"))
        .collect();
    assert!(
        out.status.success() && relevant.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

fn recv(sock: &UnixDatagram, deadline: Instant) -> Option<String> {
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    None
}

#[test]
fn notify_protocol_ready_watchdog_stopping() {
    let tmp = tempfile::tempdir().unwrap();
    let notify_path = tmp.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    let mut d = Daemon::prepare(tmp.path(), "");
    let notify = notify_path.to_str().unwrap().to_owned();
    // 1 s watchdog: the daemon pets every 0.5 s.
    d.spawn(&[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "1000000")]);

    let deadline = Instant::now() + Duration::from_secs(10);
    let first = recv(&sock, deadline).expect("a notify message");
    assert!(
        first.lines().any(|l| l == "READY=1"),
        "first message is READY: {first:?}"
    );
    assert!(first.lines().any(|l| l.starts_with("STATUS=")), "{first:?}");
    // READY means the socket answers.
    assert!(std::os::unix::net::UnixStream::connect(&d.socket).is_ok());

    let mut pets = 0;
    let until = Instant::now() + Duration::from_millis(2200);
    while let Some(m) = recv(&sock, until) {
        pets += m.lines().filter(|l| *l == "WATCHDOG=1").count();
    }
    assert!(
        pets >= 3,
        "expected a WATCHDOG=1 every 0.5 s, got {pets} in 2.2 s"
    );

    let pid = d.pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut stopping = false;
    let until = Instant::now() + Duration::from_secs(10);
    while let Some(m) = recv(&sock, until) {
        if m.lines().any(|l| l == "STOPPING=1") {
            stopping = true;
            break;
        }
    }
    assert!(stopping, "STOPPING=1 after SIGTERM");
    assert!(d.stop_after_signal().success(), "exit 0 after draining");
}

#[test]
fn a_slow_apply_longer_than_the_watchdog_keeps_the_pets_coming() {
    let tmp = tempfile::tempdir().unwrap();
    let notify_path = tmp.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    // Every apply takes 4 s: four times the 1 s WatchdogSec. A slow SM is not a wedged agent,
    // and systemd must not kill it mid-apply.
    let (extra, _) = fault_config(tmp.path(), Some("slow 4000"), "");
    let mut d = Daemon::prepare(tmp.path(), &extra);
    let notify = notify_path.to_str().unwrap().to_owned();
    d.spawn(&[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "1000000")]);
    let first = recv(&sock, Instant::now() + Duration::from_secs(10)).expect("READY");
    assert!(first.lines().any(|l| l == "READY=1"), "{first:?}");
    // The start-up apply is in progress now; count pets over the next 3 s, all inside it.
    let mut pets = 0;
    let mut gaps = Vec::new();
    let mut last = Instant::now();
    let until = Instant::now() + Duration::from_secs(3);
    while let Some(m) = recv(&sock, until) {
        if m.lines().any(|l| l == "WATCHDOG=1") {
            pets += 1;
            gaps.push(last.elapsed());
            last = Instant::now();
        }
    }
    assert!(pets >= 4, "{pets} pets in 3 s of a slow apply: {gaps:?}");
    assert!(
        gaps.iter().all(|g| *g < Duration::from_secs(1)),
        "no gap reaches WatchdogSec: {gaps:?}"
    );
    d.stop();
}
