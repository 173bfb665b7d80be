//! Where `cargo` puts the `fabric-agent` binary of this build: the tests start it as a process.
//! `OUT_DIR` is `<target>/<profile>/build/<crate>-<hash>/out`; the binary is `<target>/<profile>/fabric-agent`.
//!
//! Also builds the rig's umad timeout interposer (`umad-timeouts/`, no dependencies) into
//! `OUT_DIR/libumad_timeouts.so` with a bare `rustc` call, and tells the rig where it is
//! (`UMAD_TIMEOUTS_SO`): cargo builds a workspace crate's cdylib only for its own package, so a
//! test of another package could not count on finding it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is <target>/<profile>/build/<crate>/out");
    println!(
        "cargo:rustc-env=FABRIC_AGENT_BIN={}",
        profile_dir.join("fabric-agent").display()
    );
    println!("cargo:rerun-if-changed=build.rs");
    build_umad_timeouts(&out);
}

/// Compiles `umad-timeouts/src/lib.rs` as a cdylib into `out`.
fn build_umad_timeouts(out: &Path) {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let src = manifest.join("umad-timeouts").join("src");
    println!("cargo:rerun-if-changed={}", src.display());
    let so = out.join("libumad_timeouts.so");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let status = Command::new(rustc)
        .args([
            "--edition=2021",
            "--crate-type=cdylib",
            "--crate-name=umad_timeouts",
        ])
        .args(["-C", "opt-level=2", "-C", "debuginfo=1"])
        .arg(src.join("lib.rs"))
        .arg("-o")
        .arg(&so)
        .status()
        .expect("run rustc for umad-timeouts");
    assert!(status.success(), "rustc failed on umad-timeouts: {status}");
    println!("cargo:rustc-env=UMAD_TIMEOUTS_SO={}", so.display());
}
