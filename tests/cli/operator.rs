//! The operator's view, as a contract with the real binary: each test names the command, the
//! exit code and the line or field that must appear (issue points in brackets).

use testkit::common;

use common::*;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// `fabric-agent --config <config> <args>`, with the given environment.
fn with_config(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(config).args(args);
    cmd.env_remove("FABRIC_AGENT_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run fabric-agent")
}

/// A minimal config in `dir` (own socket and state) with `extra` appended.
fn write_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n{extra}\n[listen]\nunix_socket = \"{}\"\n",
            dir.join("state").display(),
            dir.join("agent.sock").display()
        ),
    )
    .unwrap();
    config
}

fn attach<'a>(instance: &'a str, pkey: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "attach",
        "--instance",
        instance,
        "--partition",
        "ibpart_a",
        "--name",
        "train-a",
        "--workspace",
        "ml-team",
        "--account",
        "acme",
        "--pkey",
        pkey,
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn config_errors_are_exit_64_and_name_the_value() {
    let tmp = tempfile::tempdir().unwrap();
    // [1] A log filter that would silence the daemon: check-config and serve exit 64, naming
    // the value and the valid levels.
    for bad in ["warning", "debugg", "info,fabric_agent=debugg"] {
        let config = write_config(tmp.path(), &format!("[log]\nfilter = \"{bad}\"\n"));
        for cmd in ["check-config", "serve"] {
            let o = with_config(&config, &[cmd], &[]);
            assert_eq!(o.status.code(), Some(64), "{cmd} {bad}: {}", stderr(&o));
            assert!(stderr(&o).contains("log.filter"), "{}", stderr(&o));
            assert!(
                stderr(&o).contains("valid: trace, debug, info, warn, error, off"),
                "{}",
                stderr(&o)
            );
        }
    }
    // [1] A broken FABRIC_AGENT_LOG: a loud warning naming it, and the command still works.
    let config = write_config(tmp.path(), "");
    let o = with_config(
        &config,
        &["check-config"],
        &[("FABRIC_AGENT_LOG", "warning")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: FABRIC_AGENT_LOG ignored: \"warning\""),
        "{}",
        stderr(&o)
    );
    // [6] [metrics] listen without enabled = true: an error, not a silent no-op.
    let config = write_config(tmp.path(), "[metrics]\nlisten = \"127.0.0.1:9999\"\n");
    let o = with_config(&config, &["check-config"], &[]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("metrics.enabled"), "{}", stderr(&o));
    assert!(stderr(&o).contains("enabled = true"), "{}", stderr(&o));
    // [9] A store file the daemon cannot open: check-config catches it, so serve is 64 too.
    let config = write_config(tmp.path(), "");
    std::fs::create_dir_all(tmp.path().join("state/state.redb")).unwrap();
    for cmd in ["check-config", "serve"] {
        let o = with_config(&config, &[cmd], &[]);
        assert_eq!(o.status.code(), Some(64), "{cmd}: {}", stderr(&o));
        assert!(stderr(&o).contains("state.redb"), "{cmd}: {}", stderr(&o));
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    }
    // [10] check-config --json: the verdict shape doctor --json uses; backend lowercase.
    let o = with_config(&config, &["check-config", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verdict"], "FAIL", "{v}");
    let failed = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["ok"] == false)
        .expect("a failed check");
    assert_eq!(failed["verdict"], "FAIL", "{v}");
    std::fs::remove_dir(tmp.path().join("state/state.redb")).unwrap();
    let o = with_config(&config, &["check-config"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("backend embedded"), "{}", stdout(&o));
    assert!(stderr(&o).contains("warning: grants:"), "{}", stderr(&o));
}

#[test]
fn a_daemon_that_cannot_read_its_ports_still_answers() {
    // [3] The observer's root does not exist: the socket is bound and served anyway; `node`
    // answers (0) and says no port was read; the log says why.
    let tmp = tempfile::tempdir().unwrap();
    let extra = format!(
        "[observer]\nkind = \"sysfs\"\nsysfs_root = \"{}\"\n",
        tmp.path().join("no-sysfs").display()
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
    let o = cli(&d.socket, &["node"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("ports: none read"), "{}", stdout(&o));
    // [3] ... and names it as a standing condition, with the read's error.
    assert!(
        eventually(Duration::from_secs(10), || stdout(&cli(
            &d.socket,
            &["node"]
        ))
        .contains("CONDITION PORTS_UNREADABLE: the last port read failed")),
        "{}",
        stdout(&cli(&d.socket, &["node"]))
    );
    let o = with_config(&d.config, &["doctor"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("OK    daemon"), "{}", stdout(&o));
    assert!(stdout(&o).contains("FAIL  observer"), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("FAIL  condition PORTS_UNREADABLE"),
        "{}",
        stdout(&o)
    );
    assert!(
        d.log().contains("cannot read the ports; serving anyway"),
        "{}",
        d.log()
    );
    assert!(d.stop().success());
}

#[test]
fn views_wrap_carry_every_field_and_spell_each_value_once() {
    let refusal = "partition ibpart_a is owned by another tenant in the fabric manager and \
                   cannot be programmed on this node until the owner releases it";
    // A short backoff cap: a cleared fault is retried within a second.
    let mut d = Daemon::start_with_fault(
        Some(&format!("refuse {refusal}")),
        "",
        "[reconciler]\nbackoff_max_ms = 500\n",
    );
    let sock = d.socket.clone();
    let long = "instance-with-a-rather-long-identifier-0001";
    // [12] --wait takes human durations; the refusal keeps it PENDING: 75.
    let o = cli(&sock, &attach(long, "0a12", &["--wait", "2s"]));
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    // [2] The SM answered and refused: the node view says REFUSED and why, not UNREACHABLE.
    assert!(eventually(Duration::from_secs(10), || {
        stdout(&cli(&sock, &["node"])).contains("REFUSED (it answered and said no)")
    }));
    let node = stdout(&cli(&sock, &["node"]));
    assert!(!node.contains("UNREACHABLE"), "{node}");
    assert!(node.contains("owner releases it"), "{node}");
    // [7] Nothing is cut: every line fits 100 columns and the whole reason is there.
    let table = stdout(&cli(&sock, &["attachments"]));
    let events = stdout(&cli(&sock, &["events"]));
    for text in [&node, &table, &events] {
        assert!(!text.contains('…'), "{text}");
        for line in text.lines() {
            assert!(
                line.chars().count() <= 100,
                "{} columns: {line}",
                line.chars().count()
            );
        }
    }
    let joined = table.split_whitespace().collect::<Vec<_>>().join(" ");
    let wanted = refusal.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(joined.contains(&wanted), "{table}");
    let joined = events.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains(&format!("{long} ibpart_a 0x8a12 PENDING")),
        "{events}"
    );
    // [7] -o wide adds columns.
    let wide = stdout(&cli(&sock, &["attachments", "-o", "wide"]));
    assert!(wide.lines().next().unwrap().contains("UPDATED"), "{wide}");
    let wide = stdout(&cli(&sock, &["node", "-o", "wide"]));
    assert!(wide.contains("NODE_GUID"), "{wide}");
    // The fault is cleared: ACTIVE.
    std::fs::write(d.fault_file(), "").unwrap();
    let o = cli(&sock, &["get", long, "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(eventually(Duration::from_secs(20), || {
        stdout(&cli(&sock, &["get", long, "-o", "json"])).contains("\"ACTIVE\"")
    }));
    // [12] get: one attachment (0); an unknown one: 1 and "not found".
    let o = cli(&sock, &["get", long]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("0x8a12"), "{}", stdout(&o));
    let o = cli(&sock, &["get", "nope"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    // [8] JSON carries every field: log_epoch in node and events, evidence of ACTIVE.
    let node: serde_json::Value =
        serde_json::from_slice(&cli(&sock, &["node", "-o", "json"]).stdout).unwrap();
    let epoch = node["log_epoch"].as_str().unwrap().to_owned();
    assert!(!epoch.is_empty(), "{node}");
    assert!(
        node["subnet_manager"]["last_apply"].as_str().is_some(),
        "{node}"
    );
    let events: Vec<serde_json::Value> = stdout(&cli(&sock, &["events", "-o", "json"]))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events.iter().all(|e| e["log_epoch"] == epoch.as_str()));
    let active = events
        .iter()
        .find(|e| e["detail"]["to"] == "ACTIVE")
        .expect("an ACTIVE event");
    assert!(
        active["detail"]["evidence"]["sm_generation"]
            .as_u64()
            .unwrap()
            > 0,
        "{active}"
    );
    assert!(!active["detail"]["evidence"]["ports"]
        .as_array()
        .unwrap()
        .is_empty());
    // [10] doctor: LIDs decimal as in node, backend lowercase, the check-config verdict shape.
    let o = with_config(&d.config, &["doctor"], &[]);
    let text = stdout(&o);
    assert!(text.contains("LID 2, SM LID 1"), "{text}");
    assert!(!text.contains("LID 0x"), "{text}");
    assert!(
        text.contains("embedded: REACHABLE: last apply acknowledged"),
        "{text}"
    );
    let o = with_config(&d.config, &["doctor", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verdict"], "OK", "{v}");
    for c in v["checks"].as_array().unwrap() {
        assert!(c["verdict"].is_string() && c["ok"].is_boolean(), "{c}");
    }
    assert!(d.stop().success());
}

#[test]
fn exit_codes_for_permission_usage_and_help() {
    let d = Daemon::start("");
    // [9] EACCES on the socket: 77, not 69 (the daemon is healthy).
    if nix::unistd::Uid::effective().is_root() {
        use std::os::unix::process::CommandExt;
        let o = Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .arg("node")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(77), "{}", stderr(&o));
        assert!(stderr(&o).contains("Permission denied"), "{}", stderr(&o));
    } else {
        common::skip::skip("EACCES needs another user: run as root to switch to nobody");
    }
    // [9] A bad --state: 2, listing the valid states.
    let o = cli(&d.socket, &["attachments", "--state", "bogus"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("pending, programming, active"),
        "{}",
        stderr(&o)
    );
    let o = cli(&d.socket, &["attachments", "--state", "ACTIVE"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // [12] --pkey 0x8000 says it is only the membership bit; --wait soon is a usage error.
    let o = cli(&d.socket, &attach("i-1", "0x8000", &[]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("only the full-membership bit"),
        "{}",
        stderr(&o)
    );
    assert!(
        !stderr(&o).contains("give the base 0x0000"),
        "{}",
        stderr(&o)
    );
    let o = cli(
        &d.socket,
        &["release", "--instance", "i-1", "--wait", "soon"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("30s, 5m"), "{}", stderr(&o));
    // [12] Help lists only the options a command accepts; the exit codes in one table.
    let help = |args: &[&str]| stdout(&Command::new(BIN).args(args).output().unwrap());
    for local in ["serve", "check-config", "ports", "doctor"] {
        let h = help(&[local, "--help"]);
        assert!(!h.contains("--endpoint <"), "{local}: {h}");
        assert!(!h.contains("--tls-domain <"), "{local}: {h}");
    }
    assert!(help(&["node", "--help"]).contains("--endpoint <"));
    let h = help(&["--help"]);
    assert!(h.contains("77  permission denied"), "{h}");
    assert!(h.contains("-o wide") || h.contains("wide:"), "{h}");
}

#[test]
fn man_pages_for_every_subcommand_and_the_config_file() {
    // [12] The pages the main page names exist, and fabric-agent.toml(5) lists the keys.
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let main = std::fs::read_to_string(tmp.path().join("fabric-agent.1")).unwrap();
    for sub in ["serve", "get", "attach", "grant-sign"] {
        assert!(
            tmp.path().join(format!("fabric-agent-{sub}.1")).exists(),
            "{sub}"
        );
    }
    assert!(main.contains("fabric\\-agent\\-serve(1)"));
    let toml5 = std::fs::read_to_string(tmp.path().join("fabric-agent.toml.5")).unwrap();
    for key in ["unix_socket", "filter", "allow_remote", "backoff_max_ms"] {
        assert!(toml5.contains(&key.replace('-', "\\-")), "{key}");
    }
}

#[test]
fn sighup_names_what_changed_and_ready_names_the_metrics_address() {
    let port = net::free_port();
    let metrics = format!("[metrics]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\n");
    let mut d = Daemon::start(&metrics);
    // [6] The start-up log names the metrics address.
    let wanted = format!("metrics=http://127.0.0.1:{port}/metrics");
    assert!(
        eventually(Duration::from_secs(5), || d.log().contains(&wanted)),
        "{}",
        d.log()
    );
    // [12] SIGHUP: the changed settings, applied or needing a restart.
    let text = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(&d.config, format!("{text}\n[events]\nretain = 5000\n")).unwrap();
    nix::sys::signal::kill(d.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || d
            .log()
            .contains("NOT applied until a restart")),
        "{}",
        d.log()
    );
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("NOT applied until a restart"))
        .unwrap();
    assert!(line.contains("events"), "{line}");
    assert!(!line.contains("metrics"), "{line}");
    assert!(d.stop().success());
}

#[test]
fn no_color_is_honoured_on_a_terminal() {
    // [12] On a terminal the log is coloured, unless NO_COLOR is set. `script` gives the
    // command a pseudo-terminal; the config fails its checks, so `serve` logs and exits 64.
    if Command::new("script").arg("--version").output().is_err() {
        common::skip::skip("script (util-linux) is needed for a pseudo-terminal");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a-file"), b"").unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
            tmp.path().join("a-file/state").display(),
            tmp.path().join("agent.sock").display()
        ),
    )
    .unwrap();
    let on_a_terminal = |no_color: Option<&str>| {
        let mut cmd = Command::new("script");
        cmd.args([
            "-qec",
            "\"$FA_BIN\" --config \"$FA_CONFIG\" serve",
            "/dev/null",
        ])
        .env("FA_BIN", BIN)
        .env("FA_CONFIG", &config)
        .env("FABRIC_AGENT_LOG", "info")
        .env_remove("NO_COLOR")
        .env_remove("JOURNAL_STREAM");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let o = cmd.output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let coloured = on_a_terminal(None);
    assert!(coloured.contains("configuration"), "{coloured}");
    assert!(
        coloured.contains('\u{1b}'),
        "a terminal gets colours: {coloured:?}"
    );
    let plain = on_a_terminal(Some("1"));
    assert!(plain.contains("configuration"), "{plain}");
    assert!(!plain.contains('\u{1b}'), "NO_COLOR=1: {plain:?}");
}

/// One scrape of the metrics endpoint on `port`: the body.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// `text` with every run of whitespace as one space (wrapped lines joined).
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `node -o json`'s subnet_manager object.
fn sm_json(socket: &Path) -> serde_json::Value {
    let node: serde_json::Value =
        serde_json::from_slice(&cli(socket, &["node", "-o", "json"]).stdout).unwrap();
    node["subnet_manager"].clone()
}

#[test]
fn refused_and_unreachable_are_different_states_everywhere() {
    // [2] The SM answers and refuses: REFUSED in node (human and JSON), doctor, events and the
    // sm_state metric; then it stops answering: UNREACHABLE in each.
    let port = net::free_port();
    let d = Daemon::start_with_fault(
        Some("refuse the fabric manager's licence expired"),
        "",
        &format!(
            "[reconciler]\nbackoff_max_ms = 300\n[metrics]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    let sock = d.socket.clone();
    let o = cli(&sock, &attach("i-1", "0a12", &[]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(10), || sm_json(&sock)["state"]
            == "REFUSED"),
        "{}",
        sm_json(&sock)
    );
    let node = words(&stdout(&cli(&sock, &["node"])));
    assert!(
        node.contains("embedded: REFUSED (it answered and said no): subnet manager refused"),
        "{node}"
    );
    assert!(node.contains("licence expired"), "{node}");
    assert!(!node.contains("UNREACHABLE"), "{node}");
    let doctor = words(&stdout(&with_config(&d.config, &["doctor"], &[])));
    assert!(
        doctor.contains("FAIL subnet manager") && doctor.contains("embedded: REFUSED"),
        "{doctor}"
    );
    assert!(
        scrape(port).contains("fabric_agent_sm_state{state=\"REFUSED\"} 1"),
        "{}",
        scrape(port)
    );
    // No answer at all now.
    std::fs::write(d.fault_file(), "unreachable").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || sm_json(&sock)["state"]
            == "UNREACHABLE"),
        "{}",
        sm_json(&sock)
    );
    let node = words(&stdout(&cli(&sock, &["node"])));
    assert!(
        node.contains("embedded: UNREACHABLE (no answer): subnet manager unavailable"),
        "{node}"
    );
    let doctor = words(&stdout(&with_config(&d.config, &["doctor"], &[])));
    assert!(doctor.contains("embedded: UNREACHABLE"), "{doctor}");
    let metrics = scrape(port);
    assert!(
        metrics.contains("fabric_agent_sm_state{state=\"UNREACHABLE\"} 1")
            && metrics.contains("fabric_agent_sm_state{state=\"REFUSED\"} 0"),
        "{metrics}"
    );
    // The events name each state once, in order.
    let events = stdout(&cli(&sock, &["events"]));
    let events = events.split_whitespace().collect::<Vec<_>>().join(" ");
    let refused = events
        .find("embedded REFUSED (it answered and said no): subnet manager refused")
        .expect(&events);
    let unreachable = events
        .find("embedded UNREACHABLE (no answer): subnet manager unavailable")
        .expect(&events);
    assert!(refused < unreachable, "{events}");
    let json: Vec<serde_json::Value> = stdout(&cli(&sock, &["events", "-o", "json"]))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["kind"] == "subnet_manager")
        .collect();
    let states: Vec<&str> = json
        .iter()
        .map(|e| e["detail"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["REFUSED", "UNREACHABLE"], "{json:?}");
}

#[test]
fn an_apply_in_flight_is_visible_since_when_and_to_whom() {
    // [4] A slow apply: node names it (generation, backend, since), the attachment's reason
    // says it waits for it, its key is in doubt meanwhile, doctor warns.
    let d = Daemon::start_with_fault(None, "", "");
    let sock = d.socket.clone();
    assert!(eventually(Duration::from_secs(10), || sm_json(&sock)
        ["state"]
        == "REACHABLE"));
    std::fs::write(d.fault_file(), "slow 6000").unwrap();
    let o = cli(&sock, &attach("i-1", "0a12", &[]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(5), || !sm_json(&sock)
            ["apply_in_flight"]
            .is_null()),
        "{}",
        sm_json(&sock)
    );
    let sm = sm_json(&sock);
    assert!(
        sm["apply_in_flight"]["generation"].as_u64().unwrap() > 0,
        "{sm}"
    );
    assert!(
        sm["apply_in_flight"]["since"]
            .as_str()
            .unwrap()
            .ends_with('Z'),
        "{sm}"
    );
    assert_eq!(sm["in_doubt_pkeys"][0], "0x0a12", "{sm}");
    let node = words(&stdout(&cli(&sock, &["node"])));
    assert!(node.contains("apply in flight: generation"), "{node}");
    assert!(node.contains("sent to embedded at"), "{node}");
    assert!(
        node.contains("an apply carrying them is in flight"),
        "{node}"
    );
    // [10] The in-doubt list spells the key as tables do, with its base.
    assert!(
        node.contains("in doubt: 0x8a12 (base 0x0a12), either membership"),
        "{node}"
    );
    assert_eq!(sm["in_doubt_pkey_values"][0], "0x8a12", "{sm}");
    let o = cli(&sock, &["get", "i-1", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let a: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(a["state"], "PENDING", "{a}");
    assert!(
        a["reason"].as_str().unwrap().starts_with(
            "waiting for the apply in flight to the subnet manager (embedded, generation"
        ),
        "{a}"
    );
    std::thread::sleep(Duration::from_millis(1200));
    let doctor = words(&stdout(&with_config(&d.config, &["doctor"], &[])));
    assert!(doctor.contains("WARN apply in flight"), "{doctor}");
    // Answered: nothing in flight, the reason is gone with the PENDING state.
    std::fs::write(d.fault_file(), "").unwrap();
    assert!(eventually(Duration::from_secs(15), || {
        stdout(&cli(&sock, &["get", "i-1"])).contains("ACTIVE")
    }));
    assert!(sm_json(&sock)["apply_in_flight"].is_null());
}

#[test]
fn a_new_request_or_a_changed_fault_is_tried_at_once() {
    // [5] A refusal backs off for backoff_max_ms (60 s here). A new request is sent at once
    // (the apply count moves within seconds), and clearing the fault gets ACTIVE within
    // seconds, not after the old backoff.
    let d = Daemon::start_with_fault(
        Some("refuse maintenance window"),
        "",
        "[reconciler]\nbackoff_max_ms = 60000\n",
    );
    let sock = d.socket.clone();
    assert!(eventually(Duration::from_secs(10), || sm_json(&sock)
        ["state"]
        == "REFUSED"));
    let before = sm_json(&sock)["applies"].as_u64().unwrap();
    let o = cli(&sock, &attach("i-1", "0a12", &[]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(5), || sm_json(&sock)["applies"]
            .as_u64()
            .unwrap()
            > before),
        "a new request waited out the old backoff: {}",
        sm_json(&sock)
    );
    assert!(eventually(Duration::from_secs(5), || {
        stdout(&cli(&sock, &["get", "i-1"])).contains("maintenance window")
    }));
    std::fs::write(d.fault_file(), "").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || stdout(&cli(
            &sock,
            &["get", "i-1"]
        ))
        .contains("ACTIVE")),
        "the cleared fault waited out the backoff: {}",
        stdout(&cli(&sock, &["get", "i-1"]))
    );
    assert!(d
        .log()
        .contains("the subnet manager's fault changed; retrying now"));
}

#[test]
fn a_release_held_by_another_instance_names_it_and_values_carry_the_membership_bit() {
    // [11] Two instances of one partition; the first is released: its reason names the
    // instance that still holds the key, not the subnet manager.
    let d = Daemon::start_with_fault(None, "", "");
    let sock = d.socket.clone();
    for i in ["i-1", "i-2"] {
        let o = cli(&sock, &attach(i, "0a12", &["--wait", "10s"]));
        assert_eq!(o.status.code(), Some(0), "{i}: {}", stderr(&o));
    }
    let o = cli(&sock, &["release", "--instance", "i-1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let reason = || {
        let a: serde_json::Value =
            serde_json::from_slice(&cli(&sock, &["get", "i-1", "-o", "json"]).stdout).unwrap();
        a["reason"].as_str().unwrap_or_default().to_owned()
    };
    assert!(
        eventually(Duration::from_secs(10), || reason()
            .contains("instance i-2 of partition ibpart_a still holds it")),
        "{}",
        reason()
    );
    // [10] The reason and the journal's "attachment changed" records carry the value with
    // the membership bit, as tables and events do.
    assert!(reason().starts_with("0x8a12 stays on "), "{}", reason());
    let log = d.log();
    let changed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("attachment changed"))
        .collect();
    assert!(!changed.is_empty(), "{log}");
    assert!(
        changed.iter().all(|l| l.contains("pkey=0x8a12")),
        "{changed:?}"
    );
}

#[test]
fn a_condition_is_logged_once() {
    // The insecure posture is one journal record, not one from the reconciler and one from
    // the event commit.
    let d = Daemon::start_with_fault(None, "default_membership = \"full\"\n", "");
    assert!(
        eventually(Duration::from_secs(10), || stdout(&cli(
            &d.socket,
            &["node"]
        ))
        .contains("CONDITION FULL_DEFAULT_MEMBERSHIP")),
        "{}",
        stdout(&cli(&d.socket, &["node"]))
    );
    let records = |log: &str| {
        log.lines()
            .filter(|l| l.contains("FULL_DEFAULT_MEMBERSHIP"))
            .count()
    };
    // The journal record can follow the state the CLI reads by a moment; a second record, if
    // there were one, would come from the reconciler's next pass within the same second.
    assert!(
        eventually(Duration::from_secs(10), || records(&d.log()) > 0),
        "{}",
        d.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    let log = d.log();
    assert_eq!(records(&log), 1, "{log}");
}
