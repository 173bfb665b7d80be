//! The real SM-host backend in the simulation: the node's applies travel a model network to the
//! real [`OpenSmBackend`] (admission, fencing, group commit, the file write, the sweep fence,
//! the restore after a rejection), which writes a real partitions file in a temp directory and
//! signals a *model OpenSM process* through the backend's [`Reloader`] seam.
//!
//! The model OpenSM reads the file (the strict parser, as OpenSM 3.3 reads it) at its heavy
//! sweeps and programs the model ports from what it read. Its heavy sweeps come from the
//! backend's signal (at once, late, or never: a slow or lost signal is answered "not seen
//! re-reading" and the write stays unconfirmed), from its own triggers at random moments (a
//! topology change: it reads whatever the file holds then, an unconfirmed write included), and
//! from its restarts.
//!
//! Rejections: OpenSM's verdict is a property of the bytes it reads, and the backend writes only
//! bytes the strict parser (OpenSM's parser, `tests/opensm_differential.rs`) accepts. So the
//! realistic rejection of the agent's write is one *not caused by its bytes*: the error lines
//! after the sweep fence's mark come from a sweep that read something else (an operator's editor
//! that does not take the live file's lock saved a broken file for a moment, then the fixed
//! one). With faults on, 5% of the signalled sweeps are such: OpenSM falls back (every tenant key
//! dropped from the ports) and logs a parse error; the same bytes are accepted when read again.
//! A model that rejected valid bytes for good would stall any node whose set renders them, in
//! any backend, so it is not in the mix.
//!
//! What the SM host holds is part of the oracle's truth ([`SmHostView`]): a key is "may still
//! be programmed" while the backend's stored set for the node gives it or the file on disk does.

use super::core::command::Step;
use super::core::constants::{PARTITIONS, PORT_GUID_BASE};
use super::core::disk::temp_dir;
use super::core::fabric::Request;
use super::core::keys::{keys_of, show_keys, Keys};
use super::core::sm_host_view::{SmHostView, NODE};
use super::sm_host_disk::SmHostDisk;
use super::world::{with, Shared, World};
use async_trait::async_trait;
use fabric_agent::domain::{NodeId, NodeMemberships, PKey};
use fabric_agent::sm::opensm::members::members_of;
use fabric_agent::sm::opensm::reload::{ReloadError, ReloadReport, Reloader, Unsignalled};
use fabric_agent::sm::opensm::{OpenSmBackend, OpenSmConfig, OwnershipConfig};
use fabric_agent::sm::{
    ApplyOutcome, HostStoredSet, InjectedFault, SmError, SmFailure, StoredSetAnswer, SubnetManager,
};
use rand::Rng;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the backend's sweep fence waits for OpenSM (the model answers "not seen" after it).
const CHECK: Duration = Duration::from_millis(2_000);
/// The operator's part of the file: tenant ports limited members of the default partition.
const OPERATOR: &str = "Default=0x7fff : ALL=limited, SELF=full ;\n";

/// What the model OpenSM holds when it reads `bytes`: the keys it gives the node's ports.
/// `None`: the file does not load (OpenSM would reject it).
fn read_file(bytes: &[u8]) -> Option<Keys> {
    fabric_agent::sm::opensm::parse::parse(bytes).ok()?;
    let mut keys = Keys::new();
    for (_, _, base) in PARTITIONS {
        let key = PKey::new(u32::from(base)).ok()?;
        let members = members_of(bytes, key)?;
        let mine: Vec<_> = members
            .iter()
            .filter(|m| m.guid.0 >= PORT_GUID_BASE && m.guid.0 < PORT_GUID_BASE + 16)
            .collect();
        if mine.is_empty() {
            continue;
        }
        // One membership per key and node in the region (the node's set gives one).
        let full = mine.iter().any(|m| m.full);
        let value = if full { base | 0x8000 } else { base };
        keys.insert(base, (value, mine.iter().map(|m| m.guid.0).collect()));
    }
    Some(keys)
}

/// A heavy sweep of the model OpenSM: reads the file now and programs the ports from it.
fn heavy_sweep(world: &Shared, file: &Path, why: &str) {
    if opensm_down(world) {
        return;
    }
    let bytes = std::fs::read(file).unwrap_or_default();
    let sweeps = with(world, |w| {
        match read_file(&bytes) {
            Some(keys) => {
                w.log(format!(
                    "opensm: heavy sweep ({why}) read {}",
                    show_keys(&keys)
                ));
                w.fabric.sm.config = Some(keys);
            }
            None => {
                w.log(format!(
                    "opensm: heavy sweep ({why}): the file does not load, tenant keys dropped"
                ));
                w.fabric.sm.config = Some(Keys::new());
            }
        }
        super::model_sm::sweep_delays(w)
    });
    super::model_sm::start_sweeps(world, sweeps);
}

/// Whether OpenSM is down with the whole SM host.
fn opensm_down(world: &Shared) -> bool {
    let w = world.lock().expect("world lock");
    w.fabric.sm_host.as_ref().is_some_and(|h| h.opensm_down)
}

/// The model OpenSM process, as the backend's [`Reloader`] sees it.
struct ModelOpenSm {
    world: Shared,
    file: PathBuf,
}

enum Signal {
    /// Sweeps after the delay and is seen re-reading.
    Sweep(Duration),
    /// Sweeps after the delay, reads a broken file that is not the agent's (an operator's
    /// momentary edit), falls back and logs a parse error the fence attributes to the write.
    Rejected(Duration),
    /// Sweeps after the delay, later than the fence waits: answered "not seen".
    Slow(Duration),
    /// The signal is lost: no sweep, answered "not seen".
    Lost,
}

#[async_trait]
impl Reloader for ModelOpenSm {
    fn checkpoint(&self) -> u64 {
        0
    }

    async fn reload(&self, _checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        if opensm_down(&self.world) {
            with(&self.world, |w| {
                w.log("sm host: file written, OpenSM is not running")
            });
            return Err(ReloadError::Unreachable(Unsignalled::Signal {
                pid: 1,
                source: Arc::new(std::io::Error::from_raw_os_error(3)),
            }));
        }
        let signal = with(&self.world, |w| {
            let s = if !w.faults {
                Signal::Sweep(w.ms(20, 200))
            } else {
                match w.rng.random_range(0..100) {
                    0..=59 => Signal::Sweep(w.ms(20, 1_500)),
                    60..=64 => Signal::Rejected(w.ms(20, 1_500)),
                    65..=79 => Signal::Slow(w.ms(2_500, 20_000)),
                    _ => Signal::Lost,
                }
            };
            let what = match &s {
                Signal::Sweep(d) => format!("sweeps in {} ms", d.as_millis()),
                Signal::Rejected(d) => format!(
                    "sweeps in {} ms and reads an operator's momentary broken edit",
                    d.as_millis()
                ),
                Signal::Slow(d) => format!("sweeps late, in {} ms", d.as_millis()),
                Signal::Lost => "signal lost".into(),
            };
            w.log(format!("sm host: file written, OpenSM signalled: {what}"));
            s
        });
        match signal {
            Signal::Sweep(d) => {
                tokio::time::sleep(d).await;
                heavy_sweep(&self.world, &self.file, "signalled");
                Ok(ReloadReport { file_read: true })
            }
            Signal::Rejected(d) => {
                tokio::time::sleep(d).await;
                let sweeps = with(&self.world, |w| {
                    w.log("opensm: heavy sweep (signalled) read a broken file: PARSE ERROR, fell back, tenant keys dropped");
                    w.fabric.sm.config = Some(Keys::new());
                    super::model_sm::sweep_delays(w)
                });
                super::model_sm::start_sweeps(&self.world, sweeps);
                Err(ReloadError::Rejected(
                    "PARSE ERROR: line 2: unexpected token (an operator's momentary edit)".into(),
                ))
            }
            Signal::Slow(d) => {
                let (world, file) = (self.world.clone(), self.file.clone());
                world.lock().expect("world lock").sweeps_pending += 1;
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    world.lock().expect("world lock").sweeps_pending -= 1;
                    heavy_sweep(&world, &file, "a late signal");
                });
                tokio::time::sleep(CHECK).await;
                Ok(ReloadReport { file_read: false })
            }
            Signal::Lost => {
                tokio::time::sleep(CHECK).await;
                Ok(ReloadReport { file_read: false })
            }
        }
    }
}

/// The node's link to the SM host: a model network (delays, lost replies, requests that land
/// after the node gave up) in front of the real backend's `SetNodeMemberships`.
pub struct SmHostLink {
    world: Shared,
    /// The SM host's agent now (None while it is down: requests are refused).
    pub(super) backend: Mutex<Option<OpenSmBackend>>,
    /// The requests it is handling, by request number (lost with it when it crashes).
    pub(super) requests: Mutex<Vec<(u64, tokio::task::JoinHandle<()>)>>,
}

#[async_trait]
impl SubnetManager for SmHostLink {
    fn backend(&self) -> &'static str {
        "remote"
    }

    /// What the SM host's backend stores for the node (`GetNodeMemberships`): the start check
    /// runs in the simulation. No answer while the SM host's agent is down.
    async fn stored_sets(&self, _node: &NodeId) -> Option<Vec<HostStoredSet>> {
        let up = self.backend.lock().expect("backend lock").clone();
        let answer = match up {
            None => StoredSetAnswer::NoAnswer("the SM host's agent is down".into()),
            Some(b) => match b.node(NODE) {
                Some(n) => StoredSetAnswer::Stored(n.generation, n.memberships),
                None => StoredSetAnswer::NotStored,
            },
        };
        Some(vec![HostStoredSet {
            host: "sm-host".into(),
            answer,
        }])
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let keys = keys_of(desired);
        let up = self.backend.lock().expect("backend lock").clone();
        let (id, deliver, reply, lost, no_effect) = with(&self.world, |w| {
            w.note_apply(generation);
            let id = w.next_request;
            w.next_request += 1;
            let roll = if w.faults {
                w.rng.random_range(0..100)
            } else {
                0
            };
            let (deliver, reply, lost, no_effect) = match roll {
                0..=59 => (w.ms(1, 30), w.ms(1, 30), false, false),
                60..=69 => (w.ms(1, 30), w.ms(1, 30), false, true),
                70..=84 => (w.ms(1, 30), w.ms(1, 30), true, false),
                85..=93 => (w.ms(500, 20_000), w.ms(1, 30), false, false),
                // Slower than the node's apply timeout: it gives up, the request lands later.
                _ => (w.ms(61_000, 120_000), w.ms(1, 30), false, false),
            };
            let no_effect = no_effect || up.is_none();
            w.log(format!(
                "agent: apply #{id} generation {generation} keys {} -> {}",
                show_keys(&keys),
                if up.is_none() {
                    "refused: the SM host's agent is down".to_owned()
                } else if no_effect {
                    "lost on the way".to_owned()
                } else {
                    format!(
                        "reaches the SM host in {} ms{}",
                        deliver.as_millis(),
                        if lost { ", its reply will be lost" } else { "" }
                    )
                }
            ));
            if !no_effect {
                w.fabric.in_flight.insert(
                    id,
                    Request {
                        generation,
                        epoch: w.fabric.sm.epoch,
                        keys: keys.clone(),
                        set: None,
                    },
                );
            }
            w.apply_started.notify_waiters();
            (id, deliver, reply, lost, no_effect)
        });
        let Some(backend) = up.filter(|_| !no_effect) else {
            tokio::time::sleep(deliver).await;
            return Err(SmError::Unreachable(injected(InjectedFault::Outage)));
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (world, mut set) = (self.world.clone(), desired.clone());
        set.node_id = fabric_agent::domain::NodeId::parse(NODE).expect("node id");
        let handling = tokio::spawn(async move {
            tokio::time::sleep(deliver).await;
            let result = backend.set_node(set, generation).await;
            with(&world, |w| {
                w.fabric.in_flight.remove(&id);
                match &result {
                    Ok(_) => w.log(format!("sm host: request #{id} answered OK")),
                    Err(e) => w.log(format!("sm host: request #{id} refused: {e}")),
                }
            });
            let _ = tx.send(result);
        });
        {
            let mut requests = self.requests.lock().expect("requests lock");
            requests.retain(|(_, h)| !h.is_finished());
            requests.push((id, handling));
        }
        let result = rx
            .await
            .unwrap_or_else(|_| {
                Err(fabric_agent::sm::OpenSmError::Task {
                    what: "network",
                    source: None,
                })
            })
            .map(|o| ApplyOutcome {
                detail: o.detail,
                acknowledged_by: Vec::new(),
            })
            .map_err(SmError::from);
        tokio::time::sleep(reply).await;
        if lost {
            with(&self.world, |w| {
                w.log(format!("sm host: reply to apply #{id} lost"))
            });
            return Err(SmError::Unreachable(injected(InjectedFault::LostReply)));
        }
        result
    }
}

fn injected(fault: InjectedFault) -> SmFailure {
    SmFailure::Injected {
        backend: "model network",
        fault,
    }
}

/// The SM host for one run: the link the node applies through, the partitions file, the
/// SM host's store and the temp directory that holds them (kept alive with it).
pub struct SmHost {
    /// What the node's agent applies through.
    pub link: Arc<SmHostLink>,
    pub(super) file: PathBuf,
    pub(super) disk: SmHostDisk,
    _dir: tempfile::TempDir,
}

/// Builds the real backend on a fresh partitions file, its model OpenSM and the node's link;
/// registers the SM host with the world's oracle and starts OpenSM's own heavy sweeps. The
/// SM host's store is a file (with its side file) when the schedule restores it.
pub fn start(world: &Shared, steps: &[Step]) -> SmHost {
    let dir = temp_dir();
    let file = dir.path().join("partitions.conf");
    std::fs::write(&file, OPERATOR).expect("partitions file");
    let disk = SmHostDisk::new(dir.path(), steps);
    let backend = backend_on(world, &file, disk.node_store());
    world.lock().expect("world lock").fabric.sm_host = Some(SmHostView {
        backend: Some(backend.clone()),
        file: file.clone(),
        opensm_down: false,
    });
    tokio::spawn(own_sweeps(world.clone(), file.clone()));
    SmHost {
        link: Arc::new(SmHostLink {
            world: world.clone(),
            backend: Mutex::new(Some(backend)),
            requests: Mutex::new(Vec::new()),
        }),
        file,
        disk,
        _dir: dir,
    }
}

/// The real backend on the partitions `file` and `store`, signalling a model OpenSM.
pub(super) fn backend_on(
    world: &Shared,
    file: &Path,
    store: Arc<dyn fabric_agent::sm::opensm::NodeMembershipStore>,
) -> OpenSmBackend {
    let reloader = Arc::new(ModelOpenSm {
        world: world.clone(),
        file: file.to_owned(),
    });
    OpenSmBackend::with_directory(
        OpenSmConfig {
            partitions_file: file.to_owned(),
            pid: Some(1),
            ownership: OwnershipConfig::disabled(),
            watch_ms: 0,
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        store,
        reloader,
        None,
    )
    .expect("the SM host's backend")
}

/// OpenSM's heavy sweeps of its own (a topology change somewhere in the fabric), at random
/// moments while faults are on: each reads whatever the file holds then.
async fn own_sweeps(world: Shared, file: PathBuf) {
    loop {
        let wait = with(&world, |w: &mut World| w.ms(5_000, 60_000));
        tokio::time::sleep(wait).await;
        let faults = world.lock().expect("world lock").faults;
        if faults {
            heavy_sweep(&world, &file, "a topology change");
        }
    }
}

/// OpenSM restarts: it reads the file again at start and programs from it.
pub fn restart(world: &Shared) {
    let file = world
        .lock()
        .expect("world lock")
        .fabric
        .sm_host
        .as_ref()
        .map(|h| h.file.clone());
    with(world, |w| {
        if let Some(h) = w.fabric.sm_host.as_mut() {
            h.opensm_down = false;
        }
        w.log("opensm: restarted")
    });
    if let Some(file) = file {
        heavy_sweep(world, &file, "restart");
    }
}
