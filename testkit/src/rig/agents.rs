//! `fabric-agent serve` daemons running as nodes of a [`super::Fabric`] (under the umad2sim
//! shim), each stopped by pid when its handle drops: SIGTERM and a wait, SIGKILL only as a
//! fallback. [`Agent::crash`] SIGKILLs on purpose; an agent found dead by a signal has its
//! ibsim client slot freed ([`super::ibsim_slots`]).

use super::process;
use super::Fabric;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use process::DaemonProcess;
pub use process::BIN;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use tonic::transport::Channel;

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
    /// Environment variables set for it at every start (besides the shim's).
    env: Vec<(String, String)>,
    process: Option<DaemonProcess>,
}

impl Agent {
    /// Writes `<dir>/<node>.toml` with `config` and starts the agent as `node`, waiting until
    /// its socket answers. `config` must put the unix socket at `<dir>/<node>.sock`.
    pub fn start(fabric: &Fabric, node: &str, config: &str) -> Agent {
        Agent::start_with_env(fabric, node, config, &[])
    }

    /// Like [`Agent::start`], with `env` set in its environment at this and every later start
    /// (e.g. `FABRIC_AGENT_TEST_MUTATION` for the chaos checker's proof).
    pub fn start_with_env(
        fabric: &Fabric,
        node: &str,
        config: &str,
        env: &[(String, String)],
    ) -> Agent {
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
            env: env.to_vec(),
            process: None,
        };
        agent.spawn(fabric);
        agent
    }

    /// Starts the (stopped) agent again with the same config, as its fabric node (under the
    /// shim).
    pub fn spawn(&mut self, fabric: &Fabric) {
        assert!(self.process.is_none(), "{} is already running", self.node);
        let mut cmd = fabric.client_command(&self.node, BIN);
        cmd.env_remove("NOTIFY_SOCKET").env_remove("WATCHDOG_USEC");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let what = format!("{} agent", self.node);
        let mut process = DaemonProcess::start(cmd, &what, &self.config, &self.socket, &self.log);
        process.set_on_signal_death(fabric.ibsim_slots().hook());
        self.process = Some(process);
    }

    /// The running agent's pid.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("running").pid()
    }

    /// SIGTERM and wait for the exit; panics (after a SIGKILL) if it ignores the signal.
    pub fn stop(&mut self) -> ExitStatus {
        self.process.take().expect("running").stop()
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(&mut self) {
        self.process.take().expect("running").crash();
    }

    /// The agent's output so far (all runs).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A gRPC client over the unix socket.
    pub async fn client(&self) -> FabricAgentClient<Channel> {
        process::client(&self.socket).await
    }
}

/// The SM-host agent's config: OpenSM backend on the rig's files, Partitions served on TCP.
///
/// Port ownership checks are off here: under umad2sim a process routes each management class
/// to one umad fd, so the SA session of the check and this agent's SMP observer cannot share
/// the process. `tests/opensm/ownership.rs` runs the check with the embedded observer instead.
pub fn sm_config(fabric: &Fabric, port: u16) -> String {
    sm_config_with(
        fabric,
        port,
        "enabled = false\n",
        "kind = \"smp\"\nslow_poll_ms = 2000\n[reconciler]\nbackoff_max_ms = 1000\n",
    )
}

/// The SM-host agent's config with the given `[subnet_manager.opensm.ownership]` and
/// `[observer]` section bodies (the observer's may go on with further sections).
pub fn sm_config_with(fabric: &Fabric, port: u16, ownership: &str, observer: &str) -> String {
    let d = fabric.dir().display();
    format!(
        "node_id = \"smhost\"\nfabric = \"fab1\"\nstate_dir = \"{d}/smstate\"\n\
         [listen]\nunix_socket = \"{d}/smhost.sock\"\ntcp = \"127.0.0.1:{port}\"\ninsecure_plaintext_for_tests = true\n\
         [subnet_manager]\nbackend = \"opensm\"\n\
         [subnet_manager.opensm]\npartitions_file = \"{}\"\nlog_file = \"{d}/opensm.log\"\npid_file = \"{}\"\n\
         [subnet_manager.opensm.ownership]\n{ownership}\
         [observer]\n{observer}",
        fabric.partitions_path().display(),
        fabric.opensm_pid_path().display(),
    )
}

/// [`sm_config`] serving Partitions over mTLS instead of plaintext: `cert`/`key` the SM host's,
/// `ca` the client CA; nodes are `dns:<node>.nodes.fab1.example`, and `operators` (allowlist
/// entries, none: no `operator_clients` line) may revoke and list members.
pub fn sm_tls_config(
    fabric: &Fabric,
    port: u16,
    cert: &Path,
    key: &Path,
    ca: &Path,
    operators: &[&str],
) -> String {
    let operators = if operators.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = operators.iter().map(|o| format!("\"{o}\"")).collect();
        format!("operator_clients = [{}]\n", list.join(", "))
    };
    sm_config(fabric, port).replace(
        "insecure_plaintext_for_tests = true\n",
        &format!(
            "[listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             partitions_clients = [\"dns:*.nodes.fab1.example\"]\n{operators}\
             node_name_template = \"{{node}}.nodes.fab1.example\"\n",
            cert.display(),
            key.display(),
            ca.display()
        ),
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
