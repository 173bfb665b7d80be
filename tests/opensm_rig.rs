//! A small private rig: ibsim + OpenSM under the umad2sim shim in a temp dir, and `smpquery`
//! checks. Used by `opensm_real.rs` and the `opensm_commit` bench (through `#[path]`).
//! Every process it starts it stops by pid when dropped.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The umad2sim shim.
pub const SHIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

/// Whether ibsim, OpenSM, smpquery and the shim are installed.
pub fn available() -> bool {
    Path::new(SHIM).exists()
        && ["ibsim", "opensm", "smpquery"].iter().all(|b| {
            Command::new("sh")
                .args(["-c", &format!("command -v {b}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// An ibsim net file: `hcas` single-port HCAs named h1..hN under leaf switches of 24 HCAs,
/// leaves joined by one spine switch. h1 is the SM host.
pub fn net_file(hcas: usize) -> String {
    const PER_LEAF: usize = 24;
    let leaves = hcas.div_ceil(PER_LEAF);
    let mut s = String::new();
    if leaves > 1 {
        s.push_str(&format!("Switch {} \"spine\"\n", leaves.max(2)));
        for l in 0..leaves {
            s.push_str(&format!(
                "[{}] \"leaf{}\"[{}]\n",
                l + 1,
                l + 1,
                PER_LEAF + 1
            ));
        }
        s.push('\n');
    }
    for l in 0..leaves {
        s.push_str(&format!("Switch {} \"leaf{}\"\n", PER_LEAF + 1, l + 1));
        for i in 0..PER_LEAF {
            let h = l * PER_LEAF + i + 1;
            if h > hcas {
                break;
            }
            s.push_str(&format!("[{}] \"h{h}\"[1]\n", i + 1));
        }
        if leaves > 1 {
            s.push_str(&format!("[{}] \"spine\"[{}]\n", PER_LEAF + 1, l + 1));
        }
        s.push('\n');
    }
    for h in 1..=hcas {
        let l = (h - 1) / PER_LEAF;
        let port = (h - 1) % PER_LEAF + 1;
        s.push_str(&format!(
            "Hca 1 \"h{h}\"\n[1] \"leaf{}\"[{port}]\n\n",
            l + 1
        ));
    }
    s
}

struct Proc {
    child: Child,
    name: &'static str,
}

impl Proc {
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{} did not stop on SIGTERM; killing pid {}",
            self.name,
            self.child.id()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running ibsim + OpenSM.
pub struct Fabric {
    pub dir: tempfile::TempDir,
    pub sock: String,
    pub partitions: PathBuf,
    pub log: PathBuf,
    pub pid_file: PathBuf,
    // Held open so ibsim's console never sees EOF.
    _console: File,
    opensm: Option<Proc>,
    ibsim: Option<Proc>,
}

fn wait_for(path: &Path, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

impl Fabric {
    /// Starts ibsim with `hcas` HCAs and OpenSM on h1 reading `partitions` (written first).
    pub fn start(hcas: usize, partitions: &str) -> Fabric {
        Self::start_with(hcas, partitions, "")
    }

    /// Like [`Fabric::start`], with extra `opensm.conf` lines.
    pub fn start_with(hcas: usize, partitions: &str, extra_conf: &str) -> Fabric {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let sock = format!("fa-opensm-{}-{}", std::process::id(), rand_suffix());
        fs::write(d.join("net"), net_file(hcas)).unwrap();
        let part = d.join("partitions.conf");
        fs::write(&part, partitions).unwrap();
        let log = d.join("opensm.log");
        fs::write(
            d.join("opensm.conf"),
            format!(
                "partition_config_file {}\nlog_file {}\nsweep_interval 0\n{extra_conf}",
                part.display(),
                log.display()
            ),
        )
        .unwrap();
        let fifo = d.join("console");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Read-write open of a FIFO does not block and keeps a writer alive.
        let console = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let ibsim_out = File::create(d.join("ibsim.out")).unwrap();
        let ibsim = Command::new("ibsim")
            .args(["-s", "net"])
            .current_dir(d)
            .env("IBSIM_SOCKNAME", &sock)
            .stdin(console.try_clone().unwrap())
            .stdout(ibsim_out.try_clone().unwrap())
            .stderr(ibsim_out)
            .process_group(0)
            .spawn()
            .unwrap();
        let mut fabric = Fabric {
            pid_file: d.join("opensm.pid"),
            dir,
            sock,
            partitions: part,
            log,
            _console: console,
            opensm: None,
            ibsim: Some(Proc {
                child: ibsim,
                name: "ibsim",
            }),
        };
        let d = fabric.dir.path().to_path_buf();
        assert!(
            wait_for(
                &d.join("ibsim.out"),
                "Network simulator ready",
                Duration::from_secs(30)
            ),
            "ibsim did not start: {}",
            fs::read_to_string(d.join("ibsim.out")).unwrap_or_default()
        );
        let out = File::create(d.join("opensm.out")).unwrap();
        let opensm = Command::new("opensm")
            .args(["-F", "opensm.conf"])
            .current_dir(&d)
            .env("IBSIM_SOCKNAME", &fabric.sock)
            .env("LD_PRELOAD", SHIM)
            .env("SIM_HOST", "h1")
            .env("OSM_CACHE_DIR", &d)
            .env("OSM_TMP_DIR", &d)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap();
        fs::write(&fabric.pid_file, format!("{}\n", opensm.id())).unwrap();
        fabric.opensm = Some(Proc {
            child: opensm,
            name: "opensm",
        });
        assert!(
            wait_for(
                &fabric.log,
                "Entering MASTER state",
                Duration::from_secs(30)
            ),
            "OpenSM did not become master"
        );
        fabric
    }

    /// OpenSM's pid.
    pub fn opensm_pid(&self) -> i32 {
        self.opensm.as_ref().map_or(0, |p| p.child.id() as i32)
    }

    fn client(&self, host: &str) -> Command {
        let mut c = Command::new("smpquery");
        c.current_dir(self.dir.path())
            .env("IBSIM_SOCKNAME", &self.sock)
            .env("LD_PRELOAD", SHIM)
            .env("SIM_HOST", host)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, mut c: Command) -> String {
        let out = c.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// (port GUID, LID) of an HCA, asked by the HCA itself.
    pub fn port_of(&self, host: &str) -> (u64, u16) {
        let mut c = self.client(host);
        c.args(["-D", "nodeinfo", "0"]);
        let ni = self.run(c);
        let mut c = self.client(host);
        c.args(["-D", "portinfo", "0"]);
        let pi = self.run(c);
        let field = |text: &str, name: &str| -> String {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit('.').next())
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let guid = u64::from_str_radix(field(&ni, "PortGuid").trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("no PortGuid in {ni:?}"));
        let lid = field(&pi, "Lid")
            .parse()
            .unwrap_or_else(|_| panic!("no Lid in {pi:?}"));
        (guid, lid)
    }

    /// The P_Key table of port 1 at `lid`, read by SMP from `from`.
    pub fn pkeys(&self, from: &str, lid: u16) -> Vec<u16> {
        let mut c = self.client(from);
        c.args(["pkeys", &lid.to_string(), "1"]);
        parse_pkeys(&self.run(c))
    }

    /// Appends a line to OpenSM's log position record and returns the log's text after `offset`.
    pub fn log_since(&self, offset: usize) -> String {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .get(offset..)
            .unwrap_or_default()
            .to_owned()
    }

    /// Sends SIGHUP to OpenSM.
    pub fn hup(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.opensm_pid()),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
    }

    /// Writes a note into the rig's directory (debugging aid).
    pub fn note(&self, text: &str) {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("notes"))
            .unwrap();
        let _ = writeln!(f, "{text}");
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if let Some(mut p) = self.opensm.take() {
            p.stop();
        }
        if let Some(mut p) = self.ibsim.take() {
            p.stop();
        }
    }
}

/// Non-empty entries of `smpquery pkeys` output (`   0: 0x7fff 0x8001 0x0000 ...`).
pub fn parse_pkeys(out: &str) -> Vec<u16> {
    out.lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
                && l.contains(':')
        })
        .flat_map(|l| {
            l.split(':')
                .nth(1)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|t| u16::from_str_radix(t.trim_start_matches("0x"), 16).ok())
        .filter(|v| v & 0x7FFF != 0)
        .collect()
}

fn rand_suffix() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
