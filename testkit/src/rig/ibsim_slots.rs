//! ibsim's client slots, and freeing the ones dead clients leak.
//!
//! ibsim serves at most 10 clients (`IBSIM_MAX_CLIENTS`): a process under the umad2sim shim
//! asks for a slot with `SIM_CTL_CONNECT` (its pid in the request; ibsim takes the first free
//! slot and answers with its index, the client id) and gives it back with `SIM_CTL_DISCONNECT`
//! only from the shim's exit path. A client killed by a signal never sends it, and ibsim frees
//! a slot on its own only when a packet for that client fails to be written, which for most
//! clients (an agent, a standby OpenSM) never happens: the slot is gone for good, and once all
//! ten are gone every new client (a restarted OpenSM, an agent, `smpquery`) dies at start
//! ("connect failed").
//!
//! ibsim's console can list the attached clients (`Attached`: `Client <id>: pid <pid>
//! connected at "<node>" ...`) and force a disconnect (`X <id>`, which also clears the port's
//! IsSM bit as the dead SM would have). [`IbsimSlots::free_dead`] lists, and frees every slot
//! whose pid no longer runs (gone, or a zombie). The rig's process guards call it through
//! [`IbsimSlots::hook`] whenever they find a process under the shim dead by a signal.

use super::process::SignalDeathHook;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long a console listing may take (ibsim answers between packets; the machine may be
/// loaded).
const LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// One client attached to ibsim, as its `Attached` console command lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The slot (ibsim's client id, 0..10).
    pub id: u32,
    /// The process that connected (the shim sends its pid).
    pub pid: u32,
    /// The node it is attached as.
    pub node: String,
    /// Whether it registered as an SM.
    pub sm: bool,
}

/// A handle on one ibsim's slots (cheap to clone): its console and its output file.
#[derive(Clone)]
pub struct IbsimSlots {
    inner: Arc<Inner>,
}

struct Inner {
    sock_name: String,
    /// Held for a whole listing + disconnect, so that two callers' listings never mix.
    console: Mutex<File>,
    log: PathBuf,
    freed: AtomicU64,
    self_freed: AtomicU64,
    listings: AtomicU64,
    /// Where the last listing's end marker lies in the output (a byte offset).
    listing_end: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut map) = registry().lock() {
            map.remove(&self.sock_name);
        }
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<Inner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<Inner>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl IbsimSlots {
    /// The slots of the ibsim serving `sock_name`, driven through `console` (a write end of its
    /// console) and read back from `log` (its stdout). Registered under `sock_name` for
    /// [`IbsimSlots::for_socket`] while a handle lives.
    pub fn new(sock_name: &str, console: File, log: &Path) -> IbsimSlots {
        let inner = Arc::new(Inner {
            sock_name: sock_name.to_owned(),
            console: Mutex::new(console),
            log: log.to_owned(),
            freed: AtomicU64::new(0),
            self_freed: AtomicU64::new(0),
            listings: AtomicU64::new(0),
            listing_end: AtomicU64::new(0),
        });
        registry()
            .lock()
            .expect("slots registry")
            .insert(sock_name.to_owned(), Arc::downgrade(&inner));
        IbsimSlots { inner }
    }

    /// The slots of the rig's ibsim serving `sock_name`, while its fabric runs.
    pub fn for_socket(sock_name: &str) -> Option<IbsimSlots> {
        let map = registry().lock().ok()?;
        let inner = map.get(sock_name)?.upgrade()?;
        Some(IbsimSlots { inner })
    }

    /// The clients attached now.
    pub fn attached(&self) -> Result<Vec<Client>, String> {
        let mut console = self.inner.console.lock().map_err(|_| "console poisoned")?;
        self.list(&mut console)
    }

    /// Frees (console `X <id>`) the slot of every attached client whose process is dead (gone or
    /// a zombie); returns those clients.
    ///
    /// A slot ibsim freed itself after the listing (its `client <id> seems to be dead` line
    /// follows the listing in its output) is left alone: ibsim may already have given it to a
    /// new client, and an `X` would free that live client's slot (see [`self_freed_since`]).
    pub fn free_dead(&self) -> Result<Vec<Client>, String> {
        let mut console = self.inner.console.lock().map_err(|_| "console poisoned")?;
        let listed = self.list(&mut console)?;
        let after = self.output_since_listing();
        let dead: Vec<Client> = listed
            .into_iter()
            .filter(|c| !alive(c.pid))
            .filter(|c| {
                let gone = self_freed_since(&after, c.id);
                if gone {
                    eprintln!(
                        "rig: ibsim freed slot {} of dead pid {} itself after the listing; \
                         not sending `X {}` (the slot may be a new client's now)",
                        c.id, c.pid, c.id
                    );
                    self.inner.self_freed.fetch_add(1, Ordering::Relaxed);
                }
                !gone
            })
            .collect();
        for c in &dead {
            console
                .write_all(format!("X {}\n", c.id).as_bytes())
                .map_err(|e| format!("ibsim console: {e}"))?;
            eprintln!(
                "rig: freed ibsim slot {} of a dead client (pid {}, node {}{})",
                c.id,
                c.pid,
                c.node,
                if c.sm { ", SM" } else { "" }
            );
        }
        self.inner
            .freed
            .fetch_add(dead.len() as u64, Ordering::Relaxed);
        Ok(dead)
    }

    /// Dead clients' slots [`IbsimSlots::free_dead`] left alone because ibsim freed them itself
    /// between its listing and the `X` (each one an `X` that could have hit a live client).
    pub fn self_freed(&self) -> u64 {
        self.inner.self_freed.load(Ordering::Relaxed)
    }

    /// Slots freed so far by [`IbsimSlots::free_dead`].
    pub fn freed(&self) -> u64 {
        self.inner.freed.load(Ordering::Relaxed)
    }

    /// A guard hook that frees dead clients' slots (errors are printed: the next call retries
    /// them).
    pub fn hook(&self) -> SignalDeathHook {
        let slots = self.clone();
        SignalDeathHook(Arc::new(move |pid| {
            if let Err(e) = slots.free_dead() {
                eprintln!("rig: could not free the ibsim slot of pid {pid}: {e}");
            }
        }))
    }

    /// ibsim's output after the last listing's end marker, read now (empty when unreadable).
    fn output_since_listing(&self) -> String {
        let from = self.inner.listing_end.load(Ordering::Relaxed) as usize;
        let bytes = std::fs::read(&self.inner.log).unwrap_or_default();
        String::from_utf8_lossy(bytes.get(from..).unwrap_or_default()).into_owned()
    }

    /// Sends `Attached` between two comment lines (ibsim echoes comments) and parses what its
    /// output shows between them.
    fn list(&self, console: &mut File) -> Result<Vec<Client>, String> {
        let n = self.inner.listings.fetch_add(1, Ordering::Relaxed);
        let begin = format!("# slots listing {n} begin");
        let end = format!("# slots listing {n} end");
        let offset = std::fs::metadata(&self.inner.log)
            .map(|m| m.len() as usize)
            .unwrap_or(0);
        // One write (shorter than PIPE_BUF): another thread's console command cannot land
        // inside it.
        console
            .write_all(format!("{begin}\nAttached\n{end}\n").as_bytes())
            .map_err(|e| format!("ibsim console: {e}"))?;
        let start = Instant::now();
        loop {
            let bytes = std::fs::read(&self.inner.log).map_err(|e| format!("ibsim log: {e}"))?;
            let text = String::from_utf8_lossy(bytes.get(offset..).unwrap_or_default());
            if let (Some(b), Some(e)) = (text.find(&begin), text.find(&end)) {
                if b < e {
                    let end_at = offset + text[..e].len() + end.len();
                    self.inner
                        .listing_end
                        .store(end_at as u64, Ordering::Relaxed);
                    return Ok(parse_attached(&text[b..e]));
                }
            }
            if start.elapsed() > LISTING_TIMEOUT {
                return Err(format!(
                    "ibsim did not answer `Attached` in {} s",
                    LISTING_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Whether ibsim's output `after` a listing reports that it dropped client `id` on its own
/// (`sim_read_pkt: client <id> seems to be dead - disconnecting.`, printed when a packet to a
/// client fails with ECONNREFUSED; ibsim/ibsim.c `sim_read_pkt` then `disconnect_client`).
///
/// Such a slot is free in ibsim, and the next `SIM_CTL_CONNECT` takes it (ibsim hands out the
/// lowest free slot, `sim_ctl_new_client`). An `X <id>` sent for the dead client after that
/// frees the new, live client's slot without a word; the client after it takes the slot and
/// ibsim `connect()`s the slot's `out<id>` socket to that client, so every packet the live
/// client writes is refused by the kernel with EPERM (a unix datagram socket connected to
/// another peer accepts nothing from a third socket), forever: finding F5.
pub fn self_freed_since(after: &str, id: u32) -> bool {
    after.contains(&format!("client {id} seems to be dead"))
}

/// The clients of `Client <id>: pid <pid> connected at "<node>" port 0x.., lid N, qp N [SM]`
/// lines (each may follow a `sim> ` prompt).
pub fn parse_attached(text: &str) -> Vec<Client> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("Client ") {
        let rest = &text[at + "Client ".len()..];
        let line = rest.lines().next().unwrap_or_default();
        let Some((id, rest)) = line.split_once(": pid ") else {
            continue;
        };
        let Some((pid, rest)) = rest.split_once(" connected at \"") else {
            continue;
        };
        let Some((node, tail)) = rest.split_once('"') else {
            continue;
        };
        let (Ok(id), Ok(pid)) = (id.trim().parse(), pid.trim().parse()) else {
            continue;
        };
        out.push(Client {
            id,
            pid,
            node: node.to_owned(),
            sm: tail.trim_end().ends_with("SM"),
        });
    }
    out
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')' (comm may hold parentheses).
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_attached_listing() {
        let text = "# slots listing 3 beginsim> Client 0: pid 4242 connected at \"smhost\" \
                    port 0x0002c90000000001, lid 1, qp 0 SM\nClient 3: pid 77 connected at \
                    \"node2\" port 0x0002c90000000005, lid 4, qp 0 \nsim> ";
        assert_eq!(
            parse_attached(text),
            vec![
                Client {
                    id: 0,
                    pid: 4242,
                    node: "smhost".into(),
                    sm: true
                },
                Client {
                    id: 3,
                    pid: 77,
                    node: "node2".into(),
                    sm: false
                },
            ]
        );
        assert!(parse_attached("Attaching client 1 at node \"x\"").is_empty());
    }

    /// `free_dead` against a stand-in ibsim on a pipe that answers `Attached` with `listing`
    /// and prints `after` right after the listing's end (what ibsim did before it read the next
    /// command): the clients freed and the commands other than listings it was sent.
    fn free_dead_against(listing: &'static str, after: &'static str) -> (Vec<Client>, Vec<String>) {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("ibsim.log");
        std::fs::write(&log, "").expect("log");
        let (read, write) = nix::unistd::pipe().expect("pipe");
        let slots = IbsimSlots::new("f5-fake-ibsim", File::from(write), &log);
        let out = log.clone();
        let ibsim = std::thread::spawn(move || {
            let mut sent = Vec::new();
            for line in BufReader::new(File::from(read)).lines() {
                let line = line.expect("console line");
                let mut o = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
                if line.starts_with('#') {
                    write!(o, "{line}").unwrap();
                    if line.ends_with(" end") {
                        write!(o, "{after}").unwrap();
                    }
                } else if line == "Attached" {
                    write!(o, "sim> {listing}").unwrap();
                } else {
                    sent.push(line);
                }
            }
            sent
        });
        let freed = slots.free_dead().expect("free_dead");
        drop(slots);
        (freed, ibsim.join().expect("stand-in ibsim"))
    }

    const DEAD_IN_SLOT_0: &str = "Client 0: pid 999999999 connected at \"smhost\" port \
                                  0x100001, lid 1, qp 0 SM\n";

    /// F5's prevention: a dead client's slot that ibsim dropped itself after the listing gets no
    /// `X` (it may be a live client's by then); one it did not drop gets its `X`.
    #[test]
    fn a_slot_ibsim_freed_itself_after_the_listing_gets_no_x() {
        let seems_dead = "sim> ibwarn: [7634] sim_read_pkt: client 0 seems to be dead - \
                          disconnecting.\n";
        let (freed, sent) = free_dead_against(DEAD_IN_SLOT_0, seems_dead);
        assert!(freed.is_empty() && sent.is_empty(), "{freed:?} {sent:?}");
        let (freed, sent) = free_dead_against(DEAD_IN_SLOT_0, "sim> ");
        assert_eq!((freed.len(), sent), (1, vec!["X 0".to_owned()]));
    }

    /// A fabric with a standby OpenSM on node1 (the shimmed process the tests kill).
    fn fabric_with_standby() -> Option<(crate::rig::Fabric, crate::rig::ha::SecondSm)> {
        let fabric = crate::rig::Fabric::start_with(
            &crate::rig::FabricSpec::new(1, 2),
            crate::rig::DEFAULT_PARTITIONS,
            &crate::rig::ha::ha_options(),
        )?;
        let standby =
            crate::rig::ha::SecondSm::start(&fabric, "node1", crate::rig::DEFAULT_PARTITIONS);
        Some((fabric, standby))
    }

    fn pids(fabric: &crate::rig::Fabric) -> Vec<u32> {
        let clients = fabric.ibsim_slots().attached().expect("listing");
        clients.iter().map(|c| c.pid).collect()
    }

    /// The cause: a client killed by a signal stays attached (its slot leaked) until
    /// `free_dead` frees it.
    #[test]
    fn a_killed_client_keeps_its_slot_until_freed() {
        let Some((fabric, mut standby)) = fabric_with_standby() else {
            return;
        };
        let pid = standby.pid().expect("standby runs");
        assert!(
            pids(&fabric).contains(&pid),
            "{:?}",
            fabric.ibsim_slots().attached()
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(Instant::now() < deadline, "pid {pid} still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            pids(&fabric).contains(&pid),
            "ibsim let go of the dead client on its own"
        );
        let freed = fabric.ibsim_slots().free_dead().expect("free");
        assert_eq!(freed.iter().map(|c| c.pid).collect::<Vec<_>>(), vec![pid]);
        assert!(freed[0].sm && freed[0].node == "node1", "{freed:?}");
        assert!(!pids(&fabric).contains(&pid));
        // The guard reaps it and starts it again.
        standby.restart();
    }

    /// The fix: a shimmed process SIGKILLed and restarted more than ibsim's 10 slots' worth of
    /// times (each death frees its slot through the guard's hook).
    #[test]
    fn a_shimmed_process_is_killed_and_restarted_twelve_times() {
        let Some((fabric, mut standby)) = fabric_with_standby() else {
            return;
        };
        let before = pids(&fabric).len();
        let mut recoveries = 0;
        for round in 1..=12 {
            let pid = standby.pid().expect("standby runs");
            standby.stop(true);
            assert!(
                !pids(&fabric).contains(&pid),
                "round {round}: slot of {pid} not freed"
            );
            // As the campaign does: OpenSM under umad2sim sometimes hangs in its start after
            // "OpenSM 3.3.23" (logging nothing more); such a start is stopped and made again.
            let mut notes = Vec::new();
            recoveries +=
                crate::rig::restarts::standby(&mut standby, fabric.ibsim_slots(), &mut notes);
            notes.iter().for_each(|n| eprintln!("{n}"));
        }
        assert_eq!(
            pids(&fabric).len(),
            before,
            "{:?}",
            fabric.ibsim_slots().attached()
        );
        // ibsim itself drops a dead client when a packet to it fails (the master's SMInfo poll
        // of the dead standby, at times before the guard's listing): up to 12 freed here, and
        // up to 2 more per restart stopped by the rig's recovery.
        let freed = fabric.ibsim_slots().freed();
        assert!(
            (6..=12 + 2 * recoveries).contains(&freed),
            "{freed} slots freed by the guard ({recoveries} rig recoveries)"
        );
    }

    #[test]
    fn a_reaped_child_is_dead_and_this_process_alive() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        child.wait().expect("wait");
        assert!(!alive(pid));
    }
}
