//! The fleet client: one follower per registered node, the store writer, the aggregated view,
//! the attach and release helpers, and the delete guard's I/O.

use crate::connect::{channel, ConnectError};
use crate::follower::{self, Shared};
use crate::grant::{GrantError, Signer};
use crate::guard::{fabric_side, node_side, Blocker, Decision, GuardError};
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use crate::proto::agent::{
    AttachPartitionRequest, AttachPartitionResponse, Event, GetAttachmentRequest, Membership,
    Partition, PortName, ReleaseInstanceRequest, ReleaseInstanceResponse,
};
use crate::proto::grant::{self, Grant};
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::proto::sm::ListPartitionMembersRequest;
use crate::registry::{Endpoint, Registry};
use crate::store::{AttachRecord, Store, StoreError};
use crate::view::{now_ms, state_name, NodeDurable, View};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, watch, Semaphore};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Why a fleet operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A channel could not be built.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Signing failed (or no signer is configured).
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The node is not in the registry.
    #[error("node {0:?} is not in the nodes file")]
    UnknownNode(String),
    /// The node released the instance, but not every SM host confirmed the revocation that
    /// follows it: call release again (idempotent) until every one does.
    #[error("node {node} released instance {instance}, but the revocation on the SM hosts is not confirmed everywhere: {}", crate::fabric_side::describe(.failures))]
    Revoke {
        /// The node.
        node: String,
        /// The instance.
        instance: String,
        /// The node's answer to the release.
        released: Box<ReleaseInstanceResponse>,
        /// The SM hosts that did not confirm.
        failures: Vec<crate::fabric_side::SmHostFailure>,
    },
    /// The delete guard could not decide.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// The partition may be deleted, but not every SM host confirmed the P_Key's retirement:
    /// call delete again (idempotent) before the key goes to another tenant.
    #[error("partition {partition_id}: P_Key {pkey:#06x} not retired on every SM host: {}", crate::fabric_side::describe(.failures))]
    Retire {
        /// The partition.
        partition_id: String,
        /// Its key.
        pkey: u32,
        /// The SM hosts that did not confirm.
        failures: Vec<crate::fabric_side::SmHostFailure>,
    },
    /// The node answered with an error status.
    #[error("node {node}: {code:?}: {message}")]
    Node {
        /// The node.
        node: String,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
}

/// What to attach (the grant is made from it).
#[derive(Debug, Clone)]
pub struct AttachSpec {
    /// The node.
    pub node_id: String,
    /// The instance on it.
    pub instance_id: String,
    /// The partition (its `fabric` is the grant's).
    pub partition: Partition,
    /// Full or limited.
    pub membership: Membership,
    /// Wait up to this long for ACTIVE.
    pub wait_ms: Option<u32>,
    /// The instance's ports (a partial-node instance): each a device and port number or a port
    /// GUID. Empty: every fabric port of the node (a whole-node instance).
    pub ports: Vec<PortName>,
}

/// What [`Fleet::delete_partition`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Deleted {
    /// The guard said yes and every SM host of the fabric retired the P_Key as of this time:
    /// the partition may be deleted and its key given to another tenant (with new grants).
    Retired {
        /// The retirement time sent (this client's clock, ms since the Unix epoch).
        retired_at_unix_ms: u64,
    },
    /// The guard said no: nothing was retired.
    Blocked(Vec<Blocker>),
}

/// The fleet client. Drop it or call [`Fleet::shutdown`] to stop following.
pub struct Fleet {
    registry: Registry,
    store: Store,
    view: Arc<Mutex<View>>,
    agents: HashMap<String, Channel>,
    sm_hosts: Vec<(String, String, Channel)>,
    events: broadcast::Sender<(String, Event)>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    signer: Option<Signer>,
}

impl Fleet {
    /// Opens the store, loads the persisted view and builds (lazy) channels. Nothing is dialled
    /// until [`Fleet::follow`] or a helper is called.
    pub fn open(registry: Registry, store_path: &std::path::Path) -> Result<Fleet, FleetError> {
        let store = Store::open(store_path)?;
        let mut view = View::default();
        for (node, durable) in store.nodes()? {
            view.nodes.entry(node).or_default().durable = durable;
        }
        let keepalive = Duration::from_millis(registry.follow.keepalive_ms);
        let mut agents = HashMap::new();
        for n in &registry.nodes {
            agents.insert(n.id.clone(), channel(&n.endpoint, keepalive)?);
        }
        let mut sm_hosts = Vec::new();
        for h in &registry.sm_hosts {
            sm_hosts.push((
                h.fabric.clone(),
                describe(&h.endpoint),
                channel(&h.endpoint, keepalive)?,
            ));
        }
        let (events, _) = broadcast::channel(4096);
        let (stop, _) = watch::channel(false);
        Ok(Fleet {
            registry,
            store,
            view: Arc::new(Mutex::new(view)),
            agents,
            sm_hosts,
            events,
            stop,
            tasks: Vec::new(),
            writer: None,
            signer: None,
        })
    }

    /// Sets the grant signer the attach helper uses.
    pub fn with_signer(mut self, signer: Signer) -> Fleet {
        self.signer = Some(signer);
        self
    }

    /// Starts the store writer and one follower per node.
    pub fn follow(&mut self) {
        if self.writer.is_some() {
            return;
        }
        let (writes, rx) = mpsc::unbounded_channel();
        self.writer = Some(tokio::spawn(write_loop(
            self.store.clone(),
            self.view.clone(),
            rx,
        )));
        let shared = Arc::new(Shared {
            view: self.view.clone(),
            writes,
            events: self.events.clone(),
            permits: Arc::new(Semaphore::new(self.registry.follow.max_concurrent_connects)),
            config: self.registry.follow.clone(),
        });
        for n in &self.registry.nodes {
            self.tasks.push(tokio::spawn(follower::run(
                n.id.clone(),
                self.agents[&n.id].clone(),
                shared.clone(),
                self.stop.subscribe(),
            )));
        }
    }

    /// Stops every follower and waits until the store holds every applied event.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        // The followers' senders are gone with them: the writer drains and exits.
        if let Some(w) = self.writer.take() {
            let _ = w.await;
        }
    }

    /// A copy of the aggregated view.
    pub fn view(&self) -> View {
        self.view.lock().expect("view lock").clone()
    }

    /// Reads the view under its lock without copying it.
    pub fn with_view<T>(&self, f: impl FnOnce(&View) -> T) -> T {
        f(&self.view.lock().expect("view lock"))
    }

    /// Every node's applied events, merged, as they are applied.
    pub fn subscribe(&self) -> broadcast::Receiver<(String, Event)> {
        self.events.subscribe()
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Waits until every node was heard from (caught up, or failed once), at most `limit`;
    /// returns whether all were.
    pub async fn wait_settled(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let settled = self.with_view(|v| {
                self.registry.nodes.iter().all(|n| {
                    v.nodes
                        .get(&n.id)
                        .is_some_and(|x| x.live.caught_up || (x.live.settled && !x.live.reachable))
                })
            });
            if settled {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn agent(&self, node_id: &str) -> Result<FabricAgentClient<Channel>, FleetError> {
        self.agents
            .get(node_id)
            .cloned()
            .map(FabricAgentClient::new)
            .ok_or_else(|| FleetError::UnknownNode(node_id.to_owned()))
    }

    /// Signs a grant for exactly this attach, records the attach durably in the ledger (so the
    /// delete guard counts it even if the reply is lost), then sends AttachPartition with it.
    pub async fn attach(&self, spec: AttachSpec) -> Result<AttachPartitionResponse, FleetError> {
        let mut client = self.agent(&spec.node_id)?;
        let signer = self
            .signer
            .as_ref()
            .ok_or_else(|| GrantError::Keys("no signing keys configured ([signing])".into()))?;
        let membership = match spec.membership {
            Membership::Limited => grant::Membership::Limited,
            _ => grant::Membership::Full,
        };
        let issued = now_ms();
        let grant = Grant {
            grant_id: format!("g-{issued:x}-{:016x}", rand::random::<u64>()),
            fabric: spec.partition.fabric.clone(),
            node_id: spec.node_id.clone(),
            instance_id: spec.instance_id.clone(),
            partition_id: spec.partition.id.clone(),
            pkey: spec.partition.pkey,
            membership: membership as i32,
            issued_at_unix_ms: issued,
        };
        let signed = signer.sign(&grant)?;
        let released_before = self.with_view(|v| {
            let i = v
                .nodes
                .get(&spec.node_id)?
                .durable
                .instances
                .get(&spec.instance_id)?;
            i.released().then(|| (i.epoch.clone(), i.seq))
        });
        self.store.record_attach(&AttachRecord {
            node_id: spec.node_id.clone(),
            instance_id: spec.instance_id.clone(),
            partition_id: spec.partition.id.clone(),
            fabric: spec.partition.fabric.clone(),
            pkey: spec.partition.pkey,
            grant_id: grant.grant_id.clone(),
            recorded_at_ms: issued,
            released_before,
        })?;
        let request = AttachPartitionRequest {
            partition: Some(spec.partition),
            instance_id: spec.instance_id,
            membership: spec.membership as i32,
            wait_ms: spec.wait_ms,
            grant: Some(signed),
            ports: spec.ports,
        };
        client
            .attach_partition(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| node_error(&spec.node_id, s))
    }

    /// Sends ReleaseInstance for an instance on a node, then RevokeInstance for it on every
    /// configured SM host, so the fabric side takes the instance's keys off and consumes its
    /// grants whatever the node does. The node's answer, or [`FleetError::Revoke`] (carrying it)
    /// when an SM host did not confirm the revocation: call again, both calls are idempotent.
    pub async fn release(
        &self,
        node_id: &str,
        instance_id: &str,
        wait_ms: Option<u32>,
    ) -> Result<ReleaseInstanceResponse, FleetError> {
        let released = self
            .agent(node_id)?
            .release_instance(ReleaseInstanceRequest {
                instance_id: instance_id.to_owned(),
                wait_ms,
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| node_error(node_id, s))?;
        let hosts: Vec<(String, Channel)> = self
            .sm_hosts
            .iter()
            .map(|(_, e, ch)| (e.clone(), ch.clone()))
            .collect();
        let failures = crate::fabric_side::revoke_everywhere(
            &hosts,
            self.registry.follow.call_timeout(),
            node_id,
            instance_id,
        )
        .await;
        if failures.is_empty() {
            Ok(released)
        } else {
            Err(FleetError::Revoke {
                node: node_id.to_owned(),
                instance: instance_id.to_owned(),
                released: Box::new(released),
                failures,
            })
        }
    }

    /// Deletes a partition on the fabric side: asks the delete guard ([`Fleet::may_delete`])
    /// and, only when it says yes, retires the partition's P_Key on every SM host of its fabric
    /// as of now, so no grant signed for the old partition is accepted again and the key may
    /// go to another tenant. [`Deleted::Blocked`] when the guard says no (nothing retired);
    /// [`FleetError::Retire`] when an SM host did not confirm (call again: idempotent).
    pub async fn delete_partition(&self, partition: &Partition) -> Result<Deleted, FleetError> {
        if let Decision::No(blockers) = self.may_delete(&partition.id).await? {
            return Ok(Deleted::Blocked(blockers));
        }
        let hosts: Vec<(String, Channel)> = self
            .sm_hosts
            .iter()
            .filter(|(f, _, _)| *f == partition.fabric)
            .map(|(_, e, ch)| (e.clone(), ch.clone()))
            .collect();
        if hosts.is_empty() {
            return Err(GuardError::NoSmHost(partition.fabric.clone()).into());
        }
        let retired_at_unix_ms = now_ms();
        let failures = crate::fabric_side::retire_everywhere(
            &hosts,
            self.registry.follow.call_timeout(),
            &partition.id,
            partition.pkey,
            retired_at_unix_ms,
        )
        .await;
        if failures.is_empty() {
            Ok(Deleted::Retired { retired_at_unix_ms })
        } else {
            Err(FleetError::Retire {
                partition_id: partition.id.clone(),
                pkey: partition.pkey,
                failures,
            })
        }
    }

    /// Every attach this client recorded for a partition.
    pub fn attaches(&self, partition_id: &str) -> Result<Vec<AttachRecord>, FleetError> {
        Ok(self.store.attaches(partition_id)?)
    }

    /// The delete guard (see [`crate::guard`]).
    pub async fn may_delete(&self, partition_id: &str) -> Result<Decision, GuardError> {
        let attaches = self
            .store
            .attaches(partition_id)
            .map_err(|e| GuardError::Store(e.to_string()))?;
        let (mut blockers, questions) = self.with_view(|v| {
            if let Some(e) = &v.store_error {
                return Err(GuardError::Store(e.clone()));
            }
            Ok(node_side(&attaches, v))
        })?;
        self.refresh_last_errors(&mut blockers).await;
        let mut unanswered = None;
        for ((fabric, pkey), ports) in &questions {
            let hosts: Vec<_> = self.sm_hosts.iter().filter(|h| &h.0 == fabric).collect();
            if hosts.is_empty() {
                unanswered.get_or_insert(GuardError::NoSmHost(fabric.clone()));
                continue;
            }
            for (_, endpoint, ch) in hosts {
                let mut client = PartitionsClient::new(ch.clone());
                let call =
                    client.list_partition_members(ListPartitionMembersRequest { pkey: *pkey });
                match tokio::time::timeout(self.registry.follow.call_timeout(), call).await {
                    Ok(Ok(r)) => {
                        let r = r.into_inner();
                        blockers.extend(fabric_side(fabric, *pkey, ports, &r.members, &r.source));
                    }
                    Ok(Err(s)) => {
                        unanswered.get_or_insert(GuardError::Fabric {
                            fabric: fabric.clone(),
                            endpoint: endpoint.clone(),
                            message: format!("{:?}: {}", s.code(), s.message()),
                        });
                    }
                    Err(_) => {
                        unanswered.get_or_insert(GuardError::Fabric {
                            fabric: fabric.clone(),
                            endpoint: endpoint.clone(),
                            message: "no answer in time".into(),
                        });
                    }
                }
            }
        }
        if !blockers.is_empty() {
            return Ok(Decision::No(blockers));
        }
        match unanswered {
            Some(e) => Err(e),
            None => Ok(Decision::Yes),
        }
    }
}

impl Fleet {
    /// Replaces each instance blocker's last error by what its node says now (GetAttachment's
    /// `reason`), when the node still reports the blocker's state. An event carries a reason
    /// only with a state change, so a retry failing in the same state (a release the SM host
    /// does not answer) would otherwise reach the view only at the next resync, and the blocker
    /// would show the reason of the last transition instead. Reachable nodes only, concurrently,
    /// each within the call timeout; a call that fails leaves the view's reason. The decision
    /// itself rests on the view alone.
    async fn refresh_last_errors(&self, blockers: &mut [Blocker]) {
        let limit = self.registry.follow.call_timeout();
        let calls = blockers.iter().map(|b| async move {
            let Blocker::Instance {
                instance_id,
                node_id,
                state,
                unreachable_since_ms: None,
                ..
            } = b
            else {
                return None;
            };
            let mut client = self.agent(node_id).ok()?;
            let request = GetAttachmentRequest {
                instance_id: instance_id.clone(),
            };
            let a = tokio::time::timeout(limit, client.get_attachment(request))
                .await
                .ok()?
                .ok()?
                .into_inner();
            (state_name(a.state) == state).then_some(a.reason)
        });
        let reasons = futures::future::join_all(calls).await;
        for (b, reason) in blockers.iter_mut().zip(reasons) {
            if let (Blocker::Instance { last_error, .. }, Some(reason)) = (b, reason) {
                *last_error = reason;
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn node_error(node: &str, s: tonic::Status) -> FleetError {
    FleetError::Node {
        node: node.to_owned(),
        code: s.code(),
        message: s.message().to_owned(),
    }
}

fn describe(e: &Endpoint) -> String {
    match e {
        Endpoint::Unix(p) => format!("unix://{}", p.display()),
        Endpoint::Plain(u) | Endpoint::Tls { url: u, .. } => u.clone(),
    }
}

/// Group commit: every record waiting is written in one transaction, the newest per node.
async fn write_loop(
    store: Store,
    view: Arc<Mutex<View>>,
    mut rx: mpsc::UnboundedReceiver<(String, NodeDurable)>,
) {
    while let Some((node, record)) = rx.recv().await {
        let mut batch: HashMap<String, NodeDurable> = HashMap::new();
        batch.insert(node, record);
        while let Ok((node, record)) = rx.try_recv() {
            batch.insert(node, record);
        }
        let store = store.clone();
        let result = tokio::task::spawn_blocking(move || {
            store.put_nodes(batch.iter().map(|(k, v)| (k.as_str(), v)))
        })
        .await;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = &error {
            tracing::error!(error = %e, "fleet store write failed; the guard refuses to decide");
        }
        let mut v = view.lock().expect("view lock");
        if error.is_some() {
            v.store_error = error;
        }
    }
}
