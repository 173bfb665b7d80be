//! Evidence of a stalled OpenSM, kept for diagnosis: with `FABRIC_RIG_KEEP=<dir>` set, the rig
//! copies its logs (OpenSM's, ibsim's, the agents') and the stalled OpenSM's thread stacks
//! (`gdb -batch`, when gdb is installed) to `<dir>/<label>-<pid>-<n>/` before it restarts that
//! OpenSM, and runs ibsim verbose (`-v`: every MAD it forwards to a umad client). Without the
//! variable it does nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where evidence goes, when asked for.
pub fn keep_dir() -> Option<PathBuf> {
    std::env::var_os("FABRIC_RIG_KEEP").map(PathBuf::from)
}

/// Copies every `*.log` and `*.out` under `rig_dir` (one level of subdirectories too) and the
/// stacks of `pid` to a new directory under [`keep_dir`].
pub fn keep_for_diagnosis(rig_dir: &Path, pid: Option<u32>, label: &str) {
    static N: AtomicU32 = AtomicU32::new(0);
    let Some(root) = keep_dir() else {
        return;
    };
    let n = N.fetch_add(1, Ordering::SeqCst);
    let to = root.join(format!("{label}-{}-{n}", std::process::id()));
    if fs::create_dir_all(&to).is_err() {
        return;
    }
    copy_logs(rig_dir, &to, "");
    if let Ok(entries) = fs::read_dir(rig_dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                let prefix = format!("{}-", e.file_name().to_string_lossy());
                copy_logs(&e.path(), &to, &prefix);
            }
        }
    }
    if let Some(pid) = pid {
        if let Ok(o) = Command::new("gdb")
            .args([
                "-p",
                &pid.to_string(),
                "-batch",
                "-ex",
                "thread apply all bt",
            ])
            .output()
        {
            fs::write(to.join(format!("stacks-{pid}.txt")), o.stdout).ok();
        }
    }
    eprintln!("rig: stall evidence kept in {}", to.display());
}

fn copy_logs(from: &Path, to: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(from) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".log") || name.ends_with(".out") {
            fs::copy(e.path(), to.join(format!("{prefix}{name}"))).ok();
        }
    }
}
