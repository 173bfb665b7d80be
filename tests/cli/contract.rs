//! The operator's contract, with the real binary as a child process: exit codes a script can
//! trust, P_Keys parsed as InfiniBand tools write them, one membership per key per node, a
//! daemon that guards its socket and survives SIGHUP.

use testkit::common;

use common::process::ChildGuard;
use common::*;

fn attach_args<'a>(instance: &'a str, pkey: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "attach",
        "--instance",
        instance,
        "--partition",
        "ibpart_a",
        "--name",
        "a",
        "--workspace",
        "ws",
        "--account",
        "acct",
        "--pkey",
        pkey,
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn exit_codes_and_pkey_syntax() {
    let mut d = Daemon::start_with_fault(None, "", "");
    let fault = d.fault_file();
    let sock = d.socket.clone();

    // P_Keys: hex with or without 0x, never decimal; a bad one is a usage error (2) that says
    // what was understood, and nothing reaches the daemon.
    for (bad, says) in [
        ("0x8a12", "0x0a12"),
        ("12345", "hex digits"),
        ("18z", "hex digits"),
        ("7fff", "default partition"),
    ] {
        let o = cli(&sock, &attach_args("i-bad", bad, &[]));
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{bad}: {}", stderr(&o));
    }
    let o = cli(&sock, &["attachments", "--json"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");

    // Bare hex is hex: "0a12" is P_Key 0x0a12, and the attach reaches ACTIVE: exit 0.
    let o = cli(
        &sock,
        &attach_args(
            "i-1",
            "0a12",
            &["--wait", "10", "--json", "--port", "sim0/1"],
        ),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("\"0x8a12\"") || out.contains("0x8a12"),
        "{out}"
    );

    // A second instance of the partition with another membership: refused (1), naming i-1.
    let o = cli(&sock, &attach_args("i-2", "0x0a12", &["--limited"]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("FAILED_PRECONDITION"), "{}", stderr(&o));
    assert!(stderr(&o).contains("i-1"), "{}", stderr(&o));

    // The SM is unreachable: --wait expires with 75 and the state and reason are printed.
    std::fs::write(&fault, "unreachable").unwrap();
    // (On the other port: a port carries one partition at a time.)
    let mut other = attach_args("i-3", "0x0b00", &["--wait", "2", "--port", "sim0/2"]);
    other[4] = "ibpart_b";
    let o = cli(&sock, &other);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("PENDING"), "{}", stderr(&o));
    assert!(stderr(&o).contains("unavailable"), "{}", stderr(&o));
    let o = cli(&sock, &["release", "--instance", "i-1", "--wait", "2"]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(stderr(&o).contains("RELEASING"), "{}", stderr(&o));
    std::fs::write(&fault, "").unwrap();
    let o = cli(&sock, &["release", "--instance", "i-1", "--wait", "20"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A refused call: 1 with the code spelled as in the API docs.
    let o = cli(&sock, &["release", "--instance", "nobody"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("NOT_FOUND"), "{}", stderr(&o));

    // SIGHUP never ends the daemon.
    nix::sys::signal::kill(d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let o = cli(&sock, &["node"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "alive after SIGHUP: {}",
        stderr(&o)
    );
    assert!(d.log().contains("SIGHUP"), "{}", d.log());

    // A second daemon (its own state) on the same socket is refused; the first keeps serving.
    let tmp2 = tempfile::tempdir().unwrap();
    let config2 = tmp2.path().join("config.toml");
    std::fs::write(
        &config2,
        format!(
            "node_id = \"node2\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
            tmp2.path().join("state").display(),
            sock.display()
        ),
    )
    .unwrap();
    let o = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&config2)
        .arg("serve")
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("another fabric-agent is serving"),
        "{}",
        stderr(&o)
    );
    let o = cli(&sock, &["node"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(d.stop().success());

    // The daemon is gone: 69.
    let o = cli(&sock, &["node"]);
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    // A broken configuration: 64.
    std::fs::write(&config2, "fabric = \n").unwrap();
    let o = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&config2)
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
}

#[test]
fn the_socket_is_recreated_output_fits_and_json_has_one_shape_per_command() {
    let mut d = Daemon::start("");
    let sock = d.socket.clone();

    // The client takes the socket from --config (no --socket given).
    let o = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&d.config)
        .args(["node", "-o", "json"])
        .env_remove("FABRIC_AGENT_SOCKET")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let node: serde_json::Value = serde_json::from_slice(&o.stdout).expect("node JSON");
    assert_eq!(node["node_id"], "node1");

    // attach/release --json: one object; attachments: one array; events: one object per line.
    let o = cli(
        &sock,
        &attach_args(
            "instance-with-a-rather-long-identifier-0001",
            "0a12",
            &["--wait", "10", "--json"],
        ),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let a: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("attach JSON");
    assert!(a.is_object(), "{a}");
    assert_eq!(a["state"], "ACTIVE");
    assert_eq!(a["membership"], "full");
    let o = cli(&sock, &["attachments", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    let o = cli(&sock, &["events", "--json"]);
    let events: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert!(events.len() >= 2, "{events:?}");
    let first = &events[0]["detail"];
    assert!(
        first.get("from").is_none(),
        "first event has no from: {first}"
    );
    assert!(!stdout(&o).contains("UNSPECIFIED"));

    // Tables: a MEMBERSHIP column, every line within 100 columns.
    let o = cli(&sock, &["attachments"]);
    let table = stdout(&o);
    assert!(
        table.lines().next().unwrap().contains("MEMBERSHIP"),
        "{table}"
    );
    let o = cli(&sock, &["events"]);
    let events_table = stdout(&o);
    assert!(events_table.lines().count() >= 3, "{events_table}");
    for line in table.lines().chain(events_table.lines()) {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
    }

    // A cursor beyond the log's end: OUT_OF_RANGE (1), said in the CLI's terms.
    let o = cli(&sock, &["events", "--after", "100000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("OUT_OF_RANGE"), "{}", stderr(&o));
    assert!(stderr(&o).contains("--after"), "{}", stderr(&o));

    // Connection flags mean nothing to serve: a usage error, not silently ignored.
    let o = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&d.config)
        .args(["serve", "--socket", "/tmp/elsewhere.sock"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--socket"), "{}", stderr(&o));

    // The socket deleted while the daemon runs: re-created, logged, answering again.
    std::fs::remove_file(&sock).unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(5), || sock.exists()),
        "socket not re-created: {}",
        d.log()
    );
    let o = cli(&sock, &["node"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(d.log().contains("re-created"), "{}", d.log());
    let o = cli(
        &sock,
        &[
            "release",
            "--instance",
            "instance-with-a-rather-long-identifier-0001",
            "--wait",
            "10",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(d.stop().success());
    assert!(!sock.exists(), "its own socket is removed on exit");
}

#[test]
fn a_stopping_agent_answers_waiting_calls_at_once() {
    let mut d = Daemon::start_with_fault(Some("unreachable"), "", "");
    let waiting = std::process::Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(attach_args("i-1", "0x0a12", &["--wait", "60"]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The attach is stored (PENDING: the SM is unreachable) and its caller waits.
    assert!(eventually(std::time::Duration::from_secs(10), || {
        let o = cli(&d.socket, &["attachments", "--json"]);
        stdout(&o).contains("PENDING")
    }));
    let started = std::time::Instant::now();
    assert!(d.stop().success());
    let o = waiting.wait_with_output().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the wait held the drain for {:?}",
        started.elapsed()
    );
    assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
    assert!(stderr(&o).contains("agent stopping"), "{}", stderr(&o));
    assert!(stderr(&o).contains("PENDING"), "{}", stderr(&o));
}

#[test]
fn check_config_runs_the_checks_serve_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    let check = |json: bool| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.arg("--config").arg(&config).arg("check-config");
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let serve = || {
        std::process::Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("FABRIC_AGENT_LOG", "error")
            .output()
            .unwrap()
    };
    let state = tmp.path().join("state");
    // A state directory under a regular file can be neither found nor created.
    let not_a_dir = tmp.path().join("a-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let long_socket = tmp.path().join(format!("{}/agent.sock", "s".repeat(110)));
    let cases = [
        (
            format!(
                "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
                state.display(),
                long_socket.display()
            ),
            "at most 107",
        ),
        (
            format!(
                "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\ntcp = \"127.0.0.1:0\"\n\
                 [listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nallowed_clients = [\"dns:cp\"]\n",
                state.display(),
                tmp.path().join("agent.sock").display(),
                tmp.path().join("missing-cert.pem").display(),
                tmp.path().join("missing-key.pem").display(),
                tmp.path().join("missing-ca.pem").display(),
            ),
            "missing-cert.pem",
        ),
        (
            format!(
                "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
                not_a_dir.join("state").display(),
                tmp.path().join("agent.sock").display()
            ),
            "state_dir",
        ),
    ];
    for (text, says) in cases {
        std::fs::write(&config, &text).unwrap();
        let o = check(false);
        assert_eq!(o.status.code(), Some(64), "{text}\n{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{says}: {}", stderr(&o));
        let o = check(true);
        assert_eq!(o.status.code(), Some(64));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("check-config --json");
        assert_eq!(v["ok"], false);
        assert!(
            v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["ok"] == false),
            "{v}"
        );
        // serve refuses the same configuration with the same code, before binding anything.
        let o = serve();
        assert_eq!(o.status.code(), Some(64), "{text}\n{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{says}: {}", stderr(&o));
    }
    std::fs::write(
        &config,
        format!(
            "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
            state.display(),
            tmp.path().join("agent.sock").display()
        ),
    )
    .unwrap();
    let o = check(true);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert!(!state.exists(), "check-config creates nothing");
}

#[test]
fn sighup_reloads_the_log_filter_and_never_ends_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("agent.sock");
    let config = tmp.path().join("config.toml");
    let text = |filter: &str| {
        format!(
            "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n[log]\nfilter = \"{filter}\"\n",
            tmp.path().join("state").display(),
            socket.display()
        )
    };
    std::fs::write(&config, text("warn")).unwrap();
    let log = tmp.path().join("daemon.log");
    // Started by hand (the harness pins FABRIC_AGENT_LOG); killed by pid if the test fails.
    let mut child = ChildGuard::new(
        "daemon",
        std::process::Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env_remove("FABRIC_AGENT_LOG")
            .env("FABRIC_AGENT_LOG_JSON", "0")
            .env_remove("NOTIFY_SOCKET")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(eventually(std::time::Duration::from_secs(20), || {
        cli(&socket, &["node"]).status.success()
    }));
    // [log] filter = "warn": the info-level "ready" line is not written; no JSON, no ANSI.
    assert!(!read().contains("ready"), "{}", read());
    std::fs::write(&config, text("info")).unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(5), || read()
            .contains("log filter reloaded")),
        "{}",
        read()
    );
    // A config that no longer validates changes nothing, and the daemon stays.
    std::fs::write(&config, "fabric = \n").unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(5), || read()
            .contains("does not validate")),
        "{}",
        read()
    );
    assert!(cli(&socket, &["node"]).status.success());
    let logged = read();
    assert!(
        !logged.contains('\u{1b}'),
        "no ANSI in a redirected log: {logged}"
    );
    assert!(!logged.trim_start().starts_with('{'), "not JSON: {logged}");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(child.wait().success());
}

#[test]
fn a_second_agent_on_the_same_state_directory_is_told_who_holds_it() {
    let mut d = Daemon::start("");
    let other = d.dir.join("other.toml");
    std::fs::write(
        &other,
        format!(
            "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
            d.dir.join("state").display(),
            d.dir.join("other.sock").display()
        ),
    )
    .unwrap();
    let o = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&other)
        .arg("serve")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("another fabric-agent holds the state directory"),
        "{}",
        stderr(&o)
    );
    assert!(d.stop().success());
}
