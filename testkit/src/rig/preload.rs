//! What OpenSM runs under in the rig: the umad2sim shim, after the umad timeout interposer
//! testkit's build script compiles (`testkit/umad-timeouts`). The interposer gives the shim the
//! kernel's send timeouts, without which OpenSM stops sweeping for good once a request it sent
//! is never answered (docs/TESTING.md, "Why OpenSM stalls under ibsim").

use super::UMAD2SIM;
use std::path::Path;

/// The interposer's path, from the build script.
const UMAD_TIMEOUTS: &str = env!("UMAD_TIMEOUTS_SO");
/// Set to `off` to start OpenSM on the plain shim (to compare with the interposer).
const UMAD_TIMEOUTS_ENV: &str = "FABRIC_RIG_UMAD_TIMEOUTS";

/// OpenSM's `LD_PRELOAD`: the interposer before the shim, or the shim alone when the interposer
/// is missing or turned off with `FABRIC_RIG_UMAD_TIMEOUTS=off`.
pub(super) fn opensm_preload() -> String {
    let off = std::env::var(UMAD_TIMEOUTS_ENV).is_ok_and(|v| v == "off");
    let usable = !UMAD_TIMEOUTS.contains([':', ' ']) && Path::new(UMAD_TIMEOUTS).is_file();
    if !off && usable {
        format!("{UMAD_TIMEOUTS}:{UMAD2SIM}")
    } else {
        UMAD2SIM.to_owned()
    }
}
