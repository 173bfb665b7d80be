//! A host with two HCAs on the ibsim fabric. ibsim attaches a client to one port of one node, so
//! each of the host's HCAs is an ibsim HCA of its own (`node1`, `node2`, with NodeDescriptions
//! `<host> mlx5_0` / `<host> mlx5_1`, as rdma-ndd writes them), and the host's agent sees both
//! through a sysfs tree the rig keeps current: [`SysfsMirror`] reads each HCA's NodeInfo, PortInfo
//! and whole P_Key table with `smpquery` (as that HCA, under the shim) and writes them in the
//! kernel's formats, standing in for the kernel that keeps `/sys/class/infiniband` current on a
//! real host. The agent itself runs outside the shim with `kind = "sysfs"`.
//!
//! ```ignore
//! use testkit::rig::two_hca;
//! let fabric = rig::Fabric::start(&two_hca::spec("host1"), OPERATOR)?;
//! let mirror = two_hca::SysfsMirror::start(&fabric, &root, &two_hca::HCAS);
//! ```

use crate::rig::{parse_pkeys, text_field, Fabric, FabricSpec, UMAD2SIM};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The host's HCAs: (ibsim node, device name on the host).
pub const HCAS: [(&str, &str); 2] = [("node1", "mlx5_0"), ("node2", "mlx5_1")];

/// How often the mirror reads the fabric.
const PERIOD: Duration = Duration::from_millis(100);

/// One switch, the SM host and the two HCAs of `host` (`node1` = mlx5_0, `node2` = mlx5_1).
pub fn spec(host: &str) -> FabricSpec {
    let mut spec = FabricSpec::new(1, HCAS.len());
    for (node, device) in HCAS {
        spec.descriptions
            .insert(node.to_owned(), format!("{host} {device}"));
    }
    spec
}

/// A thread that keeps a sysfs tree at `root` equal to what the fabric's ports hold.
pub struct SysfsMirror {
    stop: Arc<AtomicBool>,
    hidden: Arc<Mutex<BTreeSet<String>>>,
    rounds: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    root: PathBuf,
}

/// How a client of the fabric is started from a thread (the [`Fabric`] stays on the test's).
#[derive(Clone)]
struct Tools {
    sock_name: String,
    dir: PathBuf,
}

impl Tools {
    fn smpquery(&self, node: &str, args: &[&str]) -> Result<String, String> {
        let program = ["/usr/sbin/smpquery", "/usr/bin/smpquery"]
            .into_iter()
            .find(|p| Path::new(p).is_file())
            .unwrap_or("smpquery");
        let out = Command::new(program)
            .args(["-D"])
            .args(args)
            .env("LD_PRELOAD", UMAD2SIM)
            .env("SIM_HOST", node)
            .env("IBSIM_SOCKNAME", &self.sock_name)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("smpquery: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "smpquery {args:?} as {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `0x0002c90300000001` as sysfs prints a GUID: `0002:c903:0000:0001`.
fn sysfs_guid(guid: u64) -> String {
    let hex = format!("{guid:016x}");
    hex.as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).expect("hex"))
        .collect::<Vec<_>>()
        .join(":")
}

/// smpquery's LinkState text as the kernel's `state` file prints it.
fn sysfs_state(link_state: &str) -> &'static str {
    match link_state {
        "Down" => "1: DOWN",
        "Initialize" => "2: INIT",
        "Armed" => "3: ARMED",
        "Active" => "4: ACTIVE",
        _ => "0: NOP",
    }
}

fn hex_of(text: &str, name: &str) -> u64 {
    let v = text_field(text, name);
    u64::from_str_radix(v.trim_start_matches("0x"), 16)
        .unwrap_or_else(|_| panic!("{name}: not hex: {v}"))
}

/// Writes `text` to `path` only when it differs, through the temp file `tmp` (outside the tree:
/// the observer refuses entries of `pkeys/` that are not numbers) and a rename, so a reader
/// never sees half a value.
fn put(tmp: &Path, path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
        return;
    }
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(tmp, text).expect("write");
    std::fs::rename(tmp, path).expect("rename");
}

/// Reads one HCA and writes its device directory; an smpquery that fails leaves the previous
/// values (the next round tries again).
fn mirror_one(tools: &Tools, root: &Path, node: &str, device: &str) -> Result<(), String> {
    let info = tools.smpquery(node, &["nodeinfo", "0"])?;
    let port = tools.smpquery(node, &["portinfo", "0", "1"])?;
    let pkeys = parse_pkeys(&tools.smpquery(node, &["pkeys", "0", "1"])?);
    let tmp = root.with_extension("mirror-tmp");
    let put = |path: &Path, text: &str| put(&tmp, path, text);
    let dev = root.join(device);
    let port_dir = dev.join("ports/1");
    put(
        &dev.join("node_guid"),
        &format!("{}\n", sysfs_guid(hex_of(&info, "Guid"))),
    );
    put(
        &port_dir.join("gids/0"),
        &format!(
            "fe80:0000:0000:0000:{}\n",
            sysfs_guid(hex_of(&info, "PortGuid"))
        ),
    );
    put(&port_dir.join("link_layer"), "InfiniBand\n");
    put(
        &port_dir.join("state"),
        &format!("{}\n", sysfs_state(&text_field(&port, "LinkState"))),
    );
    for (file, field) in [("lid", "Lid"), ("sm_lid", "SMLid")] {
        let value: u16 = text_field(&port, field)
            .parse()
            .map_err(|e| format!("{field}: {e}"))?;
        put(&port_dir.join(file), &format!("{value:#x}\n"));
    }
    for (i, key) in pkeys.iter().enumerate() {
        put(
            &port_dir.join(format!("pkeys/{i}")),
            &format!("{key:#06x}\n"),
        );
    }
    Ok(())
}

impl SysfsMirror {
    /// Writes a first complete tree for `hcas` under `root` (panics if the fabric cannot be
    /// read), then keeps it current from a thread until dropped.
    pub fn start(fabric: &Fabric, root: &Path, hcas: &[(&str, &str)]) -> SysfsMirror {
        let tools = Tools {
            sock_name: fabric.sock_name().to_owned(),
            dir: fabric.dir().to_owned(),
        };
        let hcas: Vec<(String, String)> = hcas
            .iter()
            .map(|(n, d)| ((*n).to_owned(), (*d).to_owned()))
            .collect();
        for (node, device) in &hcas {
            mirror_one(&tools, root, node, device).unwrap_or_else(|e| panic!("mirror: {e}"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let hidden: Arc<Mutex<BTreeSet<String>>> = Default::default();
        let thread = {
            let (stop, rounds, root) = (stop.clone(), rounds.clone(), root.to_owned());
            let hidden = hidden.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    for (node, device) in &hcas {
                        if hidden.lock().expect("hidden").contains(device) {
                            continue;
                        }
                        if let Err(e) = mirror_one(&tools, &root, node, device) {
                            eprintln!("sysfs mirror: {}", e.trim_end());
                        }
                    }
                    rounds.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(PERIOD);
                }
            })
        };
        SysfsMirror {
            stop,
            hidden,
            rounds,
            thread: Some(thread),
            root: root.to_owned(),
        }
    }

    /// The tree's root (an observer's `sysfs_root`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host loses `device` (a driver reset, an HCA pulled): the mirror stops writing it and
    /// its directory leaves the tree.
    pub fn hide(&self, device: &str) {
        self.hidden
            .lock()
            .expect("hidden")
            .insert(device.to_owned());
        self.sync();
        std::fs::remove_dir_all(self.root.join(device)).expect("remove the device's directory");
    }

    /// `device` is back: the mirror writes it again from the next round.
    pub fn show(&self, device: &str) {
        self.hidden.lock().expect("hidden").remove(device);
        self.sync();
    }

    /// Blocks until two more complete rounds have been written: what the fabric held when
    /// this was called is in the tree.
    pub fn sync(&self) {
        let target = self.rounds.load(Ordering::SeqCst) + 2;
        let start = std::time::Instant::now();
        while self.rounds.load(Ordering::SeqCst) < target {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "sysfs mirror stalled"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SysfsMirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_match_the_kernel() {
        assert_eq!(super::sysfs_guid(0x0002c90300000001), "0002:c903:0000:0001");
        assert_eq!(super::sysfs_state("Active"), "4: ACTIVE");
    }
}
