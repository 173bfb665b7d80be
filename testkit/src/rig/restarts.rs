//! Restarting an OpenSM under the shim when the start itself fails for the rig's reasons: a
//! restarted OpenSM that announces no state in time ([`SecondSm::restart`] and
//! [`restart_rig_opensm`] panic then) is stopped by pid, the slots dead clients hold are freed,
//! and it is started again: a rig recovery, counted and described in a `RIG ...` note (its
//! pid, whether it still ran, ibsim's clients). The last attempt's failure is not caught.
//!
//! Only the OpenSM's own start is retried here: OpenSM and ibsim are the rig; nothing the agents
//! do decides whether OpenSM attaches to ibsim and logs a state (a partitions file in error is
//! logged, and OpenSM still enters a state).

use super::ha::{restart_rig_opensm, SecondSm};
use super::ibsim_slots::{alive, IbsimSlots};
use super::Fabric;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

/// Starts of one OpenSM tried before its failure propagates.
pub const TRIES: u32 = 3;

/// Restarts the standby OpenSM (see the module doc); returns the rig recoveries it took.
pub fn standby(sm: &mut SecondSm, slots: &IbsimSlots, notes: &mut Vec<String>) -> u64 {
    let what = "the restarted standby OpenSM";
    with_recovery(
        sm,
        what,
        slots,
        notes,
        SecondSm::restart,
        |sm| sm.stop(false),
        SecondSm::pid,
    )
}

/// Restarts the rig's own OpenSM (see the module doc); returns the rig recoveries it took.
pub fn rig_opensm(fabric: &mut Fabric, notes: &mut Vec<String>) -> u64 {
    let slots = fabric.ibsim_slots().clone();
    with_recovery(
        fabric,
        "the restarted rig OpenSM",
        &slots,
        notes,
        restart_rig_opensm,
        |f| f.stop_opensm(false),
        |f| Some(f.opensm_pid()).filter(|p| *p != 0),
    )
}

fn with_recovery<T>(
    target: &mut T,
    what: &str,
    slots: &IbsimSlots,
    notes: &mut Vec<String>,
    restart: fn(&mut T),
    stop: fn(&mut T),
    pid: fn(&T) -> Option<u32>,
) -> u64 {
    for attempt in 1..=TRIES {
        let Err(panic) = catch_unwind(AssertUnwindSafe(|| restart(target))) else {
            return u64::from(attempt - 1);
        };
        if attempt == TRIES {
            resume_unwind(panic);
        }
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)")
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        let pid = pid(target);
        let running = pid.is_some_and(alive);
        let clients = match slots.attached() {
            Ok(c) => format!("{} attached {c:?}", c.len()),
            Err(e) => e,
        };
        notes.push(format!(
            "RIG (attempt {attempt}): {what} (pid {pid:?}, {}) failed: {why}; ibsim: {clients}; \
             stopping it by pid and starting it again",
            if running { "running" } else { "exited" }
        ));
        stop(target);
        if let Err(e) = slots.free_dead() {
            notes.push(format!("RIG: ibsim slots not listed: {e}"));
        }
    }
    unreachable!("the last attempt returns or resumes its panic")
}

/// Whether one of the two OpenSMs (the rig's, the standby; `pids` theirs while they run) logs a
/// `SUBNET UP` within `limit` after both were sent a SIGHUP.
pub fn some_master_sweeps(
    fabric: &Fabric,
    standby: &SecondSm,
    pids: [Option<u32>; 2],
    limit: Duration,
) -> bool {
    let logs = [fabric.opensm_log_path(), standby.log_path()];
    let lens: Vec<usize> = logs
        .iter()
        .map(|p| std::fs::read(p).map(|b| b.len()).unwrap_or(0))
        .collect();
    for pid in pids.into_iter().flatten() {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGHUP);
    }
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        for (p, len) in logs.iter().zip(&lens) {
            let text = std::fs::read(p).unwrap_or_default();
            if text.len() > *len && String::from_utf8_lossy(&text[*len..]).contains("SUBNET UP") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The last 8 lines of a log (empty when it cannot be read).
pub fn log_tail(path: impl AsRef<Path>) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
