//! `fabric-agent serve` daemons running as nodes of a [`super::Fabric`] (under the umad2sim
//! shim), each stopped by pid when its handle drops: SIGTERM and a wait, SIGKILL only as a
//! fallback. [`Agent::crash`] SIGKILLs on purpose (which leaks one of ibsim's client slots).

use super::Fabric;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

/// One node's agent: its config, socket and log in the rig's dir and, while running, its process.
pub struct Agent {
    /// The fabric node it runs as (`SIM_HOST`).
    pub node: String,
    /// Its config file.
    pub config: PathBuf,
    /// Its unix socket.
    pub socket: PathBuf,
    /// Its stdout + stderr (appended across restarts).
    pub log: PathBuf,
    child: Option<Child>,
}

/// Waits for a child up to `limit`.
fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().ok().flatten() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

impl Agent {
    /// Writes `<dir>/<node>.toml` with `config` and starts the agent as `node`, waiting until
    /// its socket answers. `config` must put the unix socket at `<dir>/<node>.sock`.
    pub fn start(fabric: &Fabric, node: &str, config: &str) -> Agent {
        let dir = fabric.dir();
        let socket = dir.join(format!("{node}.sock"));
        assert!(
            config.contains(&socket.display().to_string()),
            "the config must listen on {}",
            socket.display()
        );
        let path = dir.join(format!("{node}.toml"));
        std::fs::write(&path, config).expect("write agent config");
        let mut agent = Agent {
            node: node.to_owned(),
            config: path,
            socket,
            log: dir.join(format!("{node}-agent.log")),
            child: None,
        };
        agent.spawn(fabric);
        agent
    }

    /// Starts the (stopped) agent again with the same config.
    pub fn spawn(&mut self, fabric: &Fabric) {
        assert!(self.child.is_none(), "{} is already running", self.node);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        let child = fabric
            .client_command(&self.node, BIN)
            .arg("--config")
            .arg(&self.config)
            .arg("serve")
            .env("FABRIC_AGENT_LOG", "fabric_agent=debug")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn fabric-agent");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "{} agent exited early with {status}: {}",
                    self.node,
                    self.log_text()
                );
            }
            // The socket is bound only after the store is open and the ports were read.
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} agent did not become ready: {}",
                self.node,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The running agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM and wait for the exit; panics (after a SIGKILL) if it ignores the signal.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        wait_timeout(&mut child, Duration::from_secs(15)).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} agent ignored SIGTERM: {}", self.node, self.log_text())
        })
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The agent's output so far (all runs).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

impl Drop for Agent {
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

/// The SM-host agent's config: OpenSM backend on the rig's files, Partitions served on TCP.
pub fn sm_config(fabric: &Fabric, port: u16) -> String {
    let d = fabric.dir().display();
    format!(
        "node_id = \"smhost\"\nfabric = \"fab1\"\nstate_dir = \"{d}/smstate\"\n\
         [listen]\nunix_socket = \"{d}/smhost.sock\"\ntcp = \"127.0.0.1:{port}\"\nplaintext_loopback = true\n\
         [subnet_manager]\nbackend = \"opensm\"\n\
         [subnet_manager.opensm]\npartitions_file = \"{}\"\nlog_file = \"{d}/opensm.log\"\npid_file = \"{}\"\n\
         [observer]\nkind = \"smp\"\nslow_poll_ms = 2000\n\
         [reconciler]\nbackoff_max_ms = 1000\n",
        fabric.partitions_path().display(),
        fabric.opensm_pid_path().display(),
    )
}

/// A node agent's config: remote backend pointing at the SM-host agent.
pub fn node_config(fabric: &Fabric, node: &str, port: u16) -> String {
    let d = fabric.dir().display();
    format!(
        "node_id = \"{node}\"\nfabric = \"fab1\"\nstate_dir = \"{d}/{node}-state\"\n\
         [listen]\nunix_socket = \"{d}/{node}.sock\"\n\
         [subnet_manager]\nbackend = \"remote\"\n\
         [subnet_manager.remote]\nendpoint = \"http://127.0.0.1:{port}\"\n\
         [observer]\nkind = \"smp\"\nslow_poll_ms = 2000\n\
         [reconciler]\nbackoff_max_ms = 1000\n"
    )
}
