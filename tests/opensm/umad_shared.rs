//! One umad device for two users of one agent under the umad2sim shim. The shim routes each
//! management class to one fd per device and, once that fd is closed, its receiver thread
//! dereferences the freed slot on the next answer: an SM-host agent with the SMP observer and
//! `sminfo_umad_device` on the same `/dev/infiniband/umad0` died with SIGSEGV right after
//! `ready`. `check-config` and `serve` refuse that combination under the shim with an error that
//! names both settings, and `serve` exits with the configuration's failure, not a signal; with
//! a sysfs observer beside SMInfo both pass. Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::free_port;
use rig::ha::{ha_sm_config, SmFiles};
use rig::{agents::BIN, Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

const UMAD: &str = "/dev/infiniband/umad0";

/// An SM-host config reading SMInfo over umad0, with the SMP observer on it too when `smp`.
fn config(fabric: &Fabric, smp: bool) -> String {
    let files = SmFiles {
        partitions: &fabric.partitions_path(),
        log: &fabric.opensm_log_path(),
        pid: &fabric.opensm_pid_path(),
        metrics: free_port(),
    };
    let base = ha_sm_config(fabric, "smhost", free_port(), &files, &[free_port()]).replace(
        "sync_interval_ms = 500\n",
        &format!("sync_interval_ms = 500\nsminfo_umad_device = \"{UMAD}\"\n"),
    );
    assert!(base.contains("sminfo_umad_device"));
    if !smp {
        return base;
    }
    let out: Vec<String> = base
        .lines()
        .filter(|l| !l.starts_with("sysfs_root"))
        .map(|l| {
            if l.starts_with("kind = \"sysfs\"") {
                format!("kind = \"smp\"\numad_device = \"{UMAD}\"")
            } else {
                l.to_owned()
            }
        })
        .collect();
    out.join("\n") + "\n"
}

/// Runs the agent binary under the shim as the SM's HCA with `args`, stopping it (SIGTERM,
/// by pid) if it still runs after `limit`.
fn run(fabric: &Fabric, config: &str, args: &[&str], limit: Duration) -> (Output, bool) {
    let path = fabric.dir().join("shared.toml");
    std::fs::write(&path, config).expect("config");
    let mut child = fabric
        .client_command("smhost", BIN)
        .arg("--config")
        .arg(&path)
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the agent");
    let deadline = Instant::now() + limit;
    let mut still_running = false;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            still_running = true;
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().expect("output"), still_running)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn one_umad_device_for_the_smp_observer_and_sminfo_is_refused_under_the_shim() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 1), LIMITED_DEFAULT_PARTITIONS) else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let shared = config(&fabric, true);

    let (out, _) = run(&fabric, &shared, &["check-config"], Duration::from_secs(30));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(64), "{said}");
    assert!(
        said.contains("umad.shared_device")
            && said.contains("observer.umad_device, subnet_manager.opensm_ha.sminfo_umad_device")
            && said.contains("umad2sim"),
        "{said}"
    );

    // serve refuses before anything starts: an exit with a code (no signal), the reason on
    // stderr, never `ready`. Without the check it died with SIGSEGV after `ready`.
    let (out, still_running) = run(&fabric, &shared, &["serve"], Duration::from_secs(20));
    let said = text(&out);
    assert!(!still_running, "serve kept running: {said}");
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "{:?}: {said}",
        out.status
    );
    assert!(
        said.contains("umad.shared_device") && !said.contains(" ready "),
        "{said}"
    );

    // A sysfs observer beside SMInfo: the device has one user, nothing to refuse.
    let (out, _) = run(
        &fabric,
        &config(&fabric, false),
        &["check-config"],
        Duration::from_secs(30),
    );
    let said = text(&out);
    assert!(!said.contains("umad.shared_device"), "{said}");
}
