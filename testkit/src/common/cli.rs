//! The `fabric-agent` CLI as a test runs it, and its output as text.

use super::process::BIN;
use std::path::Path;
use std::process::Output;

/// Runs the CLI against a socket.
pub fn cli(socket: &Path, args: &[&str]) -> Output {
    std::process::Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run the CLI")
}

/// The standard error of a run, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The standard output of a run, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
