//! Local callers on the unix socket are checked by SO_PEERCRED: the CLI run as another uid
//! (`setpriv`, needs root) may read when in the read group but may not attach or release; root's
//! attach is served and leaves one audit line naming `unix uid=0`.

use testkit::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const NOBODY: &str = "65534";

fn as_nobody(d: &Daemon, args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            BIN,
            "--socket",
        ])
        .arg(&d.socket)
        .args(args)
        .output()
        .expect("run setpriv")
}

const ATTACH: &[&str] = &[
    "attach",
    "--instance",
    "vm-1",
    "--partition",
    "ibpart_a1",
    "--name",
    "a1",
    "--workspace",
    "ws",
    "--account",
    "acct",
    "--pkey",
    "0x0a12",
];

/// Whether the CLI can run as another uid (root only); says so when not.
fn can_switch_uid() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        skip("running the CLI as another uid needs root");
    }
    root
}

/// A daemon (not started) in `dir`, whose socket anyone may open (mode 0666), with `listen`
/// added to its `[listen]` table. `dir` is opened to everyone too: nobody must be able to reach
/// the socket at all, so that a refusal is the agent's.
fn open_to_all(dir: &std::path::Path, listen: &str) -> Daemon {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let extra = format!(
        "[listen]\nunix_socket = \"{}\"\nunix_socket_mode = \"0666\"\n{listen}",
        dir.join("agent.sock").display()
    );
    Daemon::prepare(dir, &extra)
}

fn audit_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("fabric_agent::audit"))
        .collect()
}

#[test]
fn a_non_root_unlisted_user_may_read_but_not_change() {
    if !can_switch_uid() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut d = open_to_all(tmp.path(), &format!("read_group = \"{NOBODY}\"\n"));
    d.spawn(&[("FABRIC_AGENT_LOG", "fabric_agent=debug")]);
    // The socket file belongs to the read group.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&d.socket).unwrap().gid().to_string(),
        NOBODY
    );

    let read = as_nobody(&d, &["node"]);
    assert!(
        read.status.success(),
        "nobody is in the read group: {}",
        String::from_utf8_lossy(&read.stderr)
    );

    let refused = as_nobody(&d, ATTACH);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("uid=65534"), "{err}");
    assert!(
        err.to_lowercase().contains("permission") || err.contains("PermissionDenied"),
        "{err}"
    );
    let released = as_nobody(&d, &["release", "--instance", "vm-1"]);
    assert!(!released.status.success());
    assert!(String::from_utf8_lossy(&released.stderr).contains("uid=65534"));

    // Nothing was attached.
    let list = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["attachments", "--json"])
        .output()
        .unwrap();
    assert!(list.status.success());
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains("vm-1"),
        "{}",
        String::from_utf8_lossy(&list.stdout)
    );

    // Root attaches; the audit trail has root's call and nobody's refusals.
    let ok = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(ATTACH)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    d.stop();
    let log = d.log();
    let audit = audit_lines(&log);
    let root: Vec<_> = audit
        .iter()
        .filter(|l| {
            l.contains("caller=unix uid=0")
                && l.contains("AttachPartition")
                && l.contains("result=")
        })
        .collect();
    assert_eq!(root.len(), 1, "{audit:#?}");
    assert!(
        audit.iter().any(|l| l.contains("caller=unix uid=0")
            && l.contains("AttachPartition")
            && l.contains("phase=\"admitted\"")),
        "{audit:#?}"
    );
    for field in [
        "instance=\"vm-1\"",
        "partition=\"ibpart_a1\"",
        "pkey=0x8a12",
        "pkey_base=0x0a12",
        "membership=\"FULL\"",
        "result=Ok",
    ] {
        assert!(root[0].contains(field), "{field} in {}", root[0]);
    }
    let refusals: Vec<_> = audit
        .iter()
        .filter(|l| l.contains("caller=\"unix uid=65534\"") || l.contains("caller=unix uid=65534"))
        .collect();
    assert_eq!(refusals.len(), 2, "{audit:#?}");
    assert!(refusals
        .iter()
        .all(|l| l.contains("result=PermissionDenied")));
}

#[test]
fn a_user_outside_the_read_group_may_not_read() {
    if !can_switch_uid() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // No read_group: nobody but root, the agent's user and allowed_uids may call at all.
    let mut d = open_to_all(tmp.path(), "");
    d.spawn(&[]);
    let read = as_nobody(&d, &["node"]);
    assert!(!read.status.success());
    assert!(String::from_utf8_lossy(&read.stderr).contains("uid=65534"));
    d.stop();
}
