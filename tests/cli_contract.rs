//! The operator's contract, with the real binary as a child process: exit codes a script can
//! trust, P_Keys parsed as InfiniBand tools write them, one membership per key per node, a
//! daemon that guards its socket and survives SIGHUP.

mod common;

use common::*;
use std::path::Path;
use std::process::Output;

/// Runs the CLI against a socket.
fn cli(socket: &Path, args: &[&str]) -> Output {
    std::process::Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run the CLI")
}

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

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn exit_codes_and_pkey_syntax() {
    let tmp = tempfile::tempdir().unwrap();
    let fault = tmp.path().join("fault");
    let extra = format!(
        "[subnet_manager.embedded]\nfault_file = \"{}\"\n",
        fault.display()
    );
    let mut d = Daemon::prepare(tmp.path(), &extra);
    d.spawn(&[]);
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
        &attach_args("i-1", "0a12", &["--wait", "10", "--json"]),
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
    let mut other = attach_args("i-3", "0x0b00", &["--wait", "2"]);
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
