//! One running `fabric-agent serve` child: started from a prepared `Command`, ready once its
//! unix socket accepts (the socket is bound only after the store is open and the ports were
//! read), stopped by pid — SIGTERM and a wait, SIGKILL only as a fallback — when dropped.
//! Shared by the embedded-fabric harness (`tests/common`) and the ibsim rig's agents.

#![allow(dead_code)]

use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

/// A running daemon.
pub struct DaemonProcess {
    child: Option<Child>,
    what: String,
    log: PathBuf,
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

impl DaemonProcess {
    /// Adds `--config <config> serve`, debug logging appended to `log`, no systemd variables
    /// (callers may set them again), spawns, and waits up to 20 s for `socket` to accept.
    pub fn start(
        mut cmd: Command,
        what: &str,
        config: &Path,
        socket: &Path,
        log: &Path,
    ) -> DaemonProcess {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("daemon log");
        cmd.arg("--config")
            .arg(config)
            .arg("serve")
            .env("FABRIC_AGENT_LOG", "fabric_agent=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file);
        let mut p = DaemonProcess {
            child: Some(cmd.spawn().expect("spawn fabric-agent")),
            what: what.to_owned(),
            log: log.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = p
                .child
                .as_mut()
                .expect("child")
                .try_wait()
                .expect("try_wait")
            {
                p.child = None;
                panic!("{} exited early with {status}: {}", p.what, p.log_text());
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not become ready: {}",
                p.what,
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM and wait for the exit; panics (after a SIGKILL) if the signal is ignored.
    pub fn stop(self) -> ExitStatus {
        let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM);
        self.wait_exit()
    }

    /// Waits for an exit already requested (e.g. by a signal the test sent).
    pub fn wait_exit(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        wait_timeout(&mut child, Duration::from_secs(15)).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} ignored SIGTERM: {}", self.what, self.log_text())
        })
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The daemon's output so far (all runs sharing the log).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DaemonProcess {
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

/// A gRPC client over a daemon's unix socket.
pub async fn client(socket: &Path) -> FabricAgentClient<Channel> {
    FabricAgentClient::new(
        fabric_agent::api::client::unix(socket)
            .await
            .expect("connect"),
    )
}
