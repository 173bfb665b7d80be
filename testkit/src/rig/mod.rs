//! The InfiniBand test fabric: `ibsim` (simulated switches and HCAs) plus a real OpenSM, with
//! clients attached through the umad2sim shim. Every rig lives in its own temp dir with its own
//! ibsim socket name, so tests run in parallel; every process it starts is stopped by pid when
//! the [`Fabric`] drops (success, failure or panic).
//!
//! ```ignore
//! use testkit::rig;
//! let Some(fabric) = rig::Fabric::start(&rig::FabricSpec::new(2, 4), rig::DEFAULT_PARTITIONS) else { return };
//! let keys = fabric.pkeys("node1");
//! fabric.set_partitions("Default=0x7fff : ALL=full ;\nt=0x8001 : ALL=full ;\n");
//! let mut agent = fabric.client_command("node1", "fabric-agent");   // SIM_HOST + LD_PRELOAD set
//! ```
//!
//! Limits of ibsim to keep in mind: at most 10 clients at once (OpenSM takes one, every
//! `smpquery` briefly another), and a client killed by a signal keeps its slot until
//! [`ibsim_slots::IbsimSlots::free_dead`] frees it: the rig's guards (OpenSMs, agents) do so
//! whenever they find their process dead by a signal.

pub mod agents;
pub mod first_read;
pub mod flap;
pub mod ha;
pub mod ibsim_slots;
pub mod link;
pub mod loopback;
mod preload;
pub use crate::common::process;
pub use process::{ChildGuard, SignalDeathHook};
pub mod proxy;
pub mod restarts;
mod smp_text;
use smp_text::{dec_field, hex_field};
pub use smp_text::{parse_pkeys, parse_subnet_dump, text_field, SmpNodeInfo, SmpPortInfo};
pub mod stall;
pub mod two_hca;

use fabric_agent::sys::process::with_default_signals;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The umad2sim shim.
pub const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";
/// A partitions file with only the default partition, everyone a full member.
pub const DEFAULT_PARTITIONS: &str = "Default=0x7fff : ALL=full ;\n";
/// A partitions file an SM-host agent serves tenant keys with: ports are limited members of the
/// default partition (the SM's own port full), so tenants cannot reach each other through it.
pub const LIMITED_DEFAULT_PARTITIONS: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";
/// Name of the node OpenSM runs on (the first node of the net file).
pub const SM_HOST: &str = "smhost";

const IBSIM: &str = "ibsim";
const OPENSM: &str = "opensm";

/// Most nodes (HCAs and switches together) one ibsim accepts (`MaxNetNodes`, printed at start).
pub const IBSIM_MAX_NODES: usize = 2048;

/// The shape of a fabric: one SM host HCA and `hcas` HCAs named `node1`..`nodeN`, either spread
/// round-robin over `switches` switches in a chain ([`FabricSpec::new`]), or `per_leaf` to a
/// leaf switch under one spine ([`FabricSpec::leaf_spine`], for fabrics of hundreds or
/// thousands of HCAs: every HCA is three hops from every other).
#[derive(Debug, Clone)]
pub struct FabricSpec {
    /// Number of switches (at least 1), spine included.
    pub switches: usize,
    /// Number of HCAs besides the SM host.
    pub hcas: usize,
    /// Leaf-spine shape: end ports per leaf switch (the SM host counts as one).
    pub per_leaf: Option<usize>,
    /// NodeDescriptions other than the node's name, by node name (ibsim takes a node's
    /// NodeDescription from a `# "..."` comment after its header line).
    pub descriptions: std::collections::BTreeMap<String, String>,
}

/// One cable end: (node, port, peer, peer port).
type Link = (String, u32, String, u32);

fn cable(links: &mut Vec<Link>, a: &str, a_port: u32, b: &str, b_port: u32) {
    links.push((a.to_owned(), a_port, b.to_owned(), b_port));
    links.push((b.to_owned(), b_port, a.to_owned(), a_port));
}

impl FabricSpec {
    /// A chain of `switches` switches with the HCAs spread round-robin.
    pub fn new(switches: usize, hcas: usize) -> FabricSpec {
        FabricSpec {
            switches: switches.max(1),
            hcas,
            per_leaf: None,
            descriptions: Default::default(),
        }
    }

    /// One spine switch over leaf switches of `per_leaf` end ports each (SM host first).
    pub fn leaf_spine(hcas: usize, per_leaf: usize) -> FabricSpec {
        let per_leaf = per_leaf.max(1);
        let leaves = (hcas + 1).div_ceil(per_leaf);
        FabricSpec {
            switches: leaves + 1,
            hcas,
            per_leaf: Some(per_leaf),
            descriptions: Default::default(),
        }
    }

    /// HCAs, switches and the SM host: what counts against [`IBSIM_MAX_NODES`].
    pub fn node_count(&self) -> usize {
        1 + self.hcas + self.switches
    }

    /// HCA names, SM host excluded.
    pub fn hca_names(&self) -> Vec<String> {
        (1..=self.hcas).map(|i| format!("node{i}")).collect()
    }

    /// Switch names and their cables: `sw1..swN` in a chain, or `spine` + `leaf1..leafN`.
    fn switches_and_links(&self) -> (Vec<(String, u32)>, Vec<Link>) {
        let mut ends = vec![SM_HOST.to_owned()];
        ends.extend(self.hca_names());
        let mut links = Vec::new();
        match self.per_leaf {
            Some(per_leaf) => {
                let leaves = self.switches - 1;
                let uplink = per_leaf as u32 + 1;
                for (i, end) in ends.iter().enumerate() {
                    let leaf = format!("leaf{}", i / per_leaf + 1);
                    cable(&mut links, &leaf, (i % per_leaf) as u32 + 1, end, 1);
                }
                let mut switches = vec![("spine".to_owned(), leaves.max(2) as u32)];
                for l in 1..=leaves {
                    let leaf = format!("leaf{l}");
                    cable(&mut links, &leaf, uplink, "spine", l as u32);
                    switches.push((leaf, uplink));
                }
                (switches, links)
            }
            None => {
                let switch = |i: usize| format!("sw{}", i + 1);
                let mut next_port = vec![1u32; self.switches];
                for (i, end) in ends.iter().enumerate() {
                    // The SM host and node1 share sw1, then round-robin.
                    let sw = i.saturating_sub(1) % self.switches;
                    cable(&mut links, &switch(sw), next_port[sw], end, 1);
                    next_port[sw] += 1;
                }
                let ports = next_port.iter().copied().max().unwrap_or(1) + 1;
                for sw in 0..self.switches.saturating_sub(1) {
                    // Inter-switch links use the two highest ports.
                    cable(&mut links, &switch(sw), ports, &switch(sw + 1), ports - 1);
                }
                let switches = (0..self.switches).map(|i| (switch(i), ports)).collect();
                (switches, links)
            }
        }
    }

    /// The ibsim net file: `Switch N "name"` / `Hca 1 "name"` records of
    /// `[port] "peer"[peer port]` lines, separated by blank lines, SM host first.
    pub fn net_file(&self) -> String {
        let (switches, links) = self.switches_and_links();
        let mut by_node: std::collections::HashMap<&str, Vec<&Link>> = Default::default();
        for l in &links {
            by_node.entry(l.0.as_str()).or_default().push(l);
        }
        let mut nodes: Vec<(String, String)> = vec![(SM_HOST.to_owned(), "Hca 1".to_owned())];
        for (name, ports) in switches {
            nodes.push((name, format!("Switch {ports}")));
        }
        for name in self.hca_names() {
            nodes.push((name, "Hca 1".to_owned()));
        }
        let mut out = String::new();
        for (name, header) in nodes {
            match self.descriptions.get(&name) {
                Some(d) => out.push_str(&format!("{header} \"{name}\" # \"{d}\"\n")),
                None => out.push_str(&format!("{header} \"{name}\"\n")),
            }
            let mut own = by_node.remove(name.as_str()).unwrap_or_default();
            own.sort_by_key(|l| l.1);
            for (_, port, peer, peer_port) in own {
                out.push_str(&format!("[{port}] \"{peer}\"[{peer_port}]\n"));
            }
            out.push('\n');
        }
        out
    }
}

/// Whether ibsim, OpenSM and the shim are installed. Without them a test is skipped with a
/// message, except under CI (env `CI` set), where the rig panics.
pub fn available() -> bool {
    let found = |p: &str| {
        std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|d| d.join(p).is_file()))
            .unwrap_or(false)
    };
    let ok = (found(IBSIM) || Path::new("/usr/bin/ibsim").is_file())
        && (found(OPENSM) || Path::new("/usr/sbin/opensm").is_file())
        && Path::new(UMAD2SIM).is_file();
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("CI: ibsim, opensm or umad2sim is missing (install ibsim-utils and opensm)");
        }
        eprintln!("skipping: ibsim, opensm or umad2sim not installed");
    }
    ok
}

fn program(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(name)
}

/// How to start a fabric besides its shape.
#[derive(Debug, Clone, Default)]
pub struct FabricOptions {
    /// Extra `opensm.conf` lines (`key value`); a key the rig also sets is replaced.
    pub opensm_conf: Vec<String>,
    /// Deadline for ibsim's start and each OpenSM start's `SUBNET UP`; default 20 s plus
    /// 20 ms per node.
    pub start_timeout: Option<Duration>,
}

/// A running fabric: ibsim + OpenSM in a temp dir of their own.
pub struct Fabric {
    // Field order is drop order: OpenSM before ibsim, the temp dir last.
    opensm: ChildGuard,
    _ibsim: ChildGuard,
    console: File,
    slots: ibsim_slots::IbsimSlots,
    spec: FabricSpec,
    start_timeout: Duration,
    sock_name: String,
    dir: tempfile::TempDir,
}

static RIGS: AtomicUsize = AtomicUsize::new(0);

/// The last `lines` lines of a file (or why it cannot be read).
fn tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({e})"),
    }
}

/// The tails of OpenSM's log and output and of ibsim's output in `dir`: what a failed start
/// or wait prints.
pub fn logs_of(dir: &Path) -> String {
    let mut out = String::new();
    for (name, lines) in [("opensm.log", 25), ("opensm.out", 10), ("ibsim.log", 10)] {
        out.push_str(&format!(
            "--- tail of {} ---\n{}\n",
            dir.join(name).display(),
            tail(&dir.join(name), lines)
        ));
    }
    out
}

/// Polls `done` every 20 ms until it holds; past `timeout` (or when `done` returns an error)
/// panics with `TIMEOUT`/the error and the tails of the fabric's logs in `dir`.
fn wait_for(
    dir: &Path,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, String>,
) {
    let start = Instant::now();
    loop {
        match done() {
            Ok(true) => return,
            Ok(false) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            Ok(false) => panic!(
                "rig: TIMEOUT after {:.1} s waiting for {what}\n{}",
                timeout.as_secs_f64(),
                logs_of(dir)
            ),
            Err(e) => panic!("rig: {e} while waiting for {what}\n{}", logs_of(dir)),
        }
    }
}

/// `opensm.conf`: the rig's settings, each replaced by an `extra` line with the same key.
fn opensm_conf(dir: &Path, extra: &[String]) -> String {
    let base = [
        format!(
            "partition_config_file {}",
            dir.join("partitions.conf").display()
        ),
        format!("log_file {}", dir.join("opensm.log").display()),
        format!("dump_files_dir {}", dir.display()),
        "force_log_flush TRUE".to_owned(),
        "console off".to_owned(),
    ];
    let key = |l: &str| l.split_whitespace().next().unwrap_or_default().to_owned();
    let mut out = String::new();
    for line in &base {
        if !extra.iter().any(|e| key(e) == key(line)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    for line in extra {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Spawns OpenSM under the shim (after the umad timeout interposer: [`preload::opensm_preload`]) as
/// `sim_host` with `dir/opensm.conf`, its cache and output in `dir`, in its own process group.
fn opensm_process(dir: &Path, sock_name: &str, sim_host: &str) -> std::process::Child {
    let out = File::create(dir.join("opensm.out")).expect("opensm.out");
    // Default dispositions: SIGHUP (a heavy sweep) and SIGTERM must reach it even when the
    // tests run with them ignored (under nohup).
    with_default_signals(&mut Command::new(program(OPENSM)))
        .arg("-F")
        .arg(dir.join("opensm.conf"))
        .env("IBSIM_SOCKNAME", sock_name)
        .env("SIM_HOST", sim_host)
        .env("LD_PRELOAD", preload::opensm_preload())
        .env("OSM_CACHE_DIR", dir)
        .env("OSM_TMP_DIR", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("opensm.out"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("spawn opensm")
}

/// Starts OpenSM on the SM host with the rig's `opensm.conf`, waits (up to `timeout`) until its
/// log shows one more "SUBNET UP" after byte `log_offset` (the log may also have been
/// truncated), and writes its pid to `opensm.pid`.
fn spawn_opensm(dir: &Path, sock_name: &str, log_offset: usize, timeout: Duration) -> ChildGuard {
    let mut opensm = ChildGuard::new("opensm", opensm_process(dir, sock_name, SM_HOST));
    free_slot_on_signal_death(&mut opensm, sock_name);
    let fabric_log = dir.join("opensm.log");
    wait_for(dir, "OpenSM's SUBNET UP", timeout, || {
        if opensm.exited() {
            return Err("opensm exited".into());
        }
        let text = fs::read_to_string(&fabric_log).unwrap_or_default();
        Ok(text
            .get(log_offset..)
            .unwrap_or(&text)
            .contains("SUBNET UP"))
    });
    fs::write(dir.join("opensm.pid"), format!("{}\n", opensm.id())).expect("write opensm.pid");
    opensm
}

/// Makes `guard` (a process under the shim of the rig serving `sock_name`) free dead clients'
/// ibsim slots when it finds its process dead by a signal.
pub fn free_slot_on_signal_death(guard: &mut ChildGuard, sock_name: &str) {
    if let Some(slots) = ibsim_slots::IbsimSlots::for_socket(sock_name) {
        guard.set_on_signal_death(slots.hook());
    }
}

impl Fabric {
    /// Starts ibsim on the spec's net file and OpenSM on the SM host with `partitions` as
    /// its partitions file, and waits for "SUBNET UP". `None` when the tools are missing
    /// (and CI is not set).
    pub fn start(spec: &FabricSpec, partitions: &str) -> Option<Fabric> {
        Self::start_with(spec, partitions, &FabricOptions::default())
    }

    /// Like [`Fabric::start`], with extra OpenSM settings and deadlines. Panics, printing the
    /// tails of OpenSM's and ibsim's logs, when a process exits or a deadline passes.
    pub fn start_with(
        spec: &FabricSpec,
        partitions: &str,
        options: &FabricOptions,
    ) -> Option<Fabric> {
        if !available() {
            return None;
        }
        assert!(
            spec.node_count() <= IBSIM_MAX_NODES,
            "rig: {} nodes (HCAs, switches, SM host) but ibsim accepts at most {IBSIM_MAX_NODES}",
            spec.node_count()
        );
        let start_timeout = options.start_timeout.unwrap_or(
            Duration::from_secs(20) + Duration::from_millis(20) * spec.node_count() as u32,
        );
        let dir = tempfile::Builder::new()
            .prefix("fabric-rig-")
            .tempdir()
            .expect("temp dir");
        let sock_name = format!(
            "farig{}x{}",
            std::process::id(),
            RIGS.fetch_add(1, Ordering::SeqCst)
        );
        let net = dir.path().join("net");
        fs::write(&net, spec.net_file()).expect("write net file");
        fs::write(dir.path().join("partitions.conf"), partitions).expect("write partitions");

        // ibsim's console reads stdin and spins at EOF: give it a FIFO it holds open for
        // writing itself (O_RDWR), so EOF never comes; we keep a write end for commands.
        let fifo = dir.path().join("console");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let stdin = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .expect("open fifo");
        let console = OpenOptions::new()
            .write(true)
            .open(&fifo)
            .expect("open fifo writer");
        let ibsim_log = dir.path().join("ibsim.log");
        let log = File::create(&ibsim_log).expect("ibsim log");
        let mut ibsim = Command::new(program(IBSIM));
        if stall::keep_dir().is_some() {
            ibsim.arg("-v");
        }
        let ibsim = with_default_signals(&mut ibsim)
            .arg("-s")
            .arg(&net)
            .env("IBSIM_SOCKNAME", &sock_name)
            .current_dir(dir.path())
            .stdin(stdin)
            .stdout(log.try_clone().expect("ibsim log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("spawn ibsim");
        let mut ibsim = ChildGuard::new("ibsim", ibsim);
        wait_for(dir.path(), "ibsim's start", start_timeout, || {
            if ibsim.exited() {
                return Err("ibsim exited".into());
            }
            Ok(fs::read_to_string(&ibsim_log)
                .map(|t| t.contains("Network simulator ready"))
                .unwrap_or(false))
        });
        fs::write(
            dir.path().join("opensm.conf"),
            opensm_conf(dir.path(), &options.opensm_conf),
        )
        .expect("write opensm.conf");
        let slots = ibsim_slots::IbsimSlots::new(
            &sock_name,
            console.try_clone().expect("console writer"),
            &ibsim_log,
        );
        let opensm = spawn_opensm(dir.path(), &sock_name, 0, start_timeout);
        Some(Fabric {
            opensm,
            _ibsim: ibsim,
            console,
            slots,
            spec: spec.clone(),
            start_timeout,
            sock_name,
            dir,
        })
    }

    /// The fabric's shape.
    pub fn spec(&self) -> &FabricSpec {
        &self.spec
    }

    /// HCA names, SM host excluded.
    pub fn hcas(&self) -> Vec<String> {
        self.spec.hca_names()
    }

    /// The temp dir everything runs in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The ibsim socket name every client must use.
    pub fn sock_name(&self) -> &str {
        &self.sock_name
    }

    /// OpenSM's pid.
    pub fn opensm_pid(&self) -> u32 {
        self.opensm.id()
    }

    /// The file holding OpenSM's current pid (rewritten by every (re)start).
    pub fn opensm_pid_path(&self) -> PathBuf {
        self.dir.path().join("opensm.pid")
    }

    /// Stops OpenSM by pid: SIGTERM (then SIGKILL after a grace period), or SIGKILL right away
    /// when `crash`; a death by signal frees its ibsim slot. The fabric's ports keep their
    /// tables.
    pub fn stop_opensm(&mut self, crash: bool) {
        // The guard may come from `ha::restart_rig_opensm`, which sets no hook.
        self.opensm.set_on_signal_death(self.slots.hook());
        if crash {
            self.opensm.signal(nix::sys::signal::Signal::SIGKILL);
        }
        self.opensm.stop(Duration::from_secs(5));
    }

    /// SIGKILLs OpenSM by pid and leaves it unreaped (a zombie until [`Fabric::restart_opensm`]
    /// or drop): signals to its pid still "succeed", as with a real SM host whose init does not
    /// reap. The fabric's ports keep their tables.
    pub fn kill_opensm_unreaped(&self) {
        self.opensm.signal(nix::sys::signal::Signal::SIGKILL);
    }

    /// Starts OpenSM again with the same conf (after [`Fabric::stop_opensm`], or stopping the
    /// running one first) and waits for its "SUBNET UP"; `opensm.pid` gets the new pid.
    pub fn restart_opensm(&mut self) {
        self.opensm.set_on_signal_death(self.slots.hook());
        self.opensm.stop(Duration::from_secs(5));
        let offset = self.opensm_log().len();
        self.opensm = spawn_opensm(self.dir.path(), &self.sock_name, offset, self.start_timeout);
    }

    /// OpenSM's partitions file.
    pub fn partitions_path(&self) -> PathBuf {
        self.dir.path().join("partitions.conf")
    }

    /// OpenSM's log so far.
    pub fn opensm_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("opensm.log")).unwrap_or_default()
    }

    /// Replaces the partitions file (temp file + rename) and SIGHUPs OpenSM.
    pub fn set_partitions(&self, text: &str) {
        let tmp = self.dir.path().join("partitions.conf.tmp");
        fs::write(&tmp, text).expect("write partitions");
        fs::rename(&tmp, self.partitions_path()).expect("rename partitions");
        self.hup_opensm();
    }

    /// Sends SIGHUP to OpenSM (a heavy sweep that re-reads the partitions file).
    pub fn hup_opensm(&self) {
        self.opensm.signal(nix::sys::signal::Signal::SIGHUP);
    }

    /// ibsim's client slots: who is attached, and freeing dead clients' slots.
    pub fn ibsim_slots(&self) -> &ibsim_slots::IbsimSlots {
        &self.slots
    }

    /// Another write end of ibsim's console (for a thread that sends commands, e.g.
    /// [`flap::LinkFlapper`]).
    pub fn ibsim_console_writer(&self) -> io::Result<File> {
        self.console.try_clone()
    }

    /// Sends one command to ibsim's console (e.g. `Unlink "node3"`).
    pub fn ibsim_console(&mut self, command: &str) -> io::Result<()> {
        writeln!(self.console, "{command}")
    }

    /// A command that runs `program` as node `node` of this fabric: LD_PRELOAD of the shim,
    /// SIM_HOST, IBSIM_SOCKNAME, working directory = the rig's temp dir (the shim writes a
    /// `sys-<pid>` dir there), its own process group and default dispositions for SIGHUP, SIGINT
    /// and SIGTERM. Stop such a client with SIGTERM only
    /// if it handles it; a client killed by a signal leaks an ibsim slot.
    pub fn client_command(&self, node: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        with_default_signals(&mut cmd)
            .env("LD_PRELOAD", UMAD2SIM)
            .env("SIM_HOST", node)
            .env("IBSIM_SOCKNAME", &self.sock_name)
            .current_dir(self.dir.path())
            .process_group(0);
        cmd
    }

    /// Runs a diagnostic tool (`smpquery`, `saquery`, ...) as `node`, returning its stdout.
    pub fn run_tool(&self, node: &str, tool: &str, args: &[&str]) -> Result<String, String> {
        let out: Output = self
            .client_command(node, program(tool))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{tool} {args:?} as {node}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `smpquery -D <attribute> 0 [args]` as `node` (its own port, directed route).
    pub fn smpquery(&self, node: &str, attribute: &str, extra: &[&str]) -> String {
        let mut args = vec!["-D", attribute, "0"];
        args.extend_from_slice(extra);
        self.run_tool(node, "smpquery", &args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// NodeInfo of `node` as smpquery reports it.
    pub fn node_info(&self, node: &str) -> SmpNodeInfo {
        let text = self.smpquery(node, "nodeinfo", &[]);
        SmpNodeInfo {
            node_guid: hex_field(&text, "Guid"),
            port_guid: hex_field(&text, "PortGuid"),
            partition_cap: dec_field(&text, "PartCap") as u16,
            local_port: dec_field(&text, "LocalPort") as u8,
        }
    }

    /// PortInfo of `node`'s port 1 as smpquery reports it.
    pub fn port_info(&self, node: &str) -> SmpPortInfo {
        let text = self.smpquery(node, "portinfo", &["1"]);
        SmpPortInfo {
            lid: dec_field(&text, "Lid") as u16,
            sm_lid: dec_field(&text, "SMLid") as u16,
            state: text_field(&text, "LinkState"),
        }
    }

    /// The whole P_Key table of `node`'s port 1 as smpquery reports it (empty slots included).
    pub fn pkeys(&self, node: &str) -> Vec<u16> {
        parse_pkeys(&self.smpquery(node, "pkeys", &["1"]))
    }

    /// `saquery -p --src-to-dst SLID:DLID` as `node`: the P_Key of the path, or `None` when the
    /// SA answers with no path (the ports share no partition). A query that fails (e.g. times
    /// out right after OpenSM restarted) is retried a few times, then panics: `None` always
    /// means the SA's answer.
    pub fn path_pkey(&self, node: &str, slid: u16, dlid: u16) -> Option<u16> {
        let pair = format!("{slid}:{dlid}");
        let mut tries = 0;
        let text = loop {
            match self.run_tool(node, "saquery", &["-p", "--src-to-dst", &pair]) {
                Ok(text) => break text,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("rig: {}; retrying", e.trim_end());
                    std::thread::sleep(Duration::from_millis(300));
                }
                Err(e) => panic!("{e}"),
            }
        };
        text.lines()
            .find(|l| l.trim_start().starts_with("pkey"))
            .and_then(|l| l.rsplit('.').next())
            .and_then(|v| u16::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
    }

    /// OpenSM's log file.
    pub fn opensm_log_path(&self) -> PathBuf {
        self.dir.path().join("opensm.log")
    }

    /// Every HCA port OpenSM's subnet dump (`opensm-subnet.lst`, written at the end of each
    /// sweep) lists: node name -> (port GUID, LID). Waits up to the start deadline for a dump
    /// listing the SM host and every HCA of the spec: one file read instead of two SMPs per
    /// node.
    pub fn ports(&self) -> std::collections::BTreeMap<String, (u64, u16)> {
        let path = self.dir.path().join("opensm-subnet.lst");
        let want = self.spec.hcas + 1;
        let mut ports = Default::default();
        wait_for(
            self.dir.path(),
            "a subnet dump listing every HCA",
            self.start_timeout,
            || {
                ports = parse_subnet_dump(&fs::read_to_string(&path).unwrap_or_default());
                Ok(ports.len() >= want)
            },
        );
        ports
    }

    /// The P_Key table of port 1 of the port at `lid`, read by a LID-routed SMP sent from
    /// `from` (`smpquery pkeys <lid> 1`).
    pub fn pkeys_at(&self, from: &str, lid: u16) -> Result<Vec<u16>, String> {
        self.run_tool(from, "smpquery", &["pkeys", &lid.to_string(), "1"])
            .map(|text| parse_pkeys(&text))
    }

    /// The P_Key tables of the ports at `lids`, read by `readers` concurrent `smpquery`
    /// clients (each sent from a different HCA: ibsim serves at most 10 clients at once and
    /// OpenSM holds one). One result per LID, in order.
    pub fn pkeys_parallel(&self, lids: &[u16], readers: usize) -> Vec<Result<Vec<u16>, String>> {
        let readers = readers.clamp(1, 6);
        let chunk = lids.len().div_ceil(readers).max(1);
        let hcas = self.hcas();
        std::thread::scope(|scope| {
            let handles: Vec<_> = lids
                .chunks(chunk)
                .enumerate()
                .map(|(i, part)| {
                    let from = hcas.get(i).map_or(SM_HOST, String::as_str);
                    scope.spawn(move || {
                        part.iter()
                            .map(|lid| self.pkeys_at(from, *lid))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("reader thread"))
                .collect()
        })
    }

    /// `sys-<pid>` dirs the shim left in the rig's dir (should be only OpenSM's).
    pub fn shim_litter(&self) -> Vec<String> {
        fs::read_dir(self.dir.path())
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("sys-"))
                    .collect()
            })
            .unwrap_or_default()
    }
}
