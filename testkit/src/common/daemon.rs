//! The embedded-fabric harness: the real `fabric-agent` binary as a child process in a temp dir,
//! talked to over its unix socket and stopped by pid when its handle drops.

use super::process::{self, DaemonProcess, BIN};
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use tonic::transport::Channel;

/// A daemon's files and, while running, its process.
pub struct Daemon {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    process: Option<DaemonProcess>,
    _tmp: Option<tempfile::TempDir>,
}

/// The config every test starts from: embedded fabric, socket and state in the temp dir.
pub fn base_config(dir: &Path, extra: &str) -> String {
    format!(
        "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n{extra}\n",
        dir.join("state").display()
    )
}

/// The `[subnet_manager.embedded]` table of a daemon whose SM takes injected faults from
/// `<dir>/fault` (written with `initial` first, when given), `embedded` added to the table:
/// (the config text, the fault file).
pub fn fault_config(dir: &Path, initial: Option<&str>, embedded: &str) -> (String, PathBuf) {
    let fault = dir.join("fault");
    if let Some(text) = initial {
        std::fs::write(&fault, text).expect("write fault file");
    }
    let config = format!(
        "[subnet_manager.embedded]\nfault_file = \"{}\"\n{embedded}",
        fault.display()
    );
    (config, fault)
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

    /// Starts a daemon as [`Daemon::start`] does, its embedded SM taking injected faults from
    /// [`Daemon::fault_file`] (written with `initial` first, when given); `embedded` is added to
    /// the `[subnet_manager.embedded]` table and `extra` after it.
    pub fn start_with_fault(initial: Option<&str>, embedded: &str, extra: &str) -> Daemon {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (faults, _) = fault_config(tmp.path(), initial, embedded);
        let mut d = Daemon::prepare(tmp.path(), &format!("{faults}{extra}"));
        d._tmp = Some(tmp);
        d.spawn(&[]);
        d
    }

    /// The fault file of a daemon started by [`Daemon::start_with_fault`].
    pub fn fault_file(&self) -> PathBuf {
        self.dir.join("fault")
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
        std::fs::write(&config, base_config(dir, &format!("{extra}\n{listen}")))
            .expect("write config");
        Daemon {
            dir: dir.to_owned(),
            config,
            socket,
            process: None,
            _tmp: None,
        }
    }

    /// Starts the daemon with extra environment and waits until its socket answers.
    pub fn spawn(&mut self, env: &[(&str, &str)]) {
        assert!(self.process.is_none(), "daemon already running");
        let mut cmd = Command::new(BIN);
        cmd.env_remove("NOTIFY_SOCKET").env_remove("WATCHDOG_USEC");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let log = self.dir.join("daemon.log");
        self.process = Some(DaemonProcess::start(
            cmd,
            "daemon",
            &self.config,
            &self.socket,
            &log,
        ));
    }

    /// The child's pid.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.process.as_ref().expect("running").pid() as i32)
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.process.take().expect("running").stop()
    }

    /// Waits for an exit already requested by a signal.
    pub fn stop_after_signal(&mut self) -> ExitStatus {
        self.process.take().expect("running").wait_exit()
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(&mut self) {
        self.process.take().expect("running").crash();
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// A gRPC client over the unix socket.
    pub async fn client(&self) -> FabricAgentClient<Channel> {
        process::client(&self.socket).await
    }
}
