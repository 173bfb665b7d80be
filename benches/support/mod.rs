//! What the benchmark programs share: arguments, percentiles, a daemon started as a child
//! process (stopped by pid when dropped), and its memory and CPU from /proc.

#![allow(dead_code)] // each bench uses a part

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The daemon binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

/// `--name N` from the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    match arg_text(name) {
        None => default,
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} {v}: not a number")),
    }
}

/// `--name N` from the command line as a count, or `default`.
pub fn arg_usize(name: &str, default: usize) -> usize {
    usize::try_from(arg(name, default as u64)).unwrap_or(default)
}

/// `--name A,B,C` from the command line as counts, or `default` (same form). A value that is
/// not a list of numbers stops the bench with a message instead of measuring something else.
pub fn arg_list(name: &str, default: &str) -> Vec<usize> {
    let text = arg_text(name).unwrap_or_else(|| default.to_owned());
    text.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name} {text}: not a comma-separated list of counts"))
        })
        .collect()
}

/// `--name VALUE` from the command line, if given.
pub fn arg_text(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

/// The `p` quantile (0..=1) of `samples`, in any order (nearest rank on a sorted copy); None
/// when there are none.
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let last = sorted.len().checked_sub(1)?;
    let i = ((last as f64) * p.clamp(0.0, 1.0)).round() as usize;
    sorted.get(i).copied()
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A daemon on the embedded fabric in a temp dir, stopped (SIGTERM, by pid) when dropped.
pub struct BenchDaemon {
    child: Child,
    /// Its unix socket.
    pub socket: PathBuf,
    dir: tempfile::TempDir,
}

impl BenchDaemon {
    /// Starts the daemon with `extra` config appended and waits (30 s at most) until its
    /// socket answers.
    pub fn start(extra: &str) -> BenchDaemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("agent.sock");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "node_id = \"bench\"\nfabric = \"bench\"\nstate_dir = \"{}\"\n{extra}\n[listen]\nunix_socket = \"{}\"\n",
                dir.path().join("state").display(),
                socket.display()
            ),
        )
        .expect("write config");
        let child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("FABRIC_AGENT_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fabric-agent");
        let d = BenchDaemon { child, socket, dir };
        wait_for_socket(&d.socket);
        d
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its state directory (the store).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Waits up to 30 s for a unix socket to accept; panics with TIMEOUT after that.
pub fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(
            Instant::now() < deadline,
            "TIMEOUT: the daemon did not answer on {} within 30 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (VmRSS, VmHWM) of a process in kB; None once it has gone.
pub fn try_memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// (VmRSS, VmHWM) of a running process in kB.
pub fn memory(pid: u32) -> (u64, u64) {
    try_memory(pid).expect("the process's /proc status")
}

/// Bytes a process has caused to be written to storage (`write_bytes` of `/proc/<pid>/io`:
/// the store's pages and its fsyncs, not socket traffic).
pub fn written_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Total size of the files directly in `dir`, bytes.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// CPU seconds (user + system) a process has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    cpu_seconds_of(&pid.to_string())
}

/// CPU seconds (user + system) of `/proc/<which>`: a pid, or "self" for this process.
pub fn cpu_seconds_of(which: &str) -> f64 {
    let (user, system) = cpu_split_of(which);
    user + system
}

/// CPU seconds of a process, (user, system). System time includes the kernel's work done on
/// the process's behalf, such as waiting out page-cache writeback while it writes.
pub fn cpu_split(pid: u32) -> (f64, f64) {
    cpu_split_of(&pid.to_string())
}

fn cpu_split_of(which: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{which}/stat")).unwrap_or_default();
    let Some(end) = stat.rfind(')') else {
        return (0.0, 0.0);
    };
    // utime and stime are fields 14 and 15 overall, 11 and 12 after the comm.
    let f: Vec<&str> = stat[end + 2..].split_whitespace().collect();
    let ticks = |i: usize| -> u64 { f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (ticks(11) as f64 / hz, ticks(12) as f64 / hz)
}

/// One cycle: attach `instance` to `partition` waiting (up to `wait`) for ACTIVE, then release
/// it waiting for RELEASED; panics when either is not reached. Returns both latencies.
pub async fn cycle(
    c: &mut FabricAgentClient<Channel>,
    partition: pb::Partition,
    instance: &str,
    wait: Duration,
) -> (Duration, Duration) {
    let wait_ms = Some(u32::try_from(wait.as_millis()).unwrap_or(u32::MAX));
    let t = Instant::now();
    let a = c
        .attach_partition(pb::AttachPartitionRequest {
            partition: Some(partition),
            instance_id: instance.to_owned(),
            membership: pb::Membership::Full as i32,
            wait_ms,
            grant: None,
            ports: Vec::new(),
        })
        .await
        .expect("attach")
        .into_inner();
    let attached = t.elapsed();
    assert_eq!(
        a.attachment.map(|a| a.state).unwrap_or_default(),
        pb::AttachmentState::Active as i32,
        "{instance}: not ACTIVE within {wait:?}"
    );
    let t = Instant::now();
    let r = c
        .release_instance(pb::ReleaseInstanceRequest {
            instance_id: instance.to_owned(),
            wait_ms,
        })
        .await
        .expect("release")
        .into_inner();
    let released = t.elapsed();
    assert_eq!(
        r.attachment.map(|a| a.state).unwrap_or_default(),
        pb::AttachmentState::Released as i32,
        "{instance}: not RELEASED within {wait:?}"
    );
    (attached, released)
}
