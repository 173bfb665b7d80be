//! Fencing a dead peer SM host, on physical evidence, without consensus.
//!
//! Nodes count an apply acknowledged when every SM host of the fabric that is not fenced
//! acknowledged it (`api::sm_v1::host_set`), and a host is excused only when *every* host that
//! answered holds it fenced. This host fences a peer only when both hold:
//! 1. the peer's agent has not answered this host's pulls (`PullNodeSets`) for `fence_after`
//!    (default three sync intervals), and
//! 2. the peer's SM is proven not running: the [`FenceEvidence`] says its SM port does not
//!    answer SMInfo, or is not in the fabric at all (down or gone).
//!
//! An SM that still answers SMInfo could become master with a file its (dead) agent no longer
//! keeps: such a peer is *not* fenced. Releases then wait on it, and the standing condition
//! `SM_HOST_AGENT_SILENT` says why and what the operator can do (stop that OpenSM, then
//! `fabric-agent fence-sm-host NAME`, which makes the same check). A fence is stored durably
//! before it is reported; it is lifted (durably) only when the peer's agent answers a pull again,
//! says it has caught up *and* its answer serves no set older than one this host holds (a
//! caught-up flag alone says the peer pulled every peer once, not that it
//! holds what was confirmed while it was fenced): its OpenSM (bound to its agent) then reads a
//! file that holds every set confirmed meanwhile. A stored fence is checked again at every
//! round until it is lifted (the peer's agent silent, or answering but behind): when the
//! evidence no longer proves its SM not running (it answers SMInfo again, or cannot be
//! checked), the fence is withdrawn and the peer counts again (nodes wait on it,
//! `SM_HOST_AGENT_SILENT` says why), so an OpenSM started on a fenced host is never excused
//! for longer than one sync interval. A pull from a fenced peer stops excusing it to the
//! nodes at once ([`Fences::pulled_by`]): its agent is back, and its catch-up (which pulls)
//! comes before its OpenSM starts; the fence stays stated to the peers until it is lifted.
//!
//! Each host decides on its own evidence (the fences peers report are shown, not adopted), so no
//! agreement protocol is needed: a host that cannot see the evidence does not excuse the peer,
//! and the nodes then keep waiting. With three or more SM hosts an engine operators already run
//! for this (an etcd lease, Pacemaker/corosync fencing) could sit behind [`FenceEvidence`].

use super::opensm_state::OpenSmState;
use super::sminfo::{PeerSmCheck, SmInfoReader};
use super::store::NodeMembershipStore;
use crate::domain::{Condition, ConditionKind};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use super::fenced_host::FencedHost;

/// The SM-host set this host states in every answer to a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmHostSet {
    /// This host's name.
    pub host: String,
    /// Every SM host it knows: itself and its peers.
    pub known: Vec<String>,
    /// The ones it holds fenced.
    pub fenced: Vec<FencedHost>,
    /// Peers whose agent is silent but which it has not fenced, each with why and what to do.
    pub not_fenced: Vec<String>,
}

/// What one pull round heard from a peer that answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heard {
    /// The name it stated.
    pub stated: String,
    /// Whether it says it has caught up with all its peers.
    pub caught_up: bool,
    /// Why it is behind this host: a set it serves older than this host's, or a revocation it
    /// lacks (`PeerAnswer::behind`); `None` when it is not.
    pub behind: Option<String>,
}

/// Whether a peer's SM is running, from physical evidence.
#[async_trait]
pub trait FenceEvidence: Send + Sync + 'static {
    /// Checks the SM bound to port `guid`.
    async fn check(&self, guid: u64) -> PeerSmCheck;
}

/// The physical evidence: the SA's view of the port and a LID-routed SMInfo Get to it, over the
/// umad device this host already reads its own SM's SMInfo on (one read at a time with it).
pub struct SmInfoEvidence(pub Arc<super::sminfo::SmRole>);

#[async_trait]
impl FenceEvidence for SmInfoEvidence {
    async fn check(&self, guid: u64) -> PeerSmCheck {
        match self.0.reader() {
            Some(reader) => reader.check_peer(guid).await,
            None => PeerSmCheck::Unknown("sminfo_umad_device is not set".to_owned()),
        }
    }
}

/// A standalone [`FenceEvidence`] over a device (the `fence-sm-host` command's, when the agent
/// is not the one checking).
pub struct DeviceEvidence(pub SmInfoReader);

#[async_trait]
impl FenceEvidence for DeviceEvidence {
    async fn check(&self, guid: u64) -> PeerSmCheck {
        self.0.check_peer(guid).await
    }
}

/// One configured peer.
#[derive(Debug, Clone)]
pub struct PeerIdentity {
    /// Its agent's endpoint.
    pub endpoint: String,
    /// The name it must state: configured, or the TLS name this host verifies; `None` for a
    /// plaintext peer without a configured name (the name it states is taken).
    pub name: Option<String>,
    /// The port GUID its OpenSM is bound to (`None`: never fenced automatically).
    pub sm_port_guid: Option<u64>,
}

/// Why a fence was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceRefusal {
    /// No such peer.
    #[error("{0:?} is not a peer SM host of this host (known: {1})")]
    UnknownPeer(String, String),
    /// The peer's agent answered recently.
    #[error("the agent of {0} answered a pull {1} ms ago: it is alive, not fenced")]
    AgentAlive(String, u128),
    /// No port GUID configured for it.
    #[error(
        "no SM port GUID is configured for {0} (peer_sm_port_guids): its SM cannot be checked"
    )]
    NoGuid(String),
    /// The SM answers.
    #[error("the SM of {0} answers SMInfo ({1}): it could become master with a stale file; stop that OpenSM first")]
    SmAlive(String, String),
    /// The check proved nothing.
    #[error("the SM of {0} could not be checked: {1}")]
    Unknown(String, String),
    /// The fence could not be stored.
    #[error("the fence of {0} could not be stored: {1}")]
    Store(String, String),
}

#[derive(Debug, Default)]
struct State {
    fenced: BTreeMap<String, FencedHost>,
    last_answer: BTreeMap<String, Instant>,
    stated: BTreeMap<String, String>,
    silent: BTreeMap<String, String>,
    /// Fenced peers whose agent pulled this host since: no longer excused to the nodes, still
    /// stated fenced to the peers (so the returning host holds its sets back) until lifted.
    returned: std::collections::BTreeSet<String>,
}

/// The fences of one SM host and the SM-host set it states.
pub struct Fences {
    host: String,
    /// Replaced on SIGHUP ([`Fences::replace_peers`]).
    peers: std::sync::RwLock<Arc<Vec<PeerIdentity>>>,
    evidence: Option<Arc<dyn FenceEvidence>>,
    ledger: Option<Arc<dyn NodeMembershipStore>>,
    fence_after: Duration,
    started: Instant,
    state: Mutex<State>,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Fences {
    /// This host `host` with `peers`; fences are kept in `ledger` (loaded now) and decided on
    /// `evidence` after `fence_after` without an answer. Without a ledger or evidence, nothing
    /// is ever fenced.
    pub fn new(
        host: String,
        peers: Vec<PeerIdentity>,
        evidence: Option<Arc<dyn FenceEvidence>>,
        ledger: Option<Arc<dyn NodeMembershipStore>>,
        fence_after: Duration,
    ) -> Result<Fences, super::store::NodeStoreError> {
        let fenced = match &ledger {
            Some(l) => l.load_fenced()?,
            None => Vec::new(),
        };
        if !fenced.is_empty() {
            tracing::warn!(fenced = ?fenced.iter().map(|f| f.host.as_str()).collect::<Vec<_>>(), "peer SM hosts held fenced (stored): they rejoin when their agent answers again, caught up");
        }
        Ok(Fences {
            host,
            peers: std::sync::RwLock::new(Arc::new(peers)),
            evidence,
            ledger,
            fence_after,
            started: Instant::now(),
            state: Mutex::new(State {
                fenced: fenced.into_iter().map(|f| (f.host.clone(), f)).collect(),
                ..State::default()
            }),
        })
    }

    /// No fencing: `host` and the peers' endpoints only.
    pub fn plain(host: String, endpoints: &[String]) -> Fences {
        let peers = endpoints
            .iter()
            .map(|e| PeerIdentity {
                endpoint: e.clone(),
                name: None,
                sm_port_guid: None,
            })
            .collect();
        Fences {
            host,
            peers: std::sync::RwLock::new(Arc::new(peers)),
            evidence: None,
            ledger: None,
            fence_after: Duration::MAX,
            started: Instant::now(),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The peers in effect.
    pub fn peers(&self) -> Arc<Vec<PeerIdentity>> {
        self.peers.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `peers` in effect (SIGHUP, `sync::reload`). A peer that stays keeps what this host
    /// heard of it; a removed one is forgotten, except its fence, which stays stored and stated
    /// (should it come back, it rejoins only through the catch-up, like any fenced host).
    pub fn replace_peers(&self, peers: Vec<PeerIdentity>) {
        let mut state = self.lock();
        let kept: Vec<String> = peers.iter().map(|p| p.endpoint.clone()).collect();
        state.last_answer.retain(|e, _| kept.contains(e));
        state.stated.retain(|e, _| kept.contains(e));
        let names: Vec<String> = peers.iter().map(|p| self.name_in(&state, p)).collect();
        state.silent.retain(|n, _| names.contains(n));
        *self.peers.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(peers);
    }

    /// This host's stated name.
    pub fn host(&self) -> &str {
        &self.host
    }

    fn name_in(&self, state: &State, peer: &PeerIdentity) -> String {
        peer.name
            .clone()
            .or_else(|| state.stated.get(&peer.endpoint).cloned())
            .unwrap_or_else(|| peer.endpoint.clone())
    }

    /// A peer's name: configured or verified, else the one it stated, else its endpoint.
    pub fn name_of(&self, endpoint: &str) -> String {
        let state = self.lock();
        self.peers()
            .iter()
            .find(|p| p.endpoint == endpoint)
            .map_or_else(|| endpoint.to_owned(), |p| self.name_in(&state, p))
    }

    /// What this host states to the nodes. A plaintext peer (test rigs: loopback only) that has
    /// not stated its name since this agent started, with none configured, is left out: no node
    /// could name it either (over TLS a peer's name is always known: configured or verified).
    pub fn host_set(&self) -> SmHostSet {
        let state = self.lock();
        let mut known = vec![self.host.clone()];
        known.extend(self.peers().iter().filter_map(|p| {
            p.name
                .clone()
                .or_else(|| state.stated.get(&p.endpoint).cloned())
        }));
        SmHostSet {
            host: self.host.clone(),
            known,
            fenced: state
                .fenced
                .values()
                .filter(|f| !state.returned.contains(&f.host))
                .cloned()
                .collect(),
            not_fenced: state
                .silent
                .iter()
                .map(|(name, why)| format!("{name} is not fenced: {why}"))
                .collect(),
        }
    }

    /// The peers held fenced.
    pub fn fenced(&self) -> Vec<FencedHost> {
        self.lock().fenced.values().cloned().collect()
    }

    fn store(&self, fenced: &BTreeMap<String, FencedHost>) -> Result<(), String> {
        let Some(ledger) = &self.ledger else {
            return Err("no store for fences".to_owned());
        };
        let all: Vec<FencedHost> = fenced.values().cloned().collect();
        ledger.put_fenced(&all).map_err(|e| e.to_string())
    }

    /// `fenced` with `name` fenced by `record` (`Some`) or no longer fenced (`None`), stored
    /// first and then put in effect; on a store error nothing changes.
    fn put_fenced(
        &self,
        state: &mut State,
        name: &str,
        record: Option<FencedHost>,
    ) -> Result<(), String> {
        let mut after = state.fenced.clone();
        match record {
            Some(r) => after.insert(name.to_owned(), r),
            None => after.remove(name),
        };
        self.store(&after)?;
        state.fenced = after;
        state.returned.remove(name);
        Ok(())
    }

    /// After a pull round: `answers` per peer endpoint, what it said when it answered. Lifts the
    /// fence of a peer that answered caught up and holding every set this host serves; checks
    /// again the evidence of every fenced peer that stayed silent (withdrawing the fence when
    /// it no longer holds); fences a peer silent for `fence_after` whose SM the evidence proves
    /// not running.
    pub async fn after_round(&self, answers: &[(String, Option<Heard>)]) {
        let now = Instant::now();
        let mut to_check: Vec<(PeerIdentity, String, Duration)> = Vec::new();
        let mut to_recheck: Vec<(PeerIdentity, String, Option<Duration>)> = Vec::new();
        {
            let mut state = self.lock();
            let peers = self.peers();
            for (endpoint, answer) in answers {
                let Some(peer) = peers.iter().find(|p| &p.endpoint == endpoint) else {
                    continue;
                };
                match answer {
                    Some(heard) => {
                        if !heard.stated.is_empty() {
                            state.stated.insert(endpoint.clone(), heard.stated.clone());
                        }
                        state.last_answer.insert(endpoint.clone(), now);
                        let name = self.name_in(&state, peer);
                        state.silent.remove(&name);
                        if state.fenced.contains_key(&name) {
                            if !heard.caught_up {
                                to_recheck.push((peer.clone(), name, None));
                                continue;
                            }
                            if let Some(behind) = &heard.behind {
                                tracing::info!(peer = %name, %behind, "the fenced peer SM host answers caught up but does not hold every set this host serves yet: it stays fenced while its SM is proven not running");
                                to_recheck.push((peer.clone(), name, None));
                                continue;
                            }
                            match self.put_fenced(&mut state, &name, None) {
                                Ok(()) => {
                                    tracing::warn!(peer = %name, "fence lifted: the peer SM host's agent answers again, has caught up and holds every set this host serves");
                                }
                                Err(e) => {
                                    tracing::warn!(peer = %name, error = %e, "the peer SM host is back and caught up, but lifting its fence could not be stored; it stays fenced")
                                }
                            }
                        }
                    }
                    None => {
                        let name = self.name_in(&state, peer);
                        let since = state
                            .last_answer
                            .get(endpoint)
                            .copied()
                            .unwrap_or(self.started);
                        let silent = now.saturating_duration_since(since);
                        if state.fenced.contains_key(&name) {
                            to_recheck.push((peer.clone(), name, Some(silent)));
                        } else if silent >= self.fence_after {
                            to_check.push((peer.clone(), name, silent));
                        }
                    }
                }
            }
        }
        for (peer, name, silent) in to_recheck {
            self.recheck(&peer, &name, silent).await;
        }
        for (peer, name, silent) in to_check {
            let decided = Instant::now();
            let verdict = self.judge(&peer, &name).await;
            match verdict {
                Ok(evidence) => {
                    let record = FencedHost {
                        host: name.clone(),
                        since_unix_ms: now_unix_ms(),
                        evidence: format!("agent silent for {} ms; {evidence}", silent.as_millis()),
                    };
                    let mut state = self.lock();
                    match self.put_fenced(&mut state, &name, Some(record.clone())) {
                        Ok(()) => {
                            state.silent.remove(&name);
                            tracing::warn!(peer = %name, evidence = %record.evidence, check_ms = u64::try_from(decided.elapsed().as_millis()).unwrap_or(u64::MAX), "fenced the peer SM host: its agent does not answer and its SM is not running; the nodes' applies go on without it");
                        }
                        Err(e) => {
                            tracing::warn!(peer = %name, error = %e, "the peer SM host is proven dead but its fence could not be stored; not fenced");
                            state.silent.insert(
                                name.clone(),
                                format!("its fence could not be stored: {e}"),
                            );
                        }
                    }
                }
                Err(why) => {
                    let reason = format!(
                        "its agent ({}) has not answered for {} s and {why}: releases and attaches wait on it; stop that OpenSM (then it is fenced on the next pull once its port stops answering SMInfo), or run `fabric-agent fence-sm-host {name}` here once it is stopped",
                        peer.endpoint,
                        silent.as_secs()
                    );
                    let mut state = self.lock();
                    if state.silent.get(&name).map(|r| r.split(" s and ").nth(1))
                        != Some(reason.split(" s and ").nth(1))
                    {
                        tracing::warn!(peer = %name, %reason, "peer SM host not fenced");
                    }
                    state.silent.insert(name, reason);
                }
            }
        }
    }

    /// A peer stating `name` pulled this host: its agent is alive, so it is not silent (its
    /// fence bound starts again), and a fence of it stops excusing it to the nodes at once,
    /// before its catch-up ends and its OpenSM (bound to its agent) starts: it counts again,
    /// and nodes wait on it until it acknowledges. The fence stays stored and stated to the
    /// peers (the returning host holds its sets back while a peer states it fenced) until it is
    /// lifted. The name is the one the caller states (only a peer may pull); a false one can
    /// only stop an excuse, which makes nodes wait, never excuse.
    pub fn pulled_by(&self, name: &str) {
        let mut state = self.lock();
        let peers = self.peers();
        if let Some(peer) = peers.iter().find(|p| self.name_in(&state, p) == name) {
            state
                .last_answer
                .insert(peer.endpoint.clone(), Instant::now());
            state.silent.remove(name);
        }
        if state.fenced.contains_key(name) && state.returned.insert(name.to_owned()) {
            tracing::warn!(peer = %name, "the fenced peer SM host's agent pulls this host again: the nodes wait on it again; its fence stands until it holds every set");
        }
    }

    /// Checks again the evidence of a fenced peer that stays fenced this round (its agent silent,
    /// or answering but not yet holding every set this host serves): when its SM is no
    /// longer proven not running, the fence is withdrawn (durably) and the peer counts again,
    /// with a standing reason. A withdrawal that cannot be stored still takes effect here (the
    /// peer counts again now); after a restart the stored fence is checked again by the first
    /// round (the catch-up, before the agent serves).
    /// `silent`: how long its agent has not answered (`None`: it answers, behind).
    async fn recheck(&self, peer: &PeerIdentity, name: &str, silent: Option<Duration>) {
        let Err(why) = self.judge(peer, name).await else {
            return;
        };
        let agent = match silent {
            None => format!(
                "its agent ({}) answers but has not caught up with what was confirmed while it was fenced",
                peer.endpoint
            ),
            Some(silent) => format!(
                "its agent ({}) has not answered for {} s",
                peer.endpoint,
                silent.as_secs()
            ),
        };
        let reason = format!(
            "{why}; it had been fenced: the fence is withdrawn and releases and attaches wait on it again ({agent}); stop that OpenSM, or let its agent catch up"
        );
        let mut state = self.lock();
        if !state.fenced.contains_key(name) {
            return;
        }
        match self.put_fenced(&mut state, name, None) {
            Ok(()) => {
                tracing::warn!(peer = %name, %reason, "fence withdrawn: the fenced peer SM host's SM is no longer proven not running")
            }
            Err(e) => {
                // In effect anyway: the peer must count again now.
                state.fenced.remove(name);
                state.returned.remove(name);
                tracing::warn!(peer = %name, %reason, error = %e, "fence withdrawn in memory; storing the withdrawal failed (after a restart the stored fence is checked again by the first round)")
            }
        }
        state.silent.insert(name.to_owned(), reason);
    }

    /// The evidence that `peer`'s SM is not running, or why it is not proven.
    async fn judge(&self, peer: &PeerIdentity, name: &str) -> Result<String, String> {
        let Some(guid) = peer.sm_port_guid else {
            return Err(format!(
                "no SM port GUID is configured for {name} (peer_sm_port_guids): its SM cannot be checked"
            ));
        };
        let Some(evidence) = &self.evidence else {
            return Err("no fence evidence is configured (sminfo_umad_device)".to_owned());
        };
        match evidence.check(guid).await {
            PeerSmCheck::Silent(e) => Ok(e),
            PeerSmCheck::Answers(state) => Err(format!(
                "its SM still answers SMInfo on port {guid:#018x} ({}): it could become master with a stale file, so it is not fenced",
                state_word(state)
            )),
            PeerSmCheck::Unknown(why) => Err(format!("its SM could not be checked ({why})")),
        }
    }

    /// Whether no peer's agent has answered for `fence_after` (every peer silent): then this host
    /// may itself be fenced by its peers, if they are alive. False without peers or fencing.
    pub fn every_peer_silent(&self) -> bool {
        if self.peers().is_empty() || self.fence_after == Duration::MAX {
            return false;
        }
        let state = self.lock();
        self.peers().iter().all(|p| {
            state
                .last_answer
                .get(&p.endpoint)
                .copied()
                .unwrap_or(self.started)
                .elapsed()
                >= self.fence_after
        })
    }

    /// The first peer whose SM answers SMInfo in-band (it is alive, and may have fenced this
    /// host), with its state; `None` when no peer's SM is seen answering.
    pub async fn a_peer_sm_answers(&self) -> Option<String> {
        let evidence = self.evidence.as_ref()?;
        for peer in self.peers().iter() {
            let Some(guid) = peer.sm_port_guid else {
                continue;
            };
            if let PeerSmCheck::Answers(s) = evidence.check(guid).await {
                return Some(format!(
                    "{} ({})",
                    self.name_of(&peer.endpoint),
                    state_word(s)
                ));
            }
        }
        None
    }

    /// The operator's fence (`fabric-agent fence-sm-host NAME`): the same physical check, made
    /// now; refused while the peer's agent answered within `fence_after`, or its SM answers.
    pub async fn fence_now(&self, name: &str) -> Result<FencedHost, FenceRefusal> {
        let (peer, last) = {
            let state = self.lock();
            let Some(peer) = self
                .peers()
                .iter()
                .find(|p| self.name_in(&state, p) == name || p.endpoint == name)
                .cloned()
            else {
                let known: Vec<String> = self
                    .peers()
                    .iter()
                    .map(|p| self.name_in(&state, p))
                    .collect();
                return Err(FenceRefusal::UnknownPeer(name.to_owned(), known.join(", ")));
            };
            if let Some(f) = state.fenced.get(&self.name_in(&state, &peer)) {
                return Ok(f.clone());
            }
            let last = state.last_answer.get(&peer.endpoint).copied();
            (peer, last)
        };
        let name = self.name_of(&peer.endpoint);
        if let Some(at) = last.filter(|at| at.elapsed() < self.fence_after) {
            return Err(FenceRefusal::AgentAlive(name, at.elapsed().as_millis()));
        }
        let Some(guid) = peer.sm_port_guid else {
            return Err(FenceRefusal::NoGuid(name));
        };
        let Some(evidence) = &self.evidence else {
            return Err(FenceRefusal::Unknown(
                name,
                "no fence evidence is configured (sminfo_umad_device)".to_owned(),
            ));
        };
        let evidence = match evidence.check(guid).await {
            PeerSmCheck::Silent(e) => e,
            PeerSmCheck::Answers(s) => {
                return Err(FenceRefusal::SmAlive(name, state_word(s).to_owned()))
            }
            PeerSmCheck::Unknown(why) => return Err(FenceRefusal::Unknown(name, why)),
        };
        let record = FencedHost {
            host: name.clone(),
            since_unix_ms: now_unix_ms(),
            evidence: format!("fenced by the operator; {evidence}"),
        };
        let mut state = self.lock();
        self.put_fenced(&mut state, &name, Some(record.clone()))
            .map_err(|e| FenceRefusal::Store(name.clone(), e))?;
        state.silent.remove(&name);
        tracing::warn!(peer = %name, evidence = %record.evidence, "fenced the peer SM host (operator)");
        Ok(record)
    }

    /// `SM_HOST_FENCED` per fenced peer, `SM_HOST_AGENT_SILENT` per silent peer not fenced.
    pub fn conditions(&self) -> Vec<Condition> {
        let state = self.lock();
        let mut out: Vec<Condition> = state
            .fenced
            .values()
            .map(|f| Condition {
                kind: ConditionKind::SmHostFenced,
                detail: format!(
                    "peer SM host {} is fenced since {} (unix ms): {}; {}",
                    f.host,
                    f.since_unix_ms,
                    f.evidence,
                    if state.returned.contains(&f.host) {
                        "its agent pulls this host again, so the nodes wait on it again; the fence stands until it holds every set this host holds"
                    } else {
                        "the nodes' applies go on without it until its agent answers again, caught up"
                    }
                ),
            })
            .collect();
        out.extend(state.silent.iter().map(|(name, why)| Condition {
            kind: ConditionKind::SmHostAgentSilent,
            detail: format!("peer SM host {name} is not fenced: {why}"),
        }));
        out
    }
}

fn state_word(s: OpenSmState) -> &'static str {
    match s {
        OpenSmState::Master => "master",
        OpenSmState::Standby => "standby",
        OpenSmState::Discovering => "discovering",
        _ => "not active",
    }
}

#[cfg(test)]
mod tests;
