//! A node agent started under the shim whose very first port read fails with EPERM: the rig's
//! fault, not the agent's (finding F5 in docs/CHAOS.md).
//!
//! ibsim answers a client through the slot's `out<id>` socket, `connect()`ed to the client that
//! took the slot last (ibsim/ibsim.c `sim_ctl_new_client`); the client writes its packets to
//! that socket. When a live client's slot is freed under it (a console `X <id>` meant for the
//! slot's dead previous owner, see [`super::ibsim_slots::self_freed_since`]) and another client
//! takes it, the kernel refuses every write of the first client with EPERM (a connected unix
//! datagram socket only takes packets from its peer): `umad2sim_write: cannot write`, `umad
//! write failed: EPERM` at every port read, for as long as the process lives.
//!
//! [`first_read_eperm`] recognises exactly that at an agent's start: the `cannot read the
//! ports; serving anyway` line with EPERM before the `ready` line. Nothing else qualifies (a
//! port read that fails any other way, or later, is the product's to report).

use std::path::Path;
use std::time::{Duration, Instant};

/// What the serve command logs when its first port read fails (src/cli/serve.rs).
const FIRST_READ_FAILED: &str = "cannot read the ports; serving anyway";
/// What the serve command logs once it serves (after its first port read).
const READY: &str = "fabric_agent::cli::serve: ready ";
/// How a umad write refused by the kernel shows in the agent's error chain.
const EPERM: &str = "umad write failed: EPERM";

/// For the output of one agent start (`output`: its log from the start on): `None` while it
/// has not logged `ready`, else whether its first port read failed with a umad EPERM.
pub fn first_read_eperm(output: &str) -> Option<bool> {
    let ready = output.find(READY)?;
    let before = &output[..ready];
    Some(
        before
            .lines()
            .any(|l| l.contains(FIRST_READ_FAILED) && l.contains(EPERM)),
    )
}

/// Waits up to `limit` for the agent logging to `log` (from byte `from`, where this start's
/// output begins) to log `ready`; returns [`first_read_eperm`] of that output (`None`: no
/// `ready` in time).
pub fn wait_first_read(log: &Path, from: usize, limit: Duration) -> Option<bool> {
    let deadline = Instant::now() + limit;
    loop {
        let bytes = std::fs::read(log).unwrap_or_default();
        let text = String::from_utf8_lossy(bytes.get(from..).unwrap_or_default());
        if let Some(eperm) = first_read_eperm(&text) {
            return Some(eperm);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F5: &str = "2026-12-06T17:15:16.624089Z  INFO fabric_agent::api::server: TLS material \
        loaded\nERR: umad2sim_write: cannot write\n2026-12-06T17:15:16.625251Z ERROR \
        fabric_agent::cli::serve: cannot read the ports; serving anyway (no state changes until \
        they are read; `fabric-agent doctor` says why) error=reading ports failed: umad write \
        failed: EPERM: Operation not permitted observer=smp\n2026-12-06T17:15:16.625395Z  INFO \
        fabric_agent::cli::serve: ready node=node1 fabric=fab1\n";

    #[test]
    fn the_f5_start_qualifies() {
        assert_eq!(first_read_eperm(F5), Some(true));
    }

    #[test]
    fn a_clean_start_or_another_failure_does_not() {
        let clean = "INFO fabric_agent::cli::serve: ready node=node1 fabric=fab1\n";
        assert_eq!(first_read_eperm(clean), Some(false));
        let other = F5.replace("EPERM: Operation not permitted", "ETIMEDOUT: timed out");
        assert_eq!(first_read_eperm(&other), Some(false));
        // EPERM only after `ready` (a later read): the product's to report, not a rig fault.
        let later = format!("{clean}WARN reading ports failed: umad write failed: EPERM\n");
        assert_eq!(first_read_eperm(&later), Some(false));
        assert_eq!(first_read_eperm("INFO starting\n"), None);
    }

    /// The cause, on a real fabric: a live agent's slot freed by a console `X` (as a stale
    /// sweep's would be) and taken by the next client; the agent's umad writes then fail with
    /// EPERM; killed and started again, it takes a free slot and reads its ports.
    #[test]
    fn a_live_agent_whose_slot_goes_to_another_client_gets_eperm() {
        use crate::rig::agents::{node_config, Agent};
        let spec = crate::rig::FabricSpec::new(1, 2);
        let Some(mut fabric) = crate::rig::Fabric::start(&spec, crate::rig::DEFAULT_PARTITIONS)
        else {
            return;
        };
        let limit = Duration::from_secs(30);
        let mut a = Agent::start(&fabric, "node1", &node_config(&fabric, "node1", 1));
        let log = a.log.clone();
        assert_eq!(
            wait_first_read(&log, 0, limit),
            Some(false),
            "{}",
            a.log_text()
        );
        let slot_of = |f: &crate::rig::Fabric, pid: u32| {
            let clients = f.ibsim_slots().attached().expect("listing");
            clients.iter().find(|c| c.pid == pid).map(|c| c.id)
        };
        let slot = slot_of(&fabric, a.pid()).expect("node1's agent attached");
        let ids: Vec<u32> = fabric
            .ibsim_slots()
            .attached()
            .expect("listing")
            .iter()
            .map(|c| c.id)
            .collect();
        assert!(
            (0..slot).all(|i| ids.contains(&i)),
            "slot {slot} would not be the lowest free one: {ids:?}"
        );
        let len = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        fabric.ibsim_console(&format!("X {slot}")).expect("console");
        let b = Agent::start(&fabric, "node2", &node_config(&fabric, "node2", 1));
        assert_eq!(
            slot_of(&fabric, b.pid()),
            Some(slot),
            "node2 took another slot"
        );
        let deadline = Instant::now() + limit;
        loop {
            let text = std::fs::read(&log).unwrap_or_default();
            if String::from_utf8_lossy(&text[len..]).contains(EPERM) {
                break;
            }
            assert!(Instant::now() < deadline, "no EPERM:\n{}", a.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        // The rig's recovery: SIGKILL (no disconnect for a slot that is node2's now), start.
        a.crash();
        let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        a.spawn(&fabric);
        assert_eq!(
            wait_first_read(&log, from, limit),
            Some(false),
            "{}",
            a.log_text()
        );
        assert_ne!(slot_of(&fabric, a.pid()), Some(slot));
    }
}
