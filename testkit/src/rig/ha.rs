//! Several SM hosts on one rig: a second OpenSM (standby by priority) on one of the fabric's
//! HCAs, with its own conf, log, partitions file, pid file and cache dir, and SM-host agents that
//! run outside the shim (they need no umad: their own ports are not observed), so that killing
//! one does not leak an ibsim client slot. The first OpenSM is the rig's own
//! ([`super::Fabric`]), started with [`ha_options`].

use super::process::{ChildGuard, DaemonProcess, BIN};
use super::{program, wait_for, Fabric, FabricOptions, UMAD2SIM};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// OpenSM settings both SMs share: the standby polls the master every second and takes over
/// after two missed polls.
pub const POLLING: [&str; 2] = ["sminfo_polling_timeout 1000", "polling_retry_number 2"];

/// The rig's own OpenSM as the master: priority 15, with [`POLLING`].
pub fn ha_options() -> FabricOptions {
    let mut opensm_conf = vec!["sm_priority 15".to_owned()];
    opensm_conf.extend(POLLING.iter().map(|s| (*s).to_owned()));
    FabricOptions {
        opensm_conf,
        start_timeout: None,
    }
}

/// A second (or third) OpenSM on HCA `node` (priority 10 unless started with
/// [`SecondSm::start_with_priority`]), in `<rig dir>/<node>-sm/`.
pub struct SecondSm {
    guard: Option<ChildGuard>,
    /// Its directory: `opensm.conf`, `opensm.log`, `partitions.conf`, `opensm.pid`.
    pub dir: PathBuf,
    node: String,
    sock_name: String,
}

impl SecondSm {
    /// Writes its conf and `partitions` as its partitions file, starts it under the shim as
    /// `node` and waits until its log says `Entering STANDBY state`.
    pub fn start(fabric: &Fabric, node: &str, partitions: &str) -> SecondSm {
        Self::start_with_priority(fabric, node, partitions, 10)
    }

    /// Like [`SecondSm::start`], with OpenSM's `sm_priority` set to `priority` (the rig's own
    /// OpenSM has 15): a third SM host's standby, for instance.
    pub fn start_with_priority(
        fabric: &Fabric,
        node: &str,
        partitions: &str,
        priority: u8,
    ) -> SecondSm {
        let dir = fabric.dir().join(format!("{node}-sm"));
        fs::create_dir_all(&dir).expect("second SM dir");
        fs::write(dir.join("partitions.conf"), partitions).expect("partitions");
        let mut conf = format!(
            "partition_config_file {}\nlog_file {}\ndump_files_dir {}\nforce_log_flush TRUE\nconsole off\nsm_priority {priority}\n",
            dir.join("partitions.conf").display(),
            dir.join("opensm.log").display(),
            dir.display()
        );
        for line in POLLING {
            conf.push_str(line);
            conf.push('\n');
        }
        fs::write(dir.join("opensm.conf"), conf).expect("conf");
        let mut sm = SecondSm {
            guard: None,
            dir,
            node: node.to_owned(),
            sock_name: fabric.sock_name().to_owned(),
        };
        sm.spawn();
        sm
    }

    /// Starts its process and writes its pid file.
    fn spawn_process(&mut self) {
        let child = super::opensm_process(&self.dir, &self.sock_name, &self.node);
        let guard = ChildGuard::new("second opensm", child);
        fs::write(self.pid_path(), format!("{}\n", guard.id())).expect("pid file");
        self.guard = Some(guard);
    }

    fn spawn(&mut self) {
        self.spawn_process();
        let log = self.log_path();
        wait_for(
            &self.dir,
            "the second OpenSM's STANDBY",
            Duration::from_secs(30),
            || {
                Ok(fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("Entering STANDBY state"))
            },
        );
    }

    /// Stops it by pid (SIGTERM, then SIGKILL) and starts it again with the same conf; waits
    /// until its log announces a state after this start (MASTER when no other SM is alive).
    pub fn restart(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            super::stall::keep_for_diagnosis(
                self.dir.parent().unwrap_or(&self.dir),
                Some(guard.id()),
                "second-sm",
            );
            super::free_slot_on_signal_death(&mut guard, &self.sock_name);
            guard.stop(Duration::from_secs(5));
        }
        let offset = self.log().len();
        self.spawn_process();
        let log = self.log_path();
        wait_for(
            &self.dir,
            "the restarted second OpenSM's state",
            Duration::from_secs(30),
            || {
                Ok(fs::read_to_string(&log)
                    .unwrap_or_default()
                    .get(offset..)
                    .is_some_and(|t| {
                        t.lines()
                            .any(|l| l.contains("Entering ") && l.ends_with(" state"))
                    }))
            },
        );
    }

    /// Stops it by pid without starting it again: SIGKILL when `crash`, else SIGTERM (then
    /// SIGKILL after a grace period); a death by signal frees its ibsim client slot.
    /// [`SecondSm::restart`] starts it again.
    pub fn stop(&mut self, crash: bool) {
        if let Some(mut guard) = self.guard.take() {
            super::free_slot_on_signal_death(&mut guard, &self.sock_name);
            if crash {
                guard.signal(nix::sys::signal::Signal::SIGKILL);
            }
            guard.stop(Duration::from_secs(5));
        }
    }

    /// Its pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.guard.as_ref().map(ChildGuard::id)
    }

    /// Whether its log shows a `SUBNET UP` after its last `Entering MASTER state`.
    pub fn swept_as_master(&self) -> bool {
        let log = self.log();
        log.contains("Entering MASTER state")
            && log
                .rsplit("Entering MASTER state")
                .next()
                .unwrap_or_default()
                .contains("SUBNET UP")
    }

    /// Its partitions file.
    pub fn partitions_path(&self) -> PathBuf {
        self.dir.join("partitions.conf")
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("opensm.log")
    }

    /// Its pid file.
    pub fn pid_path(&self) -> PathBuf {
        self.dir.join("opensm.pid")
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

/// Waits until the second OpenSM, now master, has swept (up to `limit` each time). Under ibsim
/// a new master sometimes stops sweeping for good right after the takeover (OpenSM 3.3.23 logs
/// nothing more and ignores SIGHUP); it is then stopped and started again (it reads the same
/// file, which its agent keeps; the ports keep their tables meanwhile), three times at most.
pub async fn await_new_master_sweep(standby: &mut SecondSm, limit: Duration) {
    for attempt in 1..=3 {
        let deadline = std::time::Instant::now() + limit;
        while !standby.swept_as_master() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if standby.swept_as_master() {
            return;
        }
        let log = standby.log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        assert!(attempt < 3, "the new master never swept: {tail:#?}");
        eprintln!("the new master stopped sweeping after the takeover; starting it again");
        standby.restart();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !is_master(&standby.log_path()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the restarted OpenSM never became master"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether OpenSM's log at `path` last announced MASTER.
pub fn is_master(path: &Path) -> bool {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .rev()
        .find(|l| l.contains("Entering ") && l.ends_with(" state"))
        .is_some_and(|l| l.contains("Entering MASTER state"))
}

/// An SM-host agent, stopped by pid when dropped: outside the shim ([`SmHostAgent::start`]),
/// or under it as one of the fabric's HCAs ([`SmHostAgent::start_as`], to read its SM's SMInfo
/// over umad; it then holds an ibsim client slot, which a SIGKILL leaks).
pub struct SmHostAgent {
    /// Its node id.
    pub name: String,
    /// Under the shim: (ibsim socket name, SIM_HOST, the rig's dir).
    sim: Option<(String, String, PathBuf)>,
    /// Its config file.
    pub config: PathBuf,
    /// Its unix socket.
    pub socket: PathBuf,
    /// Its log (appended across restarts).
    pub log: PathBuf,
    process: Option<DaemonProcess>,
}

impl SmHostAgent {
    /// Writes `<dir>/<name>.toml` with `config` and starts the agent.
    pub fn start(fabric: &Fabric, name: &str, config: &str) -> SmHostAgent {
        Self::start_with(fabric, name, None, config)
    }

    /// Like [`SmHostAgent::start`], but run under the shim as HCA `sim_host` (the one its
    /// OpenSM is bound to), so that it can read `/dev/infiniband/umad0`.
    pub fn start_as(fabric: &Fabric, name: &str, sim_host: &str, config: &str) -> SmHostAgent {
        Self::start_with(fabric, name, Some(sim_host), config)
    }

    fn start_with(
        fabric: &Fabric,
        name: &str,
        sim_host: Option<&str>,
        config: &str,
    ) -> SmHostAgent {
        let dir = fabric.dir();
        let path = dir.join(format!("{name}.toml"));
        fs::write(&path, config).expect("write SM-host agent config");
        let mut a = SmHostAgent {
            sim: sim_host.map(|h| (fabric.sock_name().to_owned(), h.to_owned(), dir.to_owned())),
            name: name.to_owned(),
            config: path,
            socket: dir.join(format!("{name}.sock")),
            log: dir.join(format!("{name}-agent.log")),
            process: None,
        };
        a.spawn();
        a
    }

    /// Starts the (stopped) agent again with the same config.
    pub fn spawn(&mut self) {
        assert!(self.process.is_none(), "{} is running", self.name);
        let mut cmd = Command::new(BIN);
        if let Some((sock, host, dir)) = &self.sim {
            cmd.env("LD_PRELOAD", UMAD2SIM)
                .env("SIM_HOST", host)
                .env("IBSIM_SOCKNAME", sock)
                .current_dir(dir);
        }
        cmd.env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .process_group(0);
        self.process = Some(DaemonProcess::start(
            cmd,
            &format!("{} agent", self.name),
            &self.config,
            &self.socket,
            &self.log,
        ));
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("running").pid()
    }

    /// SIGKILL by pid and reap.
    pub fn crash(&mut self) {
        self.process.take().expect("running").crash();
    }

    /// SIGTERM by pid and wait for the exit (under the shim, its ibsim slot is freed).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.process.take().expect("running").stop()
    }

    /// Its output so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Where an SM-host agent's OpenSM lives.
pub struct SmFiles<'a> {
    /// OpenSM's partitions file.
    pub partitions: &'a Path,
    /// OpenSM's log.
    pub log: &'a Path,
    /// OpenSM's pid file.
    pub pid: &'a Path,
    /// The agent's metrics port.
    pub metrics: u16,
}

/// The files of the rig's two SM hosts ([`start_two_sms`]): (partitions, log, pid) of the
/// master's (the rig's own OpenSM) and of the standby's, and each agent's metrics port.
pub struct TwoSmFiles {
    /// The master's: partitions, log, pid file.
    pub a: (PathBuf, PathBuf, PathBuf),
    /// The standby's.
    pub b: (PathBuf, PathBuf, PathBuf),
    /// The agents' metrics ports.
    pub metrics: (u16, u16),
}

impl TwoSmFiles {
    /// The files of `fabric`'s OpenSM and of `standby`; the agents' metrics on `metrics`.
    pub fn of(fabric: &Fabric, standby: &SecondSm, metrics: (u16, u16)) -> TwoSmFiles {
        TwoSmFiles {
            a: (
                fabric.partitions_path(),
                fabric.opensm_log_path(),
                fabric.opensm_pid_path(),
            ),
            b: (
                standby.partitions_path(),
                standby.log_path(),
                standby.pid_path(),
            ),
            metrics,
        }
    }

    /// The master's agent's [`SmFiles`].
    pub fn sm_a(&self) -> SmFiles<'_> {
        SmFiles {
            partitions: &self.a.0,
            log: &self.a.1,
            pid: &self.a.2,
            metrics: self.metrics.0,
        }
    }

    /// The standby's agent's [`SmFiles`].
    pub fn sm_b(&self) -> SmFiles<'_> {
        SmFiles {
            partitions: &self.b.0,
            log: &self.b.1,
            pid: &self.b.2,
            metrics: self.metrics.1,
        }
    }
}

/// An SM-host agent's config with peers: OpenSM backend on `files`, Partitions served in
/// plaintext on `port`, the peers' agents on `peers`, no port observed (a sysfs root without
/// devices).
pub fn ha_sm_config(
    fabric: &Fabric,
    name: &str,
    port: u16,
    files: &SmFiles,
    peers: &[u16],
) -> String {
    let d = fabric.dir().display();
    let empty = fabric.dir().join(format!("{name}-no-sysfs"));
    fs::create_dir_all(&empty).expect("empty sysfs root");
    let peers: Vec<String> = peers
        .iter()
        .map(|p| format!("\"http://127.0.0.1:{p}\""))
        .collect();
    format!(
        "node_id = \"{name}\"\nfabric = \"fab1\"\nstate_dir = \"{d}/{name}-state\"\n\
         [listen]\nunix_socket = \"{d}/{name}.sock\"\ntcp = \"127.0.0.1:{port}\"\ninsecure_plaintext_for_tests = true\n\
         [subnet_manager]\nbackend = \"opensm\"\n\
         [subnet_manager.opensm]\npartitions_file = \"{}\"\nlog_file = \"{}\"\npid_file = \"{}\"\n\
         [subnet_manager.opensm.ownership]\nenabled = false\n\
         [subnet_manager.opensm_ha]\npeers = [{}]\nsync_interval_ms = 500\ncatch_up_timeout_ms = 5000\n\
         [observer]\nkind = \"sysfs\"\nsysfs_root = \"{}\"\n\
         [reconciler]\nbackoff_max_ms = 1000\n\
         [metrics]\nenabled = true\nlisten = \"127.0.0.1:{}\"\n",
        files.partitions.display(),
        files.log.display(),
        files.pid.display(),
        peers.join(", "),
        empty.display(),
        files.metrics,
    )
}

/// `GET /metrics` on `port`.
pub fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    out
}

/// A node agent's config sending every apply to the SM-host agents on `ports`.
pub fn ha_node_config(fabric: &Fabric, node: &str, ports: &[u16]) -> String {
    let endpoints: Vec<String> = ports
        .iter()
        .map(|p| format!("\"http://127.0.0.1:{p}\""))
        .collect();
    super::agents::node_config(fabric, node, ports[0]).replace(
        &format!("endpoint = \"http://127.0.0.1:{}\"", ports[0]),
        &format!("endpoints = [{}]", endpoints.join(", ")),
    )
}

/// The agent's region of a partitions file (between the markers), or "" without one.
pub fn region_of(path: &Path) -> String {
    use fabric_agent::sm::opensm::region::{BEGIN_MARKER, END_MARKER};
    let text = fs::read_to_string(path).unwrap_or_default();
    match (text.find(BEGIN_MARKER), text.find(END_MARKER)) {
        (Some(b), Some(e)) if b < e => text[b..e].to_owned(),
        _ => String::new(),
    }
}

/// `node`'s port 1 P_Key table by `smpquery` on the fabric with ibsim socket `sock_name` and rig
/// dir `dir` (for a thread that polls while the test holds the [`Fabric`] mutably); `None` when
/// the query failed.
pub fn pkeys_of(sock_name: &str, dir: &Path, node: &str) -> Option<Vec<u16>> {
    let out = Command::new(program("smpquery"))
        .args(["-D", "pkeys", "0", "1"])
        .env("LD_PRELOAD", UMAD2SIM)
        .env("SIM_HOST", node)
        .env("IBSIM_SOCKNAME", sock_name)
        .current_dir(dir)
        .process_group(0)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            Some(super::parse_pkeys(&String::from_utf8_lossy(&o.stdout)))
        }
        _ => None,
    }
}

/// Starts the rig's own OpenSM again (after [`Fabric::stop_opensm`]) and waits until its log
/// announces a state after this start (`Entering ... state`), not for `SUBNET UP`: a returning
/// OpenSM may first be standby to the current master. `opensm.pid` gets the new pid.
pub fn restart_rig_opensm(fabric: &mut Fabric) {
    let dir = fabric.dir.path().to_owned();
    let log = dir.join("opensm.log");
    // Under load a restarted OpenSM was once seen printing and logging nothing at all for 20 s
    // (still attaching to ibsim): such a start is stopped by pid and made again (three tries).
    for attempt in 1..=3 {
        super::stall::keep_for_diagnosis(&dir, Some(fabric.opensm.id()), "rig-sm");
        fabric.opensm.stop(Duration::from_secs(5));
        let offset = fabric.opensm_log().len();
        let child = super::opensm_process(&dir, &fabric.sock_name, super::SM_HOST);
        fabric.opensm = ChildGuard::new("opensm", child);
        fs::write(dir.join("opensm.pid"), format!("{}\n", fabric.opensm.id())).expect("pid file");
        let announced = || {
            fs::read_to_string(&log)
                .unwrap_or_default()
                .get(offset..)
                .is_some_and(|t| {
                    t.lines()
                        .any(|l| l.contains("Entering ") && l.ends_with(" state"))
                })
        };
        let start = std::time::Instant::now();
        while !announced() && start.elapsed() < fabric.start_timeout {
            std::thread::sleep(Duration::from_millis(20));
        }
        if announced() {
            return;
        }
        eprintln!(
            "rig: attempt {attempt}: the restarted OpenSM announced no state; starting it again"
        );
    }
    panic!(
        "rig: the restarted OpenSM announced no state, three times\n{}",
        super::logs_of(&dir)
    );
}

/// Whether the rig's own OpenSM answers a SIGHUP with a `SUBNET UP` within `limit`.
pub fn master_sweeps(fabric: &Fabric, limit: Duration) -> bool {
    let offset = fabric.opensm_log().len();
    fabric.hup_opensm();
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if fabric
            .opensm_log()
            .get(offset..)
            .is_some_and(|t| t.contains("SUBNET UP"))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The rig (master OpenSM on the SM host, [`ha_options`]) plus a second OpenSM on HCA
/// `second` as standby, the master checked to still sweep after the standby joined. Under
/// ibsim the master sometimes stops sweeping for good right after the standby's trap 144
/// (seen here with OpenSM 3.3.23); such a start is torn down and tried again (three tries).
pub fn start_two_sms(
    spec: &super::FabricSpec,
    partitions: &str,
    second: &str,
) -> Option<(Fabric, SecondSm)> {
    for attempt in 1..=3 {
        let fabric = Fabric::start_with(spec, partitions, &ha_options())?;
        let standby = SecondSm::start(&fabric, second, partitions);
        std::thread::sleep(Duration::from_millis(300));
        if master_sweeps(&fabric, Duration::from_secs(20)) {
            return Some((fabric, standby));
        }
        eprintln!("rig: attempt {attempt}: the master OpenSM stopped sweeping after the standby joined; starting again");
        super::stall::keep_for_diagnosis(fabric.dir(), Some(fabric.opensm_pid()), "standby-join");
    }
    panic!("rig: the master OpenSM stopped sweeping after the standby joined, three times");
}

/// [`start_two_sms`] plus a third OpenSM, priority 5, on HCA `third` (a second standby), the
/// master checked to still sweep after it joined; torn down and tried again like
/// [`start_two_sms`] (three tries).
pub fn start_three_sms(
    spec: &super::FabricSpec,
    partitions: &str,
    second: &str,
    third: &str,
) -> Option<(Fabric, SecondSm, SecondSm)> {
    for attempt in 1..=3 {
        let (fabric, standby) = start_two_sms(spec, partitions, second)?;
        let last = SecondSm::start_with_priority(&fabric, third, partitions, 5);
        std::thread::sleep(Duration::from_millis(300));
        if master_sweeps(&fabric, Duration::from_secs(20)) {
            return Some((fabric, standby, last));
        }
        eprintln!("rig: attempt {attempt}: the master OpenSM stopped sweeping after the third SM joined; starting again");
        super::stall::keep_for_diagnosis(fabric.dir(), Some(fabric.opensm_pid()), "third-join");
    }
    panic!("rig: the master OpenSM stopped sweeping after the third SM joined, three times");
}

/// The SM-host agent's `GetNode` view of itself among several SM hosts.
pub async fn sm_host_status(agent: &SmHostAgent) -> fabric_agent::proto::agent::SmHostStatus {
    let mut c = super::process::client(&agent.socket).await;
    c.get_node(fabric_agent::proto::agent::GetNodeRequest {})
        .await
        .expect("GetNode")
        .into_inner()
        .subnet_manager
        .and_then(|s| s.sm_host)
        .expect("an SM host with peers shows sm_host")
}

/// What `sminfo -D 0` (infiniband-diags) says of the SM bound to HCA `node`'s own port, in
/// GetNode's words ("master", "standby", "discovering", "not-active"); `Err` when it failed
/// (no SM answers on that port).
pub fn sminfo_state(fabric: &Fabric, node: &str) -> Result<String, String> {
    let out = fabric.run_tool(node, "sminfo", &["-D", "0"])?;
    let state = out.split_whitespace().last().unwrap_or_default();
    Ok(match state {
        "SMINFO_MASTER" => "master",
        "SMINFO_STANDBY" => "standby",
        "SMINFO_DISCOVERING" => "discovering",
        "SMINFO_NOTACTIVE" => "not-active",
        other => return Err(format!("sminfo said {out:?} ({other})")),
    }
    .to_owned())
}

/// A config of [`ha_sm_config`] (one peer) that reads its SM's role over SMInfo on the shim's
/// `/dev/infiniband/umad0` (run the agent with [`SmHostAgent::start_as`]) and fences that peer
/// on physical evidence: this host states `host_name`, the peer states `peer_name`, and its
/// OpenSM is bound to port `peer_guid`; its SM is checked once its agent has been silent for
/// `fence_after_ms`.
pub fn with_fencing(
    config: String,
    host_name: &str,
    peer_name: &str,
    peer_guid: u64,
    fence_after_ms: u64,
) -> String {
    with_fencing_peers(config, host_name, &[(peer_name, peer_guid)], fence_after_ms)
}

/// [`with_fencing`] for any number of peers: `peers` holds each peer's (stated name, SM port
/// GUID), in the order of the config's `peers` endpoints.
pub fn with_fencing_peers(
    config: String,
    host_name: &str,
    peers: &[(&str, u64)],
    fence_after_ms: u64,
) -> String {
    let names: Vec<String> = peers.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    let guids: Vec<String> = peers
        .iter()
        .map(|(_, g)| format!("\"{g:#018x}\""))
        .collect();
    let out = config.replace(
        "sync_interval_ms = 500\n",
        &format!(
            "sync_interval_ms = 500\nsminfo_umad_device = \"/dev/infiniband/umad0\"\n\
             host_name = \"{host_name}\"\npeer_host_names = [{}]\n\
             peer_sm_port_guids = [{}]\nfence_after_ms = {fence_after_ms}\n",
            names.join(", "),
            guids.join(", ")
        ),
    );
    assert!(out.contains("peer_sm_port_guids"), "{config}");
    out
}

/// The conditions (kind, detail) an agent's `GetNode` shows.
pub async fn conditions_of(socket: &Path) -> Vec<(String, String)> {
    super::process::client(socket)
        .await
        .get_node(fabric_agent::proto::agent::GetNodeRequest {})
        .await
        .expect("GetNode")
        .into_inner()
        .conditions
        .into_iter()
        .map(|c| (c.kind, c.detail))
        .collect()
}
