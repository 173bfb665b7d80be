//! Test support: runs the real `fabric-agent` binary as a child process in a temp dir and talks
//! to it over its unix socket. Every daemon is stopped by pid when its handle drops.

#![allow(dead_code)]

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

/// A daemon's files and, while running, its process.
pub struct Daemon {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
}

/// The config every test starts from: embedded fabric, socket and state in the temp dir.
pub fn base_config(dir: &Path, extra: &str) -> String {
    format!(
        "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n{extra}\n",
        dir.join("state").display()
    )
}

impl Daemon {
    /// Writes a config (`extra` is appended; a `[listen]` table is added unless `extra` has one)
    /// and starts the daemon, waiting until it answers.
    pub fn start(extra: &str) -> Daemon {
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut d = Daemon::prepare(tmp.path(), extra);
        d._tmp = Some(tmp);
        d.spawn(&[]);
        d
    }

    /// Writes the config into `dir` without starting.
    pub fn prepare(dir: &Path, extra: &str) -> Daemon {
        let socket = dir.join("agent.sock");
        let listen = if extra.contains("[listen]") {
            String::new()
        } else {
            format!("[listen]\nunix_socket = \"{}\"\n", socket.display())
        };
        let config = dir.join("config.toml");
        // Top-level keys must precede tables: put `extra` first when it starts with a table.
        std::fs::write(&config, base_config(dir, &format!("{extra}\n{listen}")))
            .expect("write config");
        Daemon {
            dir: dir.to_owned(),
            config,
            socket,
            child: None,
            _tmp: None,
        }
    }

    /// Starts the daemon with extra environment and waits until GetNode answers.
    pub fn spawn(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .expect("log file");
        let mut cmd = Command::new(BIN);
        cmd.arg("--config")
            .arg(&self.config)
            .arg("serve")
            .env("FABRIC_AGENT_LOG", "fabric_agent=debug")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn fabric-agent"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited early with {status}: {}", self.log());
            }
            // The socket is bound only after the store is open and the ports were read.
            let ok = std::os::unix::net::UnixStream::connect(&self.socket).is_ok();
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("daemon did not become ready: {}", self.log());
    }

    /// The child's pid.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        wait_timeout(&mut child, Duration::from_secs(15)).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("daemon ignored SIGTERM")
        })
    }

    /// Waits for an exit already requested by a signal.
    pub fn stop_after_signal(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        wait_timeout(&mut child, Duration::from_secs(15)).expect("daemon exits")
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// A gRPC client over the unix socket.
    pub async fn client(&self) -> FabricAgentClient<Channel> {
        FabricAgentClient::new(
            fabric_agent::api::client::unix(&self.socket)
                .await
                .expect("connect"),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Waits for a child up to `limit`.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().ok().flatten() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A partition on fabric `fab1`.
pub fn partition(id: &str, pkey: u32) -> pb::Partition {
    pb::Partition {
        id: id.into(),
        name: id.trim_start_matches("ibpart_").into(),
        workspace: "ws".into(),
        account: "acct".into(),
        fabric: "fab1".into(),
        pkey,
    }
}

/// An attach request.
pub fn attach(
    instance: &str,
    p: pb::Partition,
    wait_ms: Option<u32>,
) -> pb::AttachPartitionRequest {
    pb::AttachPartitionRequest {
        partition: Some(p),
        instance_id: instance.into(),
        membership: pb::Membership::Full as i32,
        wait_ms,
    }
}

/// The state of an attachment as the enum.
pub fn state(a: &pb::Attachment) -> pb::AttachmentState {
    pb::AttachmentState::try_from(a.state).expect("known state")
}

/// Every event after `after`, without following.
pub async fn events(c: &mut FabricAgentClient<Channel>, after: u64) -> Vec<pb::Event> {
    use tokio_stream::StreamExt;
    let mut s = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: after,
            no_follow: true,
        })
        .await
        .expect("watch")
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = s.next().await {
        out.push(e.expect("event"));
    }
    out
}

/// Asserts the sequence numbers are 1..=n without gaps or duplicates.
pub fn assert_gap_free(events: &[pb::Event]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.seq,
            i as u64 + 1,
            "event sequence has a gap or duplicate at index {i}"
        );
    }
}
