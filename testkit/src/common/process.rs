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
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
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

/// What a guard runs, once, when it finds its child killed by a signal (given the child's pid):
/// e.g. [`crate::rig::ibsim_slots::IbsimSlots::hook`], which frees the ibsim client slot a
/// process under the shim leaks when it dies without a clean exit.
#[derive(Clone)]
pub struct SignalDeathHook(pub Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for SignalDeathHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalDeathHook")
    }
}

/// A child process stopped by pid when dropped: SIGTERM, `drop_grace`, then SIGKILL.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    drop_grace: Duration,
    on_signal_death: Option<SignalDeathHook>,
}

impl ChildGuard {
    /// Guards a child (3 s of grace when dropped).
    pub fn new(name: &str, child: Child) -> ChildGuard {
        ChildGuard {
            name: name.to_owned(),
            child: Some(child),
            drop_grace: Duration::from_secs(3),
            on_signal_death: None,
        }
    }

    /// Runs `hook` (once) when the child is found dead by a signal: a crash, a SIGKILL sent on
    /// purpose, or the SIGKILL that [`ChildGuard::stop`] escalates to. Replaces an earlier hook.
    pub fn set_on_signal_death(&mut self, hook: SignalDeathHook) {
        self.on_signal_death = Some(hook);
    }

    /// Hands an exit status just observed for `pid` to the hook when it is a death by signal.
    fn observed(&mut self, pid: u32, status: Option<ExitStatus>) {
        if status.is_some_and(|s| s.signal().is_some()) {
            if let Some(hook) = self.on_signal_death.take() {
                (hook.0)(pid);
            }
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
            Some(c) => {
                let pid = c.id();
                match c.try_wait() {
                    Ok(None) => false,
                    Ok(status) => {
                        self.observed(pid, status);
                        true
                    }
                    Err(_) => true,
                }
            }
            None => true,
        }
    }

    /// The exit status if the process has exited (the child stays guarded).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let pid = child.id();
        let status = child.try_wait().expect("try_wait");
        self.observed(pid, status);
        status
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
        let pid = self.id();
        let status = wait_timeout(self.child.as_mut()?, limit)?;
        self.child = None;
        self.observed(pid, Some(status));
        Some(status)
    }

    /// Waits for the exit, however long it takes.
    pub fn wait(&mut self) -> ExitStatus {
        let pid = self.id();
        let status = self.child.as_mut().expect("child present").wait();
        self.child = None;
        let status = status.expect("wait");
        self.observed(pid, Some(status));
        status
    }

    /// Stops the process (SIGTERM, then SIGKILL after `grace`) and reaps it.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        if let Ok(Some(status)) = child.try_wait() {
            self.observed(pid, Some(status));
            return;
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let mut status = wait_timeout(&mut child, grace);
        if status.is_none() {
            eprintln!("{} (pid {pid}) ignored SIGTERM, killing", self.name);
            let _ = child.kill();
            status = child.wait().ok();
        }
        self.observed(pid, status);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            let _ = child.kill();
            let status = child.wait().ok();
            self.observed(pid, status);
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

    /// Runs `hook` when the daemon is found dead by a signal (see
    /// [`ChildGuard::set_on_signal_death`]).
    pub fn set_on_signal_death(&mut self, hook: SignalDeathHook) {
        self.child.set_on_signal_death(hook);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A guard whose hook records the pids it is called with.
    fn guarded(script: &str) -> (ChildGuard, Arc<Mutex<Vec<u32>>>) {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .spawn()
            .expect("sh");
        let mut guard = ChildGuard::new("sh", child);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        guard.set_on_signal_death(SignalDeathHook(Arc::new(move |pid| {
            record.lock().unwrap().push(pid)
        })));
        (guard, seen)
    }

    #[test]
    fn the_hook_runs_once_when_stop_escalates_to_sigkill() {
        let (mut guard, seen) = guarded("trap '' TERM; sleep 30");
        let pid = guard.id();
        std::thread::sleep(Duration::from_millis(200)); // the trap is set
        guard.stop(Duration::from_millis(300));
        assert_eq!(guard.id(), 0, "reaped");
        assert_eq!(*seen.lock().unwrap(), vec![pid]);
    }

    #[test]
    fn the_hook_does_not_run_after_a_clean_exit() {
        let (mut guard, seen) = guarded("trap 'exit 0' TERM; sleep 30 & wait");
        std::thread::sleep(Duration::from_millis(200));
        guard.stop(Duration::from_secs(5));
        let (mut done, _) = guarded("exit 3");
        assert!(done.wait().code() == Some(3));
        assert!(seen.lock().unwrap().is_empty());
    }
}
