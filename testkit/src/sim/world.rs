//! The model world: the truth of the node's fabric ports and of the subnet manager
//! ([`Fabric`], from `core`), the seeded RNG every model decision draws from, the trace, and the
//! oracle. Every change to the world
//! goes through [`with`], which lets the oracle read the agent's new events and check the
//! invariants before and after the change, so no instant between two changes goes unchecked.

use super::core::apply_crash::ApplyCrash;
use super::core::fabric::Fabric;
use super::core::keys::{program_table, Keys};
use super::core::ufm_world::UfmWorld;
use super::core::wall::Wall;
use super::oracle::Oracle;
use fabric_agent::store::Store;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Everything shared between the driver, the model SM and the model observer.
pub struct World {
    /// Start of the run.
    pub t0: Instant,
    /// The node's wall clock, stepped by the schedule's clock steps.
    pub wall: Wall,
    /// The one RNG model decisions draw from (derived from the seed).
    pub rng: StdRng,
    /// Whether random faults are on.
    pub faults: bool,
    /// The truth.
    pub fabric: Fabric,
    /// The checker.
    pub oracle: Oracle,
    /// What happened, with simulated times.
    pub trace: Vec<String>,
    /// Signalled when a port table or state changes (the observer's trap).
    pub changes: Arc<Notify>,
    /// Signalled when an apply starts.
    pub apply_started: Arc<Notify>,
    /// Signalled when a read starts.
    pub read_started: Arc<Notify>,
    /// Request numbers.
    pub next_request: u64,
    /// Number of applies issued.
    pub applies: u64,
    /// Number of reads issued.
    pub reads: u64,
    /// Port sweeps the SM has yet to run.
    pub sweeps_pending: u64,
    /// The model UFM (`--ufm` runs).
    pub ufm: Option<UfmWorld>,
    /// A crash armed for the next apply's `n`-th poll.
    pub apply_crash: Option<ApplyCrash>,
    /// A crash armed for the next command: its poll, how long the agent stays down (ms).
    pub command_crash: Option<(u32, u64)>,
    /// The node's whole state directory was put back: check 5 goes on from the generation
    /// the fabric side holds at the node's next apply (`rollback::generations_from_here`).
    pub generation_floor_pending: bool,
}

/// The world behind a lock (never held across an await).
pub type Shared = Arc<Mutex<World>>;

impl World {
    /// A fresh world for a seed.
    pub fn new(seed: u64, store: Arc<Store>) -> Shared {
        let t0 = Instant::now();
        Arc::new(Mutex::new(World {
            t0,
            wall: Wall::new(t0),
            rng: StdRng::seed_from_u64(seed ^ 0x5EED_F00D_FAB1_C0DE),
            faults: false,
            fabric: Fabric::new(),
            oracle: Oracle::new(store),
            trace: Vec::new(),
            changes: Arc::new(Notify::new()),
            apply_started: Arc::new(Notify::new()),
            read_started: Arc::new(Notify::new()),
            next_request: 1,
            applies: 0,
            reads: 0,
            sweeps_pending: 0,
            ufm: None,
            apply_crash: None,
            command_crash: None,
            generation_floor_pending: false,
        }))
    }

    /// Simulated milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// Appends a trace line stamped with the simulated time.
    pub fn log(&mut self, line: impl AsRef<str>) {
        let t = self.now_ms();
        self.trace.push(format!("t={t:>7} ms  {}", line.as_ref()));
    }

    /// Lets the oracle catch up with the agent's events and check every invariant now.
    pub fn check(&mut self) {
        let now = self.now_ms();
        self.oracle.sync(&self.fabric, now);
        for note in std::mem::take(&mut self.oracle.notes) {
            self.log(format!("(seen) {note}"));
        }
    }

    /// Programs port `i` from the SM's current config (if up) and signals the change.
    pub fn program_port(&mut self, i: usize) {
        let empty = Keys::new();
        let cfg = self.fabric.sm.config.as_ref().unwrap_or(&empty);
        let table = program_table(cfg, self.fabric.ports[i].guid);
        let port = &mut self.fabric.ports[i];
        if port.up && port.table != table {
            port.table = table;
            let line = format!("sm: port {i} programmed: {:04x?}", port.table);
            self.log(line);
            self.changes.notify_waiters();
        }
    }

    /// Counts an apply carrying `generation` and checks the node's generations strictly
    /// increase over its whole life, crashes included (the old protocol sent 0 every time;
    /// that is not a regression of this check).
    pub fn note_apply(&mut self, generation: u64) {
        self.applies += 1;
        if std::mem::take(&mut self.generation_floor_pending) {
            let held = self.fabric.answered_generation();
            self.log(format!(
                "check 5 goes on from the generation the fabric side tells ({held}); the node \
                 sent up to {} before its whole state directory was put back",
                self.fabric.max_generation_seen
            ));
            self.fabric.max_generation_seen = held;
        }
        let max = self.fabric.max_generation_seen;
        if generation != 0 && generation <= max {
            let now = self.now_ms();
            self.oracle.finding.get_or_insert(format!(
                "seen at t={now} ms: the node sent generation {generation}, not above {max} \
                 which it sent before"
            ));
        }
        self.fabric.max_generation_seen = max.max(generation);
    }

    /// A random duration in `lo..hi` ms.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        use rand::Rng;
        Duration::from_millis(self.rng.random_range(lo..hi))
    }

    /// A random event with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        use rand::Rng;
        self.rng.random_bool(p)
    }
}

/// Runs `f` on the world between two oracle checks.
pub fn with<R>(world: &Shared, f: impl FnOnce(&mut World) -> R) -> R {
    let mut w = world.lock().expect("world lock");
    w.check();
    let r = f(&mut w);
    w.check();
    r
}
