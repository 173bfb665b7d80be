//! The SM hosts of the simulation: each one the real agent code (an `OpenSmBackend` on its own
//! partitions file and in-memory store, behind the catch-up gate, `PeerSync` with real `Fences`
//! and the real `Partitions` service the nodes call), composed as `daemon::backend` composes it,
//! beside a model OpenSM that is either running or not.

use async_trait::async_trait;
use fabric_agent::api::gate::Caller;
use fabric_agent::api::proto::sm as pb;
use fabric_agent::api::proto::sm::partitions_server::Partitions;
use fabric_agent::api::sm_v1::convert::memberships_to_proto;
use fabric_agent::api::PartitionsService;
use fabric_agent::domain::{Guid, NodeMemberships, PKey};
use fabric_agent::sm::opensm::fabric_side::OpenSmSide;
use fabric_agent::sm::opensm::fence::{FenceEvidence, Fences, PeerIdentity};
use fabric_agent::sm::opensm::members::members_of;
use fabric_agent::sm::opensm::opensm_state::{LogStateReader, OpenSmState};
use fabric_agent::sm::opensm::running_start::{file_members, KeepRunningKeys};
use fabric_agent::sm::opensm::sminfo::{PeerSmCheck, SmRole};
use fabric_agent::sm::opensm::sync::{GatedStore, Peer, PeerAnswer, PeerSync};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::common::sm_host::AcceptingReloader;

/// The port GUID host `i`'s OpenSM is bound to (what fencing checks).
pub fn sm_guid(i: usize) -> u64 {
    0x5000 + i as u64
}

/// Host `i`'s name, as it states it and its peers know it.
pub fn host_name(i: usize) -> String {
    format!("smhost{i}")
}

/// What the hosts can reach of each other, and which OpenSMs run.
#[derive(Default)]
pub struct Net {
    pub syncs: Vec<Option<Arc<PeerSync>>>,
    pub cut: BTreeSet<(usize, usize)>,
    pub opensm: Vec<bool>,
    /// The rule switched off to show the oracle fails: the evidence says every SM is silent.
    pub evidence_lies: bool,
}

pub type SharedNet = Arc<Mutex<Net>>;

struct SimPeer {
    from: usize,
    to: usize,
    endpoint: String,
    net: SharedNet,
}

#[async_trait]
impl Peer for SimPeer {
    fn name(&self) -> &str {
        &self.endpoint
    }
    async fn pull(&self, from_host: &str) -> Result<PeerAnswer, String> {
        let peer = {
            let net = self.net.lock().unwrap();
            let pair = (self.from.min(self.to), self.from.max(self.to));
            if net.cut.contains(&pair) {
                return Err("partitioned".into());
            }
            net.syncs[self.to].clone()
        };
        // Outside the lock: the answer reads the peer's role, whose pid check is the model's.
        match peer {
            Some(s) => Ok(s.answer(from_host)),
            None => Err("agent down".into()),
        }
    }
}

/// The physical evidence, from the model: an SM that runs answers SMInfo (as standby), one
/// that does not is silent.
struct SimEvidence(SharedNet);

#[async_trait]
impl FenceEvidence for SimEvidence {
    async fn check(&self, guid: u64) -> PeerSmCheck {
        let net = self.0.lock().unwrap();
        let i = (guid - sm_guid(0)) as usize;
        if net.opensm[i] && !net.evidence_lies {
            PeerSmCheck::Answers(OpenSmState::Standby)
        } else {
            PeerSmCheck::Silent("no SMInfo answer from its port (model)".into())
        }
    }
}

/// A running agent.
pub struct AgentRun {
    pub backend: OpenSmBackend,
    pub service: PartitionsService,
    pub sync: Arc<PeerSync>,
}

/// One earlier state of a host's disk: store and partitions file together.
#[derive(Clone)]
pub struct Snapshot {
    pub store: Arc<InMemoryNodeStore>,
    pub file: Vec<u8>,
    pub step: usize,
}

/// One SM host: its disk (kept across crashes), its agent and its OpenSM.
pub struct Host {
    pub index: usize,
    pub store: Arc<InMemoryNodeStore>,
    pub file: PathBuf,
    pub log: PathBuf,
    pub agent: Option<AgentRun>,
    /// Step at which the agent last started (a restore counts as a start).
    pub started: usize,
    pub snapshot: Option<Snapshot>,
}

fn copy_store(from: &InMemoryNodeStore) -> Arc<InMemoryNodeStore> {
    let to = Arc::new(InMemoryNodeStore::default());
    let nodes = from.load_all().unwrap();
    let commit = from.load_commit_state().unwrap();
    to.put_group(&nodes, Some(&commit)).unwrap();
    to.put_retired(&from.load_retired().unwrap()).unwrap();
    to.put_fenced(&from.load_fenced().unwrap()).unwrap();
    to
}

impl Host {
    pub fn new(index: usize, dir: &Path) -> Host {
        let file = dir.join(format!("h{index}.conf"));
        std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
        Host {
            index,
            store: Arc::default(),
            file,
            log: dir.join(format!("h{index}.log")),
            agent: None,
            started: 0,
            snapshot: None,
        }
    }

    /// Starts the agent as `daemon::backend` does: every stored set held back (keeping the
    /// running file's keys when OpenSM runs), no commit before the catch-up, real fences on
    /// the model evidence, one catch-up round, region rewritten.
    pub async fn start_agent(&mut self, hosts: usize, net: &SharedNet, step: usize) {
        let i = self.index;
        let opensm_runs = net.lock().unwrap().opensm[i];
        let raw: Arc<dyn NodeMembershipStore> = self.store.clone();
        let gated: Arc<dyn NodeMembershipStore> = if opensm_runs {
            Arc::new(KeepRunningKeys {
                store: raw,
                file: file_members(&self.file),
            })
        } else {
            Arc::new(GatedStore(raw))
        };
        let backend = OpenSmBackend::with_reloader(
            OpenSmConfig {
                partitions_file: self.file.clone(),
                pid: Some(12345),
                ownership: OwnershipConfig::disabled(),
                watch_ms: 0,
                commit_linger_ms: 0,
                commit_linger_max_ms: 0,
                node_commit_interval_ms: 0,
                ..OpenSmConfig::default()
            },
            host_name(i),
            gated.clone(),
            Arc::new(AcceptingReloader),
        )
        .unwrap();
        backend.hold_commits_until_caught_up();
        let others: Vec<usize> = (0..hosts).filter(|j| *j != i).collect();
        let peers = others
            .iter()
            .map(|j| {
                Arc::new(SimPeer {
                    from: i,
                    to: *j,
                    endpoint: format!("h{j}"),
                    net: net.clone(),
                }) as Arc<dyn Peer>
            })
            .collect();
        let identities = others
            .iter()
            .map(|j| PeerIdentity {
                endpoint: format!("h{j}"),
                name: Some(host_name(*j)),
                sm_port_guid: Some(sm_guid(*j)),
            })
            .collect();
        // Every missed pull counts as past the fence bound (the simulation has no clock).
        let fences = Fences::new(
            host_name(i),
            identities,
            Some(Arc::new(SimEvidence(net.clone())) as Arc<dyn FenceEvidence>),
            Some(gated),
            Duration::ZERO,
        )
        .unwrap();
        let pid_net = net.clone();
        let role = SmRole::from_log(Arc::new(LogStateReader::new(self.log.clone())))
            .with_pid_check(Some(Box::new(move || {
                if pid_net.lock().unwrap().opensm[i] {
                    Ok(12345)
                } else {
                    Err("OpenSM's pid is gone (model)".into())
                }
            })));
        let sync = PeerSync::with_fences(
            backend.clone(),
            host_name(i),
            peers,
            Some(Arc::new(role)),
            Arc::new(fences),
        );
        let side = OpenSmSide::new(backend.clone(), None).with_sync(Some(sync.clone()));
        sync.catch_up(Duration::from_secs(5)).await;
        net.lock().unwrap().syncs[i] = Some(sync.clone());
        self.agent = Some(AgentRun {
            backend,
            service: PartitionsService::new(side),
            sync,
        });
        self.started = step;
    }

    pub fn stop_agent(&mut self, net: &SharedNet) {
        self.agent = None;
        net.lock().unwrap().syncs[self.index] = None;
    }

    pub fn take_snapshot(&mut self, step: usize) {
        self.snapshot = Some(Snapshot {
            store: copy_store(&self.store),
            file: std::fs::read(&self.file).unwrap(),
            step,
        });
    }

    /// Database and partitions file back from one earlier snapshot (the host is down).
    pub fn restore(&mut self) -> Option<usize> {
        let s = self.snapshot.clone()?;
        self.store = copy_store(&s.store);
        std::fs::write(&self.file, &s.file).unwrap();
        Some(s.step)
    }

    /// The node's set through the real `Partitions` service (what a node's call runs).
    pub async fn set(
        &self,
        set: &NodeMemberships,
        generation: u64,
    ) -> Result<pb::SetNodeMembershipsResponse, tonic::Status> {
        let Some(agent) = &self.agent else {
            return Err(tonic::Status::unavailable("agent down"));
        };
        let mut request = tonic::Request::new(pb::SetNodeMembershipsRequest {
            memberships: Some(memberships_to_proto(set, generation)),
        });
        request.extensions_mut().insert(Caller::InsecureTest);
        agent
            .service
            .set_node_memberships(request)
            .await
            .map(|r| r.into_inner())
    }

    /// The node's stored set through the real `Partitions` service's `GetNodeMemberships`
    /// (what the node's start check asks; a held-back set is an UNAVAILABLE there).
    pub async fn stored(&self, node: &str) -> Result<pb::NodeMemberships, tonic::Status> {
        let Some(agent) = &self.agent else {
            return Err(tonic::Status::unavailable("agent down"));
        };
        let mut request = tonic::Request::new(pb::GetNodeMembershipsRequest {
            node_id: node.to_owned(),
        });
        request.extensions_mut().insert(Caller::InsecureTest);
        agent
            .service
            .get_node_memberships(request)
            .await
            .map(|r| r.into_inner())
    }

    /// Whether the partitions file gives `key` to the port `guid` (either membership).
    pub fn file_gives(&self, key: u32, guid: Guid) -> bool {
        let bytes = std::fs::read(&self.file).unwrap();
        members_of(&bytes, PKey::new(key).unwrap())
            .unwrap_or_default()
            .iter()
            .any(|m| m.guid == guid)
    }

    /// Whether the agent's stored set that it serves and programs (not held back) gives `key`
    /// to the port `guid`.
    pub fn store_gives(&self, node: &str, key: u32, guid: Guid) -> bool {
        self.agent.as_ref().is_some_and(|a| {
            a.backend
                .node(node)
                .is_some_and(|n| !n.gated && n.memberships.gives(PKey::new(key).unwrap(), guid))
        })
    }
}
