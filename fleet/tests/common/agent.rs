//! A real `fabric-agent` daemon (embedded fabric) as a child process with its own temp dir,
//! reached over its unix socket, stopped by pid when dropped.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent binary of this workspace, built first when missing.
pub fn agent_bin() -> PathBuf {
    // A relative CARGO_TARGET_DIR is relative to where cargo ran: the workspace root here.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| root.join(t))
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug/fabric-agent");
    if !bin.exists() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "fabric-agent", "--bin", "fabric-agent"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building fabric-agent failed");
    }
    bin
}

/// One daemon.
pub struct Agent {
    pub node_id: String,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    child: Option<Child>,
}

impl Agent {
    /// Starts a daemon for `node_id` on fabric `fab1`; its embedded SM reads faults from
    /// [`Agent::fault_file`].
    pub fn start(node_id: &str) -> Agent {
        Agent::start_with(node_id, |_| String::new())
    }

    /// Starts as [`Agent::start`] with `listen(dir)` appended to the `[listen]` table (e.g. a
    /// TCP listener with TLS material written into the agent's temp dir).
    pub fn start_with(node_id: &str, listen: impl FnOnce(&Path) -> String) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("agent.sock");
        let config = format!(
            "node_id = \"{node_id}\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n\
             [subnet_manager.embedded]\nfault_file = \"{}\"\n\
             [listen]\nunix_socket = \"{}\"\n{}",
            dir.path().join("state").display(),
            dir.path().join("fault").display(),
            socket.display(),
            listen(dir.path())
        );
        std::fs::write(dir.path().join("config.toml"), config).expect("write config");
        let mut a = Agent {
            node_id: node_id.into(),
            dir,
            socket,
            child: None,
        };
        a.spawn();
        a
    }

    /// The nodes-file endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The file whose content the embedded SM obeys (`unreachable`, or empty).
    pub fn fault_file(&self) -> PathBuf {
        self.dir.path().join("fault")
    }

    /// Starts the process and waits until its socket accepts.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let _ = std::fs::remove_file(&self.socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .expect("log");
        let child = Command::new(agent_bin())
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .arg("serve")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn fabric-agent");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "{} exited early with {status}: {}",
                    self.node_id,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready: {}",
                self.node_id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL by pid, and reap.
    pub fn crash(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }

    /// SIGTERM by pid (a clean stop: the agent marks its store stopped cleanly, so the next
    /// start keeps the log epoch), and reap; SIGKILL after 15 s.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.wait();
                panic!("{} did not stop on SIGTERM within 15 s", self.node_id);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Removes the state directory (the next start opens a new log epoch).
    pub fn wipe_state(&self) {
        assert!(self.child.is_none(), "wipe only a stopped agent");
        std::fs::remove_dir_all(self.dir.path().join("state")).expect("wipe state dir");
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = kill(pid, Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}
