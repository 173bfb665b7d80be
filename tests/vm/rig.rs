//! The host half: one guest boot (`scripts/vm-rig.sh run`) shared by every test of the binary.
//! The first test to ask boots the guest, which runs each scenario in turn (this same test
//! binary, `FABRIC_VM_GUEST=1`, one `--exact` name at a time) and writes its log and exit code
//! into the share; each test then reports its own scenario.

use crate::common::skip::skip;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// Set in the guest: the test bodies run the scenario instead of checking its result.
pub const GUEST_ENV: &str = "FABRIC_VM_GUEST";

/// Whether this process is the guest's run of a scenario.
pub fn in_guest() -> bool {
    std::env::var_os(GUEST_ENV).is_some_and(|v| v == "1")
}

/// The finished guest run: each scenario's exit code and log, read out of the share (which is
/// removed at once: a static is never dropped).
pub struct GuestRun {
    results: HashMap<String, (String, String)>,
}

/// The one boot: `None` when the rig cannot run here, `Err` when it failed (kept, so a failed
/// boot is reported by every test instead of being retried by each).
static RUN: OnceLock<Option<Result<GuestRun, String>>> = OnceLock::new();

/// Checks one scenario's result, booting the guest first if no test did yet. Returns without
/// checking when the rig cannot run here (after [`skip`], which fails under CI).
pub fn check(scenario: &str, scenarios: &[&str]) {
    let Some(run) = RUN.get_or_init(|| {
        let booted = std::panic::catch_unwind(|| boot(scenarios));
        booted
            .map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "the guest boot panicked".to_owned())
            })
            .transpose()
    }) else {
        return;
    };
    let run = run
        .as_ref()
        .unwrap_or_else(|e| panic!("the VM rig failed: {e}"));
    let (rc, log) = &run.results[scenario];
    eprintln!("---- guest log of {scenario} ----\n{log}");
    assert_eq!(
        rc.trim(),
        "0",
        "scenario {scenario} failed in the guest (exit {}); its log is above",
        rc.trim()
    );
}

/// Why the rig cannot run here, if it cannot.
fn missing_tool() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("the VM rig builds its image with debootstrap: run as root".to_owned());
    }
    for tool in ["qemu-system-x86_64", "debootstrap", "mkfs.ext4"] {
        let found = Command::new("sh")
            .args([
                "-c",
                &format!("PATH=$PATH:/usr/sbin:/sbin command -v {tool}"),
            ])
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!(
                "{tool} not found (scripts/setup.sh installs the VM rig's packages)"
            ));
        }
    }
    None
}

fn link_or_copy(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

fn boot(scenarios: &[&str]) -> Option<GuestRun> {
    if let Some(why) = missing_tool() {
        skip(&why);
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Under target/, not /tmp: the binaries are hard-linked (same file system), not copied.
    let dir = tempfile::Builder::new()
        .prefix("vm-rxe-")
        .tempdir_in(root.join("target"))
        .expect("temp dir");
    let share = dir.path();
    let bin = share.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    link_or_copy(Path::new(crate::common::BIN), &bin.join("fabric-agent"));
    link_or_copy(&std::env::current_exe().unwrap(), &bin.join("vm_rxe"));

    // The .deb of the binary under test, built as tests/ops/deb.rs builds it.
    let deb_dir = share.join("deb");
    let packaged = Command::new("bash")
        .args([
            "scripts/package.sh",
            "--profile",
            "dev",
            "--no-build",
            "--fast",
        ])
        .arg("--output")
        .arg(&deb_dir)
        .current_dir(root)
        .output()
        .expect("run scripts/package.sh");
    assert!(
        packaged.status.success(),
        "scripts/package.sh failed: {}",
        String::from_utf8_lossy(&packaged.stderr)
    );

    // FABRIC_VM_ONLY=name,name runs just those scenarios in the guest (the others then fail).
    let only = std::env::var("FABRIC_VM_ONLY").unwrap_or_default();
    let chosen: Vec<&str> = scenarios
        .iter()
        .copied()
        .filter(|s| only.is_empty() || only.split(',').any(|o| o == *s))
        .collect();
    std::fs::write(share.join("guest.sh"), guest_script(&chosen)).unwrap();
    let started = std::time::Instant::now();
    let rig = Command::new("bash")
        .arg(root.join("scripts/vm-rig.sh"))
        .arg("run")
        .arg(share)
        .arg("900")
        .output()
        .expect("run scripts/vm-rig.sh");
    let stderr = String::from_utf8_lossy(&rig.stderr);
    eprintln!("{stderr}");
    eprintln!(
        "vm rig: {} scenarios in {:.1} s (host wall clock, image cached or built included)",
        scenarios.len(),
        started.elapsed().as_secs_f64()
    );
    let out = share.join("out");
    assert!(
        out.join("guest.rc").exists(),
        "the guest produced no result (vm-rig exit {:?}): {stderr}\n{}",
        rig.status.code(),
        std::fs::read_to_string(out.join("console.log")).unwrap_or_default()
    );
    let results = scenarios
        .iter()
        .map(|name| {
            let log = std::fs::read_to_string(out.join(format!("{name}.log")))
                .unwrap_or_else(|e| format!("(no log: {e})"));
            let rc = std::fs::read_to_string(out.join(format!("{name}.rc")))
                .unwrap_or_else(|_| "missing".to_owned());
            (name.to_string(), (rc, log))
        })
        .collect();
    Some(GuestRun { results })
}

/// Sets up rxe0 on eth0, then runs each scenario with its own log and exit code.
fn guest_script(scenarios: &[&str]) -> String {
    let mut s = String::from(
        "set -u\n\
         modprobe rdma_rxe\n\
         ip link set eth0 up\n\
         rdma link add rxe0 type rxe netdev eth0\n\
         rdma link show > out/rdma-link.txt 2>&1\n",
    );
    for name in scenarios {
        // Each scenario starts with rxe0 present, whatever the previous one left.
        s.push_str(
            "rdma link show rxe0/1 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev eth0\n",
        );
        s.push_str(&format!(
            "{GUEST_ENV}=1 RUST_BACKTRACE=1 ./bin/vm_rxe --exact {name} --nocapture \
             --test-threads=1 > out/{name}.log 2>&1; echo $? > out/{name}.rc\n"
        ));
    }
    s
}
