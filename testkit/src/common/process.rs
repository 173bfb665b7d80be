//! The one process guard of the tests: [`ChildGuard`] stops a child by pid when dropped —
//! SIGTERM, a grace period, SIGKILL only as a fallback — on success, failure or panic. On it,
//! [`DaemonProcess`]: one running `fabric-agent serve` child, started from a prepared `Command`
//! and ready once its unix socket accepts (the socket is bound only after the store is open and
//! the ports were read). Shared by the embedded-fabric harness (`common`) and the ibsim
//! rig's agents.

use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The binary under test.
pub const BIN: &str = env!("FABRIC_AGENT_BIN");

/// Waits for a child up to `limit`.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().ok().flatten() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process stopped by pid when dropped: SIGTERM, `drop_grace`, then SIGKILL.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    drop_grace: Duration,
}

impl ChildGuard {
    /// Guards a child (3 s of grace when dropped).
    pub fn new(name: &str, child: Child) -> ChildGuard {
        ChildGuard {
            name: name.to_owned(),
            child: Some(child),
            drop_grace: Duration::from_secs(3),
        }
    }

    /// The same guard with another grace period for the stop on drop.
    pub fn with_drop_grace(mut self, grace: Duration) -> ChildGuard {
        self.drop_grace = grace;
        self
    }

    /// The pid (0 once the child was taken out or reaped).
    pub fn id(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The name it was guarded under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// The exit status if the process has exited (the child stays guarded).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().expect("try_wait")
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: Signal) {
        if let Some(c) = &self.child {
            let _ = kill(Pid::from_raw(c.id() as i32), signal);
        }
    }

    /// Waits up to `limit` for an exit already requested; `None` (the child still guarded) when
    /// it did not come.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let status = wait_timeout(self.child.as_mut()?, limit)?;
        self.child = None;
        Some(status)
    }

    /// Waits for the exit, however long it takes.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child.as_mut().expect("child present").wait();
        self.child = None;
        status.expect("wait")
    }

    /// Stops the process (SIGTERM, then SIGKILL after `grace`) and reaps it.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        if wait_timeout(&mut child, grace).is_none() {
            eprintln!(
                "{} (pid {}) ignored SIGTERM, killing",
                self.name,
                child.id()
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Takes the child out of the guard.
    pub fn into_inner(mut self) -> Child {
        self.child.take().expect("child present")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop(self.drop_grace);
    }
}

/// A running daemon.
pub struct DaemonProcess {
    child: ChildGuard,
    log: PathBuf,
}

impl DaemonProcess {
    /// Adds `--config <config> serve`, debug logging appended to `log`, no systemd variables
    /// (callers may set them again), default dispositions for SIGHUP, SIGINT and SIGTERM, spawns, and waits up to 20 s for `socket` to accept.
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
        // SIGTERM stops it and SIGHUP reloads it even when the tests run with them ignored.
        fabric_agent::sys::process::with_default_signals(&mut cmd);
        let child = cmd.spawn().expect("spawn fabric-agent");
        let mut p = DaemonProcess {
            child: ChildGuard::new(what, child).with_drop_grace(Duration::from_secs(10)),
            log: log.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = p.child.try_wait() {
                panic!("{what} exited early with {status}: {}", p.log_text());
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not become ready: {}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM and wait for the exit; panics (after a SIGKILL) if the signal is ignored.
    pub fn stop(self) -> ExitStatus {
        self.child.signal(Signal::SIGTERM);
        self.wait_exit()
    }

    /// Waits for an exit already requested (e.g. by a signal the test sent).
    pub fn wait_exit(mut self) -> ExitStatus {
        self.child
            .wait_timeout(Duration::from_secs(15))
            .unwrap_or_else(|| {
                self.child.kill();
                panic!("{} ignored SIGTERM: {}", self.child.name(), self.log_text())
            })
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(mut self) {
        self.child.kill();
    }

    /// The daemon's output so far (all runs sharing the log).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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
