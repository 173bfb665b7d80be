//! Store rollbacks inside a schedule: a backup of the node's store taken at a seeded moment
//! ([`Command::Snapshot`]) and put back later ([`Command::StoreRollback`]): the agent crashes,
//! the copied database file replaces the live one and the agent starts again on the restored
//! store. Two kinds: the database file alone (its side file stays as the live agent left it, as
//! a restore from a backup of the file leaves it: the store sees the rollback at its open), or
//! the whole state directory, the side file `state.redb.mirror` included (a reverted VM: the
//! store cannot see it, and the snapshot holds no clean-stop marker because a running agent's
//! store never does; the start check against the fabric side's stored sets and the fabric
//! side's newer generation are the only evidence). A whole-directory snapshot is taken at once
//! or inside an apply, after its generation was reserved and sent. With the SM host, the same
//! snapshot holds the SM host's store and partitions file for [`Command::SmHostCrash`]
//! (`sm_host_restart.rs`).
//!
//! What the oracle then checks (`Oracle::restored`): after a database-file rollback the
//! store shows it with a new log epoch at once, above every seq handed out; after either kind
//! no (epoch, seq) is ever handed out with another event; the acknowledged commands the
//! rollback lost (exactly those acknowledged after the snapshot) are exempt from the
//! durability check only until the control plane sends them again; and every other check goes
//! on as before: no false RELEASED, no key reported RELEASED back on a port before an attach
//! asks for it again (the restored store's copy of its attachment included), liveness.
//!
//! The control plane resynchronises on the new epoch (README, "Event cursors and
//! resynchronising"): a moment after the restart it releases again every instance whose
//! acknowledged release the rollback lost and sends again the attach of every other restored
//! attachment. Until then the node withholds the key of each restored attachment the ports did
//! not hold after the restore, and the oracle keeps every key reported RELEASED guarded.
//!
//! The commands are drawn from a stream of their own ([`draw`]), so the rest of a seed's
//! schedule is the one it has without them.

use super::core::command::{Command, SmHostRestore, Step};
use super::core::disk::{seen, temp_dir};
use super::core::plan::GenOptions;
use super::world::{with, Shared};
use fabric_agent::agent::{Agent, AttachRequest, ListFilter};
use fabric_agent::domain::{Attachment, PortName};
use fabric_agent::store::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Seeds whose schedule rolls the node's store back: one in this many.
const NODE_ROLLBACK_ONE_IN: u32 = 4;
/// `--opensm` seeds whose SM-host agent crashes (and is perhaps restored): one in this many.
const SM_HOST_CRASH_ONE_IN: u32 = 3;

/// Adds the snapshot, rollback and SM-host crash commands of `seed` to `steps` (drawn from a
/// stream of their own; each goes after the steps already at its instant).
pub fn draw(seed: u64, options: GenOptions, steps: &mut Vec<Step>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5709_E0B5_0000_0002);
    let end = steps.last().map_or(0, |s| s.at_ms) + 5_000;
    let mut extra = Vec::new();
    let mut snapshot_at = None;
    // A UFM node's late-write ledger lives in its store and goes back with it: the backend
    // then watches every key until the window from the restart is over (docs/UFM.md).
    let forced = options.whole_dir && !options.ufm;
    if forced || rng.random_ratio(1, NODE_ROLLBACK_ONE_IN) {
        let at = rng.random_range(0..end);
        snapshot_at = Some(at);
        // Whole-directory restores only with `GenOptions::whole_dir` (they find node bugs
        // that are not fixed yet: docs/SIMULATION.md), the moment of the snapshot from a
        // stream of its own. UFM keeps no generation of the node, so nothing could show a
        // whole-directory restore there (docs/UFM.md "Store restores": not covered).
        let mut kind = StdRng::seed_from_u64(seed ^ 0x5709_E0B5_0000_0003);
        let whole = forced;
        let in_apply = whole && kind.random_bool(0.5);
        extra.push((at, Command::Snapshot { in_apply }));
        extra.push((
            rng.random_range(at..=end),
            Command::StoreRollback {
                down_ms: rng.random_range(0..5_000),
                whole,
            },
        ));
    }
    if options.opensm && rng.random_ratio(1, SM_HOST_CRASH_ONE_IN) {
        for _ in 0..rng.random_range(1..=2) {
            let at = rng.random_range(0..end);
            let restore = match rng.random_range(0..10) {
                0..=4 => SmHostRestore::Nothing,
                5..=7 => SmHostRestore::Store,
                _ => SmHostRestore::StoreAndFile,
            };
            if restore != SmHostRestore::Nothing && snapshot_at.is_none_or(|s| s > at) {
                let s = rng.random_range(0..=at);
                snapshot_at = Some(s);
                extra.push((s, Command::Snapshot { in_apply: false }));
            }
            let down_ms = match rng.random_range(0..3) {
                0 => rng.random_range(0..500),
                1 => rng.random_range(500..10_000),
                _ => rng.random_range(10_000..90_000),
            };
            extra.push((at, Command::SmHostCrash { down_ms, restore }));
        }
    }
    extra.sort_by_key(|(at, _)| *at);
    for (at_ms, command) in extra {
        let i = steps.partition_point(|s| s.at_ms <= at_ms);
        steps.insert(i, Step { at_ms, command });
    }
}

/// Whether a schedule rolls the node's store back (its store is then a file, with its side
/// file; in memory otherwise).
pub fn rolls_back(steps: &[Step]) -> bool {
    steps
        .iter()
        .any(|s| matches!(s.command, Command::StoreRollback { .. }))
}

/// A backup of the node's store.
#[derive(Clone)]
struct NodeSnapshot {
    /// The database file's bytes.
    db: Vec<u8>,
    /// The side file's bytes (None: there was none yet).
    mirror: Option<Vec<u8>>,
    /// The newest event seq in it.
    last_seq: u64,
    /// Instances whose attach, and whose release, had been acknowledged.
    attached: BTreeSet<String>,
    released: BTreeSet<String>,
}

/// The node's store on disk (schedules with a rollback) and its last backup.
pub struct NodeDisk {
    _dir: tempfile::TempDir,
    path: PathBuf,
    snapshot: Mutex<Option<NodeSnapshot>>,
    /// The store's event retention.
    retain: u64,
}

impl NodeDisk {
    /// A fresh state directory.
    pub fn new() -> NodeDisk {
        let dir = temp_dir();
        NodeDisk {
            path: dir.path().join("state.redb"),
            _dir: dir,
            snapshot: Mutex::new(None),
            retain: u64::MAX,
        }
    }

    /// The same, its store keeping the newest `retain` events.
    pub fn retaining(self, retain: u64) -> NodeDisk {
        NodeDisk { retain, ..self }
    }

    /// Opens the store (its side file beside it).
    pub fn open(&self) -> Arc<Store> {
        Arc::new(Store::open(&self.path, self.retain).expect("the node's store"))
    }

    /// The side file beside the database (`state.redb.mirror`).
    fn mirror_path(&self) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(".mirror");
        PathBuf::from(name)
    }

    /// Copies the database file and its side file as they are now (every commit and its
    /// mirror write are synchronous: none is half done while the simulation runs this), with
    /// what the oracle counted acknowledged by then.
    pub fn snapshot(&self, store: &Store, world: &Shared) {
        let db = std::fs::read(&self.path).expect("reading the node's database file");
        let mirror = match std::fs::read(self.mirror_path()) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("reading the node's side file: {e}"),
        };
        let last_seq = store.last_seq().expect("last seq");
        let marked = store.clean_stop_marked().expect("clean-stop marker");
        with(world, |w| {
            w.log(format!(
                "backup: the node's database file and side file copied (events up to seq \
                 {last_seq}, clean-stop marker {})",
                if marked { "present" } else { "absent" }
            ));
            // The acknowledged commands as of the copy: attachments pruned by then are
            // forgotten first (their ids may be attached again after the copy).
            let now = w.now_ms();
            w.oracle.check_durable(now);
            *self.snapshot.lock().expect("snapshot lock") = Some(NodeSnapshot {
                db,
                mirror,
                last_seq,
                attached: w.oracle.acked_attach.clone(),
                released: w.oracle.acked_release.clone(),
            });
        });
    }

    /// Puts the snapshot back while the agent is down: closes the live store (`live` and the
    /// oracle hold its last handles), writes the copied database file over it, and the copied
    /// side file too when `whole` (else leaves the live one), reopens the store in `live` and
    /// tells the oracle. Returns the acknowledged releases the rollback lost.
    pub fn roll_back(&self, live: &Mutex<Arc<Store>>, world: &Shared, whole: bool) -> Vec<String> {
        let Some(snap) = self.snapshot.lock().expect("snapshot lock").clone() else {
            with(world, |w| {
                w.log("restore: no snapshot taken yet, nothing put back")
            });
            return Vec::new();
        };
        let mut w = world.lock().expect("world lock");
        w.check();
        // Every handle must go before the file is replaced and opened again.
        let placeholder = Arc::new(Store::in_memory(u64::MAX).expect("in-memory store"));
        drop(w.oracle.swap_store(placeholder.clone()));
        let old = std::mem::replace(&mut *live.lock().expect("store lock"), placeholder);
        assert_eq!(
            Arc::strong_count(&old),
            1,
            "the crashed agent still holds the node's store"
        );
        drop(old);
        std::fs::write(&self.path, &snap.db).expect("writing the copy back");
        if whole {
            match &snap.mirror {
                Some(m) => std::fs::write(self.mirror_path(), m),
                None => std::fs::remove_file(self.mirror_path()),
            }
            .expect("putting the side file back");
        }
        let reopened = self.open();
        let seen = seen(&reopened);
        *live.lock().expect("store lock") = reopened.clone();
        drop(w.oracle.swap_store(reopened));
        let now = w.now_ms();
        let lost = w
            .oracle
            .restored(snap.last_seq, &snap.attached, &snap.released, whole, now);
        let what = if whole {
            "the node's whole state directory (database and side file)"
        } else {
            "the node's database file (its side file left)"
        };
        w.log(format!(
            "restore: {what} put back to the snapshot (events up to seq {}); {seen}; \
             acknowledged releases lost: {lost:?}",
            snap.last_seq
        ));
        drop(w);
        with(world, |_| ());
        lost
    }
}

impl Default for NodeDisk {
    fn default() -> Self {
        NodeDisk::new()
    }
}

/// Check 5 after a whole state directory was put back: the restored ledger cannot know the
/// generations the lost writes used beyond what the fabric side holds, which the start check
/// tells it. From the node's next apply on, every generation it sends must be above the one
/// the fabric side holds then and above every one it sent since. (A generation the lost writes
/// used that the fabric side does not hold may come again; a stale request that still lands is
/// judged by checks 1 and 8 like any late request.)
pub fn generations_from_here(world: &Shared) {
    with(world, |w| w.generation_floor_pending = true);
}

/// The control plane resynchronising on the new epoch (README, "Event cursors and
/// resynchronising"): a moment after the restart it releases again each instance whose
/// acknowledged release the rollback lost, and sends again the attach of every other restored
/// attachment (the node withholds their keys until then), built from its own record of it.
pub async fn resync(agent: &Agent, world: &Shared, lost: Vec<String>) {
    let restored: Vec<Attachment> = agent
        .list(&ListFilter::default())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.restored.is_some() && !lost.iter().any(|l| l == a.instance_id.as_str()))
        .collect();
    if lost.is_empty() && restored.is_empty() {
        return;
    }
    let wait = with(world, |w| w.ms(200, 5_000));
    tokio::time::sleep(wait).await;
    for name in lost {
        let r = agent.release(&name, None).await;
        with(world, |w| match r {
            Ok(a) => {
                w.log(format!(
                    "control plane: release {name} again after the rollback ({:?})",
                    a.state
                ));
                w.oracle.acked_release.insert(name);
            }
            Err(e) => w.log(format!(
                "control plane: release {name} again after the rollback: {e}"
            )),
        });
    }
    for a in restored {
        let name = a.instance_id.as_str().to_owned();
        let r = agent.attach(request_of(&a), None).await;
        with(world, |w| match r {
            Ok((a, _)) => {
                w.log(format!(
                    "control plane: attach {name} again after the rollback ({:?})",
                    a.state
                ));
                w.oracle.reattached(&name);
            }
            Err(e) => w.log(format!(
                "control plane: attach {name} again after the rollback: {e}"
            )),
        });
    }
}

/// The attach request a control plane sends again for an attachment it holds.
fn request_of(a: &Attachment) -> AttachRequest {
    AttachRequest {
        instance_id: a.instance_id.clone(),
        partition: a.partition.clone(),
        membership: a.membership,
        grant: a.grant.clone(),
        ports: if a.named_ports {
            a.ports
                .iter()
                .map(|p| PortName::Guid(p.port_guid))
                .collect()
        } else {
            Vec::new()
        },
    }
}
