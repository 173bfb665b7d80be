//! The guest half: what the scenarios use inside the VM (root, a real kernel with rxe0 on eth0):
//! commands with their output, `ibv_devinfo -v` parsed, a `fabric-agent serve` child on the
//! embedded backend with the verbs observer, and its event log.

use crate::common::process::ChildGuard;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The netdev rxe0 runs on, and its MAC (set by scripts/vm-rig.sh): the GUIDs derive from it.
pub const NETDEV: &str = "eth0";
/// The binary under test, as the guest sees it (the share is mounted at /mnt/share).
pub const BIN: &str = "/mnt/share/bin/fabric-agent";
/// EUI-64 of 52:54:00:ab:cd:ef.
pub const MAC_EUI64: u64 = 0x5054_00ff_feab_cdef;

/// Runs `sh -c cmd`, echoing it and its output into the scenario's log.
pub fn sh(cmd: &str) -> Output {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    eprintln!(
        "$ {cmd}  (exit {:?})\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd`, which must succeed; returns its stdout.
pub fn sh_ok(cmd: &str) -> String {
    let out = sh(cmd);
    assert!(out.status.success(), "{cmd} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ibv_devinfo -v -d <device>`: the `key: value` lines (first occurrence) and the GID table.
#[derive(Debug)]
pub struct DevInfo {
    pub fields: BTreeMap<String, String>,
    /// `GID[ i]: addr, type` lines: index -> address bytes (one entry per index).
    pub gids: BTreeMap<i32, [u8; 16]>,
}

impl DevInfo {
    pub fn read(device: &str) -> DevInfo {
        let text = sh_ok(&format!("ibv_devinfo -v -d {device}"));
        let mut fields = BTreeMap::new();
        let mut gids = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("GID[") {
                let (index, rest) = rest.split_once("]:").expect("GID line");
                let addr = rest.trim().split(',').next().unwrap().trim();
                let addr: Ipv6Addr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
                gids.insert(index.trim().parse().unwrap(), addr.octets());
            } else if let Some((k, v)) = line.split_once(':') {
                fields
                    .entry(k.trim().to_owned())
                    .or_insert_with(|| v.trim().to_owned());
            }
        }
        DevInfo { fields, gids }
    }

    pub fn field(&self, key: &str) -> &str {
        self.fields
            .get(key)
            .unwrap_or_else(|| panic!("ibv_devinfo has no {key}: {:?}", self.fields))
    }

    /// `5054:00ff:feab:cdef` -> u64.
    pub fn guid(&self, key: &str) -> u64 {
        u64::from_str_radix(&self.field(key).replace(':', ""), 16).unwrap()
    }
}

/// One `fabric-agent serve` on the embedded backend with `[observer] kind = kind`, its own
/// state dir and socket, stopped by pid on drop.
pub struct Agent {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
    _child: ChildGuard,
}

impl Agent {
    /// Starts it and waits until its socket answers `node`. The slow poll is a minute, so a
    /// port change seen sooner came through an async event.
    pub fn start(kind: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        let socket = dir.path().join("agent.sock");
        std::fs::write(
            &config,
            format!(
                "fabric = \"lab-rxe\"\nstate_dir = \"{}\"\n\n[listen]\nunix_socket = \"{}\"\n\n\
                 [subnet_manager]\nbackend = \"embedded\"\n\n[observer]\nkind = \"{kind}\"\n\
                 slow_poll_ms = 60000\n",
                dir.path().join("state").display(),
                socket.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
        let child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("FABRIC_AGENT_LOG", "info,fabric_agent::observe=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fabric-agent serve");
        let agent = Agent {
            dir,
            config,
            socket,
            _child: ChildGuard::new("fabric-agent serve", child),
        };
        let ready = wait_until(Duration::from_secs(60), || {
            agent.cli(&["node", "--json"]).status.success()
        });
        assert!(ready, "the agent did not answer: {}", agent.log());
        agent
    }

    /// Runs a client command against this agent.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--config")
            .arg(&self.config)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run the CLI")
    }

    /// The agent's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Every event in the durable log, as JSON.
    pub fn events(&self) -> Vec<Value> {
        let out = self.cli(&["events", "--json"]);
        assert!(out.status.success(), "events: {:?}", out);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// Whether some object inside `v` has every `(key, value)` of `want` as strings.
pub fn has_object(v: &Value, want: &[(&str, &str)]) -> bool {
    match v {
        Value::Object(map) => {
            want.iter()
                .all(|(k, w)| map.get(*k).and_then(Value::as_str) == Some(*w))
                || map.values().any(|x| has_object(x, want))
        }
        Value::Array(items) => items.iter().any(|x| has_object(x, want)),
        _ => false,
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Adds the rxe link on `NETDEV` again.
pub fn rxe_add() {
    sh_ok(&format!("rdma link add rxe0 type rxe netdev {NETDEV}"));
}

/// Whether `path` exists (the guest's own file system).
pub fn exists(path: &str) -> bool {
    Path::new(path).exists()
}
