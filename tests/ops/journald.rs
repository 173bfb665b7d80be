//! Logging under systemd: when stderr is the journal stream (`JOURNAL_STREAM` names it) and the
//! journal's socket exists, the daemon sends native journal records, each tracing field a
//! journal field of its own; otherwise plain text on stderr, without ANSI colours when stderr
//! is not a terminal.
//!
//! The journal is a stand-in: in a private mount namespace (`unshare --mount`, root only) a
//! tmpfs covers /run and a small Python listener binds /run/systemd/journal/socket and decodes
//! the native protocol. Skips without root, unshare or python3.

use std::path::Path;
use std::process::Command;
use testkit::common::skip::skip;

const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

/// Receives native-protocol datagrams and writes one JSON object of fields per record.
const LISTENER: &str = r#"
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/run/systemd/journal/socket")
open(sys.argv[2], "w").close()
s.settimeout(10)
out = open(sys.argv[1], "w")
try:
    while True:
        data, _ = s.recvfrom(1 << 20)
        fields, i = {}, 0
        while i < len(data):
            nl = data.index(b"\n", i)
            line = data[i:nl]
            if b"=" in line:
                k, v = line.split(b"=", 1)
                i = nl + 1
            else:
                k = line
                (n,) = struct.unpack("<Q", data[nl + 1:nl + 9])
                v = data[nl + 9:nl + 9 + n]
                i = nl + 9 + n + 1
            fields[k.decode()] = v.decode(errors="replace")
        out.write(json.dumps(fields) + "\n")
        out.flush()
        if fields.get("MESSAGE") == "ready":
            break
except socket.timeout:
    pass
"#;

/// Runs `serve` in a private mount namespace with a stand-in journal, stderr to a file; with
/// `matching` the JOURNAL_STREAM names that file, else another inode. Returns (journal records
/// as JSON lines, stderr).
fn serve_with_journal(dir: &Path, matching: bool) -> (String, String) {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{0}/state\"\n\
             [listen]\nunix_socket = \"{0}/agent.sock\"\n[subnet_manager]\nbackend = \"embedded\"\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("listener.py"), LISTENER).unwrap();
    let stream_of = if matching { "stderr" } else { "config.toml" };
    let script = format!(
        r#"set -e
cd "{dir}"
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal
python3 listener.py journal.jsonl listening &
listener=$!
for _ in $(seq 100); do [ -e listening ] && break; sleep 0.05; done
exec 9> stderr
JOURNAL_STREAM=$(stat -c %d:%i {stream_of}) "{bin}" --config config.toml serve 2>&9 &
agent=$!
for _ in $(seq 100); do [ -S agent.sock ] && break; sleep 0.1; done
sleep 0.3
kill -TERM $agent
wait $agent
kill $listener 2>/dev/null || true
wait $listener || true
"#,
        dir = dir.display(),
        bin = BIN,
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", "-c", &script])
        .output()
        .expect("run unshare");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let journal = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
    (journal, stderr)
}

fn can_run() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    let tools = ["unshare", "python3"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !(root && tools) {
        skip("needs root, unshare and python3 (a private mount namespace)");
    }
    root && tools
}

#[test]
fn under_the_journal_records_go_native_with_fields() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (journal, stderr) = serve_with_journal(tmp.path(), true);
    assert!(
        stderr.is_empty(),
        "stderr used although it is the journal:\n{stderr}"
    );
    let ready = journal
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["MESSAGE"] == "ready")
        .unwrap_or_else(|| panic!("no `ready` record in the journal:\n{journal}"));
    assert_eq!(ready["NODE"], "node1", "{ready}");
    assert_eq!(ready["FABRIC"], "fab1", "{ready}");
    assert_eq!(ready["TARGET"], "fabric_agent::cli::serve", "{ready}");
    assert!(ready["PRIORITY"].is_string(), "{ready}");
}

#[test]
fn elsewhere_plain_text_on_stderr_without_colours() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // JOURNAL_STREAM inherited but naming another file: stderr is not the journal.
    let (journal, stderr) = serve_with_journal(tmp.path(), false);
    assert!(
        journal.is_empty(),
        "records went to the journal:\n{journal}"
    );
    assert!(stderr.contains(" ready node=node1 fabric=fab1"), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "ANSI escapes in a file:\n{stderr}"
    );
}
