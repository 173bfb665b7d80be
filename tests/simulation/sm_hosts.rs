//! Deterministic simulation of several SM hosts, driving the real SM-host code: each host is an
//! `OpenSmBackend` on its own partitions file and in-memory store (kept across its crashes),
//! behind the catch-up gate (`GatedStore`) with `PeerSync` pulling its peers over links the
//! schedule can cut. Model nodes send every set to every host and count it acknowledged only
//! when every host acknowledged it (the remote backend's rule); the model fabric's OpenSM master
//! is the live host of highest priority, and after every step it programs the ports from *its*
//! file (as OpenSM does at every heavy sweep and at takeover). A restarted host's agent catches
//! up before its OpenSM runs (the systemd order). Schedules crash and restart hosts (failover,
//! a returning stale master), cut and heal the links between hosts and between a node and a
//! host, and attach, release and retry on the nodes.
//!
//! Oracle, after every step:
//! - a key a node reported RELEASED is on none of its ports afterwards (until it attaches that
//!   key again);
//! - an ACTIVE key survives a failover: when the master changes, the new master's agent has run
//!   since the key was acknowledged (so it acknowledged it), and the node has not released it,
//!   the key is still on the port after the new master's sweep.
//!
//! `FABRIC_SIM_SM_HOSTS_SEEDS=N` runs N seeds (default 24), `FABRIC_SIM_SM_HOSTS_SEED=S` one;
//! a failure prints its seed and the steps.

use testkit::common;

use async_trait::async_trait;
use common::memberships::memberships;
use common::sm_host::AcceptingReloader;
use fabric_agent::domain::{Guid, Membership, NodeId, NodeMemberships, PKey};
use fabric_agent::sm::opensm::fabric_side::OpenSmSide;
use fabric_agent::sm::opensm::members::members_of;
use fabric_agent::sm::opensm::sync::{GatedStore, Peer, PeerAnswer, PeerSync};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
};
use fabric_agent::sm::FabricSide;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const HOSTS: usize = 3;
const NODES: usize = 3;
const KEYS: [u32; 4] = [0x0a01, 0x0a02, 0x0a03, 0x0a04];

/// What the hosts can reach of each other.
#[derive(Default)]
struct Net {
    syncs: Vec<Option<Arc<PeerSync>>>,
    cut: BTreeSet<(usize, usize)>,
}

struct SimPeer {
    from: usize,
    to: usize,
    name: String,
    net: Arc<Mutex<Net>>,
}

#[async_trait]
impl Peer for SimPeer {
    fn name(&self) -> &str {
        &self.name
    }
    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String> {
        let net = self.net.lock().unwrap();
        let pair = (self.from.min(self.to), self.from.max(self.to));
        if net.cut.contains(&pair) {
            return Err("partitioned".into());
        }
        match &net.syncs[self.to] {
            Some(s) => Ok(s.answer(from_host)),
            None => Err("down".into()),
        }
    }
}

struct Host {
    store: Arc<InMemoryNodeStore>,
    file: PathBuf,
    up: Option<(OpenSmBackend, OpenSmSide)>,
    /// Step at which the agent last started.
    started: usize,
}

#[derive(Clone, Debug, PartialEq)]
enum KeyState {
    Pending,
    Active { acked_at: usize },
    Releasing,
    Released,
}

struct Node {
    id: NodeId,
    guid: Guid,
    generation: u64,
    /// The key this node wants (one partition per port).
    desired: Option<u32>,
    /// Keys and what the node has said about them.
    keys: BTreeMap<u32, KeyState>,
    /// An apply is owed (not yet acknowledged by every host).
    dirty: bool,
    /// Hosts this node cannot reach.
    cut: BTreeSet<usize>,
}

struct World {
    dir: tempfile::TempDir,
    hosts: Vec<Host>,
    nodes: Vec<Node>,
    net: Arc<Mutex<Net>>,
    /// Keys on each node's port, as the master last programmed them.
    ports: Vec<BTreeSet<u32>>,
    master: Option<usize>,
    step: usize,
    log: Vec<String>,
}

fn set_of(n: &Node) -> NodeMemberships {
    memberships(
        n.id.as_str(),
        [n.guid.0],
        n.desired.iter().map(|k| (*k, Membership::Full)),
        |k| format!("t{k:x}"),
    )
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let hosts = (0..HOSTS)
            .map(|i| {
                let file = dir.path().join(format!("h{i}.conf"));
                std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
                Host {
                    store: Arc::default(),
                    file,
                    up: None,
                    started: 0,
                }
            })
            .collect();
        let nodes = (0..NODES)
            .map(|i| Node {
                id: NodeId::parse(&format!("node{i}")).unwrap(),
                guid: Guid(0x100 + i as u64),
                generation: 0,
                desired: None,
                keys: BTreeMap::new(),
                dirty: false,
                cut: BTreeSet::new(),
            })
            .collect();
        let net = Arc::new(Mutex::new(Net {
            syncs: vec![None; HOSTS],
            cut: BTreeSet::new(),
        }));
        World {
            dir,
            hosts,
            nodes,
            net,
            ports: vec![BTreeSet::new(); NODES],
            master: None,
            step: 0,
            log: Vec::new(),
        }
    }

    /// Starts host `i`'s agent: gated store, peers, one catch-up round, region rewritten.
    async fn start_host(&mut self, i: usize) {
        let h = &self.hosts[i];
        let backend = OpenSmBackend::with_reloader(
            OpenSmConfig {
                partitions_file: h.file.clone(),
                pid: Some(12345),
                ownership: OwnershipConfig::disabled(),
                watch_ms: 0,
                commit_linger_ms: 0,
                commit_linger_max_ms: 0,
                ..OpenSmConfig::default()
            },
            format!("smhost{i}"),
            Arc::new(GatedStore(h.store.clone() as Arc<dyn NodeMembershipStore>)),
            Arc::new(AcceptingReloader),
        )
        .unwrap();
        let peers = (0..HOSTS)
            .filter(|j| *j != i)
            .map(|j| {
                Arc::new(SimPeer {
                    from: i,
                    to: j,
                    name: format!("h{j}"),
                    net: self.net.clone(),
                }) as Arc<dyn Peer>
            })
            .collect();
        let sync = PeerSync::new(backend.clone(), format!("smhost{i}"), peers, None);
        let side = OpenSmSide::new(backend.clone(), None).with_sync(Some(sync.clone()));
        sync.catch_up(Duration::from_secs(5)).await;
        self.net.lock().unwrap().syncs[i] = Some(sync);
        self.hosts[i].up = Some((backend, side));
        self.hosts[i].started = self.step;
    }

    fn crash_host(&mut self, i: usize) {
        self.hosts[i].up = None;
        self.net.lock().unwrap().syncs[i] = None;
    }

    async fn round(&mut self, i: usize) {
        let sync = self.net.lock().unwrap().syncs[i].clone();
        if let Some(s) = sync {
            s.round().await;
        }
    }

    /// Node `n` sends its set to every host; acknowledged only when all did.
    async fn apply(&mut self, n: usize) {
        self.nodes[n].generation += 1;
        let generation = self.nodes[n].generation;
        let set = set_of(&self.nodes[n]);
        let mut all = true;
        let mut stale = None;
        for h in 0..HOSTS {
            let reach = !self.nodes[n].cut.contains(&h);
            let Some((_, side)) = self.hosts[h].up.as_ref().filter(|_| reach) else {
                all = false;
                continue;
            };
            match side.set_node(set.clone(), &[], generation).await {
                Ok(_) => {}
                Err(e) if e.stored_generation().is_some() => {
                    stale = e.stored_generation();
                    all = false;
                }
                Err(e) => panic!("unexpected refusal: {e}"),
            }
        }
        if let Some(stored) = stale {
            self.nodes[n].generation = self.nodes[n].generation.max(stored);
        }
        let node = &mut self.nodes[n];
        node.dirty = !all;
        if all {
            let step = self.step;
            for (k, s) in node.keys.iter_mut() {
                if Some(*k) == node.desired && *s == KeyState::Pending {
                    *s = KeyState::Active { acked_at: step };
                }
            }
        }
    }

    /// The live host of highest priority (the lowest index) programs the ports from its file.
    fn sweep(&mut self) -> Option<usize> {
        let master = (0..HOSTS).find(|h| self.hosts[*h].up.is_some());
        let old = self.master;
        self.master = master;
        let Some(m) = master else {
            return old; // no SM: the ports keep their tables
        };
        let bytes = std::fs::read(&self.hosts[m].file).unwrap();
        for (i, n) in self.nodes.iter().enumerate() {
            let mut held = BTreeSet::new();
            for k in KEYS {
                let members = members_of(&bytes, PKey::new(k).unwrap()).unwrap_or_default();
                if members.iter().any(|m| m.guid == n.guid) {
                    held.insert(k);
                }
            }
            self.ports[i] = held;
        }
        old
    }

    /// RELEASED for keys acknowledged away and off the port.
    fn claim(&mut self) {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if n.dirty {
                continue;
            }
            for (k, s) in n.keys.iter_mut() {
                if *s == KeyState::Releasing && !self.ports[i].contains(k) {
                    *s = KeyState::Released;
                }
            }
        }
    }

    fn check(&self, old_master: Option<usize>) -> Result<(), String> {
        for (i, n) in self.nodes.iter().enumerate() {
            for (k, s) in &n.keys {
                if *s == KeyState::Released && self.ports[i].contains(k) {
                    return Err(format!("{k:#06x} back on node{i}'s port after RELEASED"));
                }
                if let (KeyState::Active { acked_at }, Some(m)) = (s, self.master) {
                    let failover = old_master.is_some_and(|o| o != m);
                    if failover && self.hosts[m].started < *acked_at && !self.ports[i].contains(k) {
                        return Err(format!(
                            "{k:#06x} lost from node{i}'s port when smhost{m} took over"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    async fn step_once(&mut self, rng: &mut StdRng) -> Result<(), String> {
        self.step += 1;
        let what = rng.random_range(0..100u32);
        let line = match what {
            0..=19 => {
                let n = rng.random_range(0..NODES);
                let node = &mut self.nodes[n];
                let busy = node.keys.values().any(|s| matches!(s, KeyState::Releasing));
                if node.desired.is_none() && !busy {
                    let k = KEYS[rng.random_range(0..KEYS.len())];
                    node.desired = Some(k);
                    node.keys.insert(k, KeyState::Pending);
                    self.apply(n).await;
                    format!("node{n} attaches {k:#06x}")
                } else {
                    format!("node{n} busy")
                }
            }
            20..=34 => {
                let n = rng.random_range(0..NODES);
                let node = &mut self.nodes[n];
                if let Some(k) = node.desired.take() {
                    node.keys.insert(k, KeyState::Releasing);
                    self.apply(n).await;
                    format!("node{n} releases {k:#06x}")
                } else {
                    format!("node{n} idle")
                }
            }
            35..=54 => {
                let n = rng.random_range(0..NODES);
                if self.nodes[n].dirty {
                    self.apply(n).await;
                }
                format!("node{n} retries")
            }
            55..=64 => {
                let h = rng.random_range(0..HOSTS);
                if self.hosts[h].up.is_some() {
                    self.crash_host(h);
                    format!("smhost{h} dies")
                } else {
                    self.start_host(h).await;
                    format!("smhost{h} returns")
                }
            }
            65..=74 => {
                let (a, b) = (rng.random_range(0..HOSTS), rng.random_range(0..HOSTS));
                let pair = (a.min(b), a.max(b));
                let mut net = self.net.lock().unwrap();
                if !net.cut.remove(&pair) {
                    net.cut.insert(pair);
                    format!("cut smhost{} - smhost{}", pair.0, pair.1)
                } else {
                    format!("heal smhost{} - smhost{}", pair.0, pair.1)
                }
            }
            75..=79 => {
                let (n, h) = (rng.random_range(0..NODES), rng.random_range(0..HOSTS));
                let cut = &mut self.nodes[n].cut;
                if !cut.remove(&h) {
                    cut.insert(h);
                    format!("node{n} loses smhost{h}")
                } else {
                    format!("node{n} reaches smhost{h} again")
                }
            }
            _ => {
                let h = rng.random_range(0..HOSTS);
                self.round(h).await;
                format!("smhost{h} pulls its peers")
            }
        };
        self.log.push(line);
        let old = self.sweep();
        self.claim();
        self.check(old)
    }
}

async fn run(seed: u64, steps: usize) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = World::new();
    for h in 0..HOSTS {
        w.start_host(h).await;
    }
    w.sweep();
    for _ in 0..steps {
        if let Err(e) = w.step_once(&mut rng).await {
            let tail = w.log[w.log.len().saturating_sub(25)..].join("\n  ");
            return Err(format!("seed {seed}, step {}: {e}\n  {tail}", w.step));
        }
    }
    drop(w.dir);
    Ok(())
}

#[test]
fn several_sm_hosts_never_bring_a_released_key_back_and_keep_keys_across_failover() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seeds: Vec<u64> = match std::env::var("FABRIC_SIM_SM_HOSTS_SEED") {
        Ok(s) => vec![s.parse().expect("a seed")],
        Err(_) => {
            let n = std::env::var("FABRIC_SIM_SM_HOSTS_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(24u64);
            (1..=n).collect()
        }
    };
    let started = std::time::Instant::now();
    for seed in &seeds {
        if let Err(e) = runtime.block_on(run(*seed, 150)) {
            panic!("{e}");
        }
    }
    eprintln!(
        "{} schedules of 150 steps, {HOSTS} SM hosts, {NODES} nodes: no violation ({:?})",
        seeds.len(),
        started.elapsed()
    );
}
