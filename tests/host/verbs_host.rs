//! libibverbs on the machine running the tests. Without RDMA in the kernel (these CI machines)
//! the device list must be empty, not an error, and `auto` must fall back to sysfs saying why;
//! on a host with RDMA the verbs device list must agree with sysfs.

use fabric_agent::config::{ObserverConfig, ObserverKind};
use fabric_agent::observe::auto;
use fabric_agent::observe::{NoDevices, ObserveError};
use fabric_agent::sys::verbs::DeviceList;
use std::path::Path;

/// libibverbs checks this file first; without it, it answers ENOSYS.
fn kernel_has_rdma() -> bool {
    Path::new("/sys/class/infiniband_verbs/abi_version").exists()
}

fn sysfs_device_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn device_list_is_empty_without_kernel_rdma_and_matches_sysfs_with_it() {
    let list = DeviceList::get().expect("ENOSYS must be zero devices, not an error");
    assert_eq!(list.kernel_has_rdma(), kernel_has_rdma());
    if kernel_has_rdma() {
        let mut names = list.names();
        names.sort();
        assert_eq!(names, sysfs_device_names());
    } else {
        assert!(list.is_empty());
        assert_eq!(list.len(), 0);
        assert!(list.names().is_empty());
        assert!(list.open(0).is_err());
    }
}

#[tokio::test]
async fn auto_picks_verbs_with_devices_and_sysfs_otherwise() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/mlx5-8x");
    let config = ObserverConfig {
        sysfs_root: fixture.clone(),
        ..ObserverConfig::default()
    };
    let (observer, reason) = auto::select(&config, ObserverKind::Auto).unwrap();
    eprintln!("auto: {reason}");
    let has_devices = DeviceList::get().map(|l| !l.is_empty()).unwrap_or(false);
    if has_devices {
        assert_eq!(observer.kind(), "verbs", "{reason}");
        assert!(reason.starts_with("verbs: "), "{reason}");
        return;
    }
    assert_eq!(observer.kind(), "sysfs", "{reason}");
    assert!(
        reason.starts_with(&format!(
            "sysfs ({}): libibverbs found no devices",
            fixture.display()
        )),
        "{reason}"
    );
    if !kernel_has_rdma() {
        assert!(
            reason.contains("ENOSYS: the kernel has no RDMA"),
            "{reason}"
        );
    }
    assert!(reason.ends_with("; 9 devices under it"), "{reason}");
    // The fallback really observes the configured tree.
    let inventory = observer.inventory().await.unwrap();
    assert_eq!(inventory.ports.len(), 9);

    // Asking for verbs explicitly fails with the same reason instead of falling back.
    let err = auto::select(&config, ObserverKind::Verbs).err().unwrap();
    assert!(
        matches!(
            &err,
            ObserveError::NoDevices(NoDevices::KernelWithoutRdma | NoDevices::NoProvider)
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn sysfs_is_taken_as_configured_and_other_kinds_are_refused() {
    let config = ObserverConfig {
        sysfs_root: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/rxe"),
        ..ObserverConfig::default()
    };
    let (observer, reason) = auto::select(&config, ObserverKind::Sysfs).unwrap();
    assert_eq!(observer.kind(), "sysfs");
    assert!(
        reason.ends_with("tests/fixtures/sysfs/rxe): configured"),
        "{reason}"
    );
    assert_eq!(observer.inventory().await.unwrap().ports[0].device, "rxe0");
    assert!(auto::select(&config, ObserverKind::Embedded).is_err());
    assert!(auto::select(&config, ObserverKind::Smp).is_err());
}

#[test]
fn auto_on_a_machine_without_sysfs_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = ObserverConfig {
        sysfs_root: dir.path().join("absent"),
        ..ObserverConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let (observer, reason) = auto::select(&config, ObserverKind::Auto).unwrap();
    if observer.kind() == "sysfs" {
        assert!(reason.ends_with("; it does not exist"), "{reason}");
    }
}

/// Set on the child process that runs [`fake_sysfs_child`].
const CHILD_MARK: &str = "FABRIC_AGENT_VERBS_CHILD";

/// A kernel with RDMA but no device: libibverbs answers an empty list (not ENOSYS). Simulated
/// with libibverbs' own `SYSFS_PATH` override in a child process (this process's environment
/// is left alone): a sysfs with `class/infiniband_verbs/abi_version` and no device.
#[test]
fn rdma_kernel_without_devices_is_an_empty_list_with_its_own_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("class/infiniband_verbs")).unwrap();
    std::fs::create_dir_all(dir.path().join("class/infiniband")).unwrap();
    std::fs::write(dir.path().join("class/infiniband_verbs/abi_version"), "6\n").unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &testkit::test_name(module_path!(), "fake_sysfs_child"),
            "--ignored",
            "--nocapture",
        ])
        .env("SYSFS_PATH", dir.path())
        .env(CHILD_MARK, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
}

#[tokio::test]
#[ignore = "runs in a child process started by rdma_kernel_without_devices_is_an_empty_list_with_its_own_reason"]
async fn fake_sysfs_child() {
    assert!(
        std::env::var_os(CHILD_MARK).is_some(),
        "run only as a child"
    );
    let list = DeviceList::get().unwrap();
    assert!(list.kernel_has_rdma());
    assert!(list.is_empty());
    let config = ObserverConfig {
        sysfs_root: std::env::var_os("SYSFS_PATH")
            .map(|p| Path::new(&p).join("class/infiniband"))
            .unwrap(),
        ..ObserverConfig::default()
    };
    let err = auto::select(&config, ObserverKind::Verbs).err().unwrap();
    assert!(
        matches!(err, ObserveError::NoDevices(NoDevices::NoProvider)),
        "{err:?}"
    );
    let (observer, reason) = auto::select(&config, ObserverKind::Auto).unwrap();
    eprintln!("auto: {reason}");
    assert_eq!(observer.kind(), "sysfs");
    assert!(reason.ends_with("; no device under it either"), "{reason}");
}

#[tokio::test]
async fn verbs_observer_without_devices_polls_on_its_timers() {
    use fabric_agent::observe::verbs::VerbsObserver;
    use fabric_agent::observe::PortObserver;
    use std::time::{Duration, Instant};
    let config = ObserverConfig {
        fast_poll_ms: 20,
        slow_poll_ms: 400,
        ..ObserverConfig::default()
    };
    let observer = VerbsObserver::from_devices(Vec::new(), &config).unwrap();
    assert_eq!(observer.kind(), "verbs");
    assert!(observer.inventory().await.unwrap().ports.is_empty());
    let start = Instant::now();
    observer.changed(true).await;
    let fast = start.elapsed();
    assert!(
        fast >= Duration::from_millis(20) && fast < Duration::from_millis(400),
        "{fast:?}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), observer.changed(false))
            .await
            .is_err()
    );
}

#[test]
fn verbs_observer_needs_a_runtime() {
    use fabric_agent::observe::verbs::VerbsObserver;
    let err = VerbsObserver::from_devices(Vec::new(), &ObserverConfig::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}
