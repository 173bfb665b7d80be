//! Two SM hosts in one process, built as the daemon builds an SM host with peers
//! (`daemon::backend::build_ha`): each an [`OpenSmBackend`] on its own OpenSM's partitions file,
//! log and pid file, with the real reloader behind [`StandbyAware`] (SIGHUP and the sweep fence
//! on the master; a standby's write confirmed by its log's STANDBY and a SIGHUP it ignores), a
//! [`GatedStore`] over an in-memory store, commits held until the catch-up, and a [`PeerSync`]
//! pulling the other host. The pull goes straight to the peer's [`PeerSync::answer`] (no gRPC,
//! no TLS). Nodes send to both hosts through [`OpenSmSide`] (the SM-host service's path, which
//! records the set for the peers' pulls) and count an apply acknowledged by the node's own rule
//! ([`host_set::judge`]): every SM host any answer names, less the ones every answer holds
//! fenced.

use crate::opensm_support::{secs, Check};
use async_trait::async_trait;
use fabric_agent::api::sm_v1::{convert::fenced_to_proto, host_set};
use fabric_agent::domain::NodeMemberships;
use fabric_agent::proto::sm as pb;
use fabric_agent::sm::opensm::fabric_side::OpenSmSide;
use fabric_agent::sm::opensm::opensm_state::LogStateReader;
use fabric_agent::sm::opensm::reload::OpenSmReloader;
use fabric_agent::sm::opensm::sminfo::{pid_check, SmRole};
use fabric_agent::sm::opensm::standby::StandbyAware;
use fabric_agent::sm::opensm::sync::{GatedStore, Peer, PeerAnswer, PeerSync};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
    ReloadMethod,
};
use fabric_agent::sm::FabricSide;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Where one SM host's OpenSM keeps its files, and its pid.
pub struct OpenSmFiles {
    /// Its partitions file (each host its own).
    pub partitions: PathBuf,
    /// Its log (the sweep fence reads it).
    pub log: PathBuf,
    /// Its pid file.
    pub pid_file: PathBuf,
}

/// One SM host: backend, the service's side of it, and its sync.
pub struct SmHost {
    /// The name it states (and the name its peer pulls it by).
    pub name: String,
    /// The backend (commits, sweeps).
    pub backend: OpenSmBackend,
    /// What the SM-host service calls for a node's set.
    pub side: OpenSmSide,
    /// Anti-entropy with the peer.
    pub sync: Arc<PeerSync>,
    /// Its OpenSM's log.
    pub log: PathBuf,
}

/// A peer reached in-process: the other host's [`PeerSync::answer`].
struct InProcessPeer {
    name: String,
    target: Arc<OnceLock<Arc<PeerSync>>>,
}

#[async_trait]
impl Peer for InProcessPeer {
    fn name(&self) -> &str {
        &self.name
    }
    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String> {
        match self.target.get() {
            Some(sync) => Ok(sync.answer(from_host)),
            None => Err(format!("{} is not started", self.name)),
        }
    }
}

fn config(files: &OpenSmFiles) -> OpenSmConfig {
    OpenSmConfig {
        partitions_file: files.partitions.clone(),
        log_file: files.log.clone(),
        pid_file: Some(files.pid_file.clone()),
        reload: ReloadMethod::Sighup,
        reload_check_ms: 30_000,
        group_commit: true,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    }
}

fn host(
    name: &str,
    files: &OpenSmFiles,
    peer: &str,
    peer_sync: Arc<OnceLock<Arc<PeerSync>>>,
) -> Check<SmHost> {
    let cfg = config(files);
    let role = Arc::new(
        SmRole::from_log(Arc::new(LogStateReader::new(cfg.log_file.clone())))
            .with_pid_check(pid_check(&cfg)),
    );
    let reloader = Arc::new(StandbyAware::new(
        Arc::new(OpenSmReloader::new(&cfg)),
        role.clone(),
        &cfg,
    ));
    let store: Arc<dyn NodeMembershipStore> =
        Arc::new(GatedStore(Arc::new(InMemoryNodeStore::default())));
    let backend = OpenSmBackend::with_reloader(cfg, name.to_owned(), store, reloader)
        .map_err(|e| format!("FAILED: SM host {name}: backend: {e}"))?;
    backend.hold_commits_until_caught_up();
    let peers: Vec<Arc<dyn Peer>> = vec![Arc::new(InProcessPeer {
        name: peer.to_owned(),
        target: peer_sync,
    })];
    let sync = PeerSync::new(backend.clone(), name.to_owned(), peers, Some(role));
    let side = OpenSmSide::new(backend.clone(), None).with_sync(Some(sync.clone()));
    Ok(SmHost {
        name: name.to_owned(),
        backend,
        side,
        sync,
        log: files.log.clone(),
    })
}

/// Two SM hosts, each pulling the other every `sync_every` (in the background until dropped).
pub struct TwoHosts {
    /// The hosts, `a` then `b`.
    pub hosts: Arc<[SmHost; 2]>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl TwoHosts {
    /// Builds both hosts, runs their catch-up (each pulls the other once and rewrites its
    /// region, as before an agent reports ready) and starts their pull loops.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        files: [&OpenSmFiles; 2],
        sync_every: Duration,
    ) -> Check<TwoHosts> {
        let names = ["smhost-a", "smhost-b"];
        let cells = [Arc::new(OnceLock::new()), Arc::new(OnceLock::new())];
        let a = host(names[0], files[0], names[1], cells[1].clone())?;
        let b = host(names[1], files[1], names[0], cells[0].clone())?;
        let _ = cells[0].set(a.sync.clone());
        let _ = cells[1].set(b.sync.clone());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let caught = rt.block_on(async {
            let (x, y) = tokio::join!(
                a.sync.catch_up(Duration::from_secs(30)),
                b.sync.catch_up(Duration::from_secs(30))
            );
            for s in [&a.sync, &b.sync] {
                tokio::spawn(s.clone().run(sync_every, stopped.clone()));
            }
            x && y
        });
        if !caught {
            return Err("FAILED: the two SM hosts did not catch up with each other".into());
        }
        Ok(TwoHosts {
            hosts: Arc::new([a, b]),
            stop,
        })
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for h in self.hosts.iter() {
            h.backend.shutdown();
        }
    }
}

/// One node's apply to both hosts: when each host answered (from the node's send), and when
/// the node counted it acknowledged (the later answer; `None` if it never did, with why).
pub struct NodeApply {
    /// When the node sent, from the storm's start (zero outside a storm).
    pub sent: Duration,
    /// Host a's answer, from the send (from the storm's start after [`storm_both`]).
    pub a: Duration,
    /// Host b's answer, likewise.
    pub b: Duration,
    /// The node's verdict: acknowledged by every SM host it must count, or why not.
    pub verdict: Result<(), String>,
}

impl NodeApply {
    /// The node's latency: from its send to the later of the two answers.
    pub fn latency(&self) -> Duration {
        self.a.max(self.b).saturating_sub(self.sent)
    }
}

fn reply_of(host: &SmHost, sweeps: u64) -> pb::SetNodeMembershipsResponse {
    let hosts = host.side.sm_hosts().unwrap_or_default();
    pb::SetNodeMembershipsResponse {
        sweeps,
        host: hosts.host,
        known_hosts: hosts.known,
        fenced_hosts: hosts.fenced.iter().map(fenced_to_proto).collect(),
        not_fenced: hosts.not_fenced,
    }
}

/// Sends `set` to both hosts at once (as a node sends to each of its endpoints) and judges
/// the answers by the node's rule.
pub async fn apply_both(hosts: &[SmHost; 2], set: NodeMemberships, generation: u64) -> NodeApply {
    async fn one(
        h: &SmHost,
        set: NodeMemberships,
        generation: u64,
        sent: Instant,
    ) -> (Result<u64, fabric_agent::sm::FabricSideError>, Duration) {
        let r = h.side.set_node(set, &[], generation).await;
        (r, sent.elapsed())
    }
    let sent = Instant::now();
    let ((ra, a), (rb, b)) = tokio::join!(
        one(&hosts[0], set.clone(), generation, sent),
        one(&hosts[1], set, generation, sent)
    );
    let replies = [
        ra.map(|s| reply_of(&hosts[0], s))
            .map_err(|e| e.to_string()),
        rb.map(|s| reply_of(&hosts[1], s))
            .map_err(|e| e.to_string()),
    ];
    let views: Vec<host_set::EndpointView<'_>> = hosts
        .iter()
        .zip(&replies)
        .map(|(h, r)| host_set::EndpointView {
            endpoint: &h.name,
            verified: None,
            remembered: Some(h.name.clone()),
            reply: r.as_ref().ok(),
        })
        .collect();
    let verdict = host_set::judge(&views);
    let verdict = if verdict.complete() {
        Ok(())
    } else {
        let errors: Vec<String> = hosts
            .iter()
            .zip(&replies)
            .filter_map(|(h, r)| r.as_ref().err().map(|e| format!("{}: {e}", h.name)))
            .collect();
        Err(format!(
            "not acknowledged: problems {:?}, unacknowledged endpoints {:?}, errors {errors:?}",
            verdict.problems, verdict.unacknowledged
        ))
    };
    NodeApply {
        sent: Duration::ZERO,
        a,
        b,
        verdict,
    }
}

/// Sends every set to both hosts (one task per node, the calls' starts spread evenly over
/// `spread`) and waits for every node's verdict, up to `deadline`.
pub fn storm_both(
    rt: &tokio::runtime::Runtime,
    hosts: &Arc<[SmHost; 2]>,
    sets: Vec<NodeMemberships>,
    generation: u64,
    deadline: Duration,
    spread: Duration,
) -> Check<Vec<NodeApply>> {
    let n = sets.len();
    let out = rt.block_on(async {
        let begin = tokio::time::Instant::now();
        let tasks: Vec<_> = sets
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let hosts = hosts.clone();
                let at = begin + spread.mul_f64(i as f64 / n.max(1) as f64);
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    let sent = begin.elapsed();
                    let mut r = apply_both(&hosts, m, generation).await;
                    // Counted from the storm's start, as the wall time to the last answer.
                    r.a += sent;
                    r.b += sent;
                    r.sent = sent;
                    r
                })
            })
            .collect();
        tokio::time::timeout(deadline, async {
            let mut out = Vec::with_capacity(n);
            for t in tasks {
                out.push(t.await.expect("apply task"));
            }
            out
        })
        .await
    });
    let out = out.map_err(|_| {
        format!(
            "TIMEOUT: {n} nodes' applies to both SM hosts not all answered within {}",
            secs(deadline)
        )
    })?;
    Ok(out)
}
