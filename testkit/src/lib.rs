//! Test support for fabric-agent, shared by the integration tests (`tests/<area>/`), the
//! benches and `examples/simulate.rs`.
//!
//! # Layout
//! - [`common`]: the daemon harness, the one process guard, request builders, the CLI, one-line
//!   API calls, the event log, waits with deadlines, loopback ports, a test CA, grants and the one
//!   way to skip a test that cannot run here.
//! - [`rig`]: the InfiniBand test fabric — `ibsim` plus a real OpenSM, clients under the umad2sim
//!   shim, `fabric-agent` daemons as its nodes, several SM hosts, two HCAs on one host; OpenSM
//!   under the umad timeout interposer (`rig::preload`), stall evidence kept on request
//!   (`rig::stall`).
//! - [`fake_ufm`]: a fake NVIDIA UFM REST server inside the test process.
//! - [`sim`]: the deterministic simulation of the reconciler (seeded schedules, model subnet
//!   managers and ports, the oracle).
//! - [`chaos`]: the fault campaign on the rig (real agents and OpenSMs, seeded faults, a
//!   control-plane driver) and its independent checker.
//!
//! `rig` and `sim` use `common`; nothing here is used by the agent itself.

pub mod chaos;
pub mod common;
pub mod fake_ufm;
pub mod rig;
pub mod sim;

/// The name libtest gives test `name` of the module whose `module_path!()` is `module`: the
/// module path without the crate's name. A test that runs its own binary again (a child under
/// a shim or a changed environment) selects itself with it.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}
