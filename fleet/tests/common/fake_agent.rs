//! An in-process fake node agent serving `fabric.agent.v1` on loopback: an event log with an
//! epoch, attachments, one fabric port. Attach answers ACTIVE at once; release answers RELEASED
//! at once (a node that says RELEASED without asking the fabric: the "lying node" of the delete
//! guard's tests). Used by the fleet tests and the scale bench.

#![allow(dead_code)]

use fabric_fleet::proto::agent::fabric_agent_server::{FabricAgent, FabricAgentServer};
use fabric_fleet::proto::agent::*;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The fake's state.
pub struct FakeAgentState {
    pub node_id: String,
    pub port_guid: String,
    inner: Mutex<Inner>,
    live: broadcast::Sender<Event>,
    down: tokio::sync::watch::Sender<bool>,
}

struct Inner {
    epoch: String,
    log: Vec<Event>,
    attachments: BTreeMap<String, Attachment>,
    /// Events up to this seq are no longer retained (WatchEvents from before: OUT_OF_RANGE).
    pruned_through: u64,
    /// The subnet-manager status GetNode reports (none: an agent that reports none).
    sm: Option<SubnetManagerStatus>,
}

fn now() -> prost_types::Timestamp {
    let ms = fabric_fleet::view::now_ms();
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

impl FakeAgentState {
    /// A fake with an empty log of a fresh epoch.
    pub fn new(node_id: &str, port_guid: &str) -> Arc<FakeAgentState> {
        Arc::new(FakeAgentState {
            node_id: node_id.into(),
            port_guid: port_guid.into(),
            inner: Mutex::new(Inner {
                epoch: format!("{:032x}", rand::random::<u128>()),
                log: Vec::new(),
                attachments: BTreeMap::new(),
                pruned_through: 0,
                sm: None,
            }),
            live: broadcast::channel(1024).0,
            down: tokio::sync::watch::channel(false).0,
        })
    }

    /// Makes the node unreachable (every call and open stream fails UNAVAILABLE) or back.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    fn check_up(&self) -> Result<(), Status> {
        if *self.down.borrow() {
            return Err(Status::unavailable("fake node is down"));
        }
        Ok(())
    }

    /// The newest seq.
    pub fn head(&self) -> u64 {
        self.inner.lock().unwrap().log.len() as u64
    }

    /// The log epoch.
    pub fn epoch(&self) -> String {
        self.inner.lock().unwrap().epoch.clone()
    }

    /// Stops retaining every event logged so far (retention pruned them).
    pub fn prune_all(&self) {
        let mut i = self.inner.lock().unwrap();
        i.pruned_through = i.log.len() as u64;
    }

    /// Forgets everything and starts a new epoch (a wiped state directory).
    pub fn wipe(&self) {
        let mut i = self.inner.lock().unwrap();
        i.epoch = format!("{:032x}", rand::random::<u128>());
        i.log.clear();
        i.attachments.clear();
        i.pruned_through = 0;
    }

    /// Sets an attachment's state and appends the event, as the agent does.
    pub fn transition(&self, instance: &str, partition: &Partition, to: AttachmentState) -> Event {
        let mut i = self.inner.lock().unwrap();
        let pkey_value = partition.pkey | 0x8000;
        let a = i
            .attachments
            .entry(instance.to_owned())
            .or_insert_with(|| Attachment {
                instance_id: instance.into(),
                partition: Some(partition.clone()),
                membership: Membership::Full as i32,
                state: AttachmentState::Pending as i32,
                created: Some(now()),
                pkey_value,
                ..Default::default()
            });
        let from = a.state;
        a.state = to as i32;
        a.updated = Some(now());
        let evidence =
            matches!(to, AttachmentState::Released | AttachmentState::Active).then(|| Evidence {
                ports: vec![PortReading {
                    device: "fake_0".into(),
                    port_number: 1,
                    port_guid: self.port_guid.clone(),
                    state: PortState::Active as i32,
                }],
                ..Default::default()
            });
        self.append(
            &mut i,
            event::Kind::AttachmentChanged(AttachmentChanged {
                instance_id: instance.into(),
                partition_id: partition.id.clone(),
                pkey_value,
                from,
                to: to as i32,
                reason: String::new(),
                evidence,
                ports: Vec::new(),
            }),
        )
    }

    /// Sets the subnet-manager status GetNode reports and appends the SubnetManagerChanged
    /// event, as the agent does. `state` is the proto enum's number: 0 (UNSPECIFIED) with
    /// `reachable` is what an agent older than the state sends.
    pub fn set_sm(&self, state: i32, reachable: bool, error: &str) -> Event {
        let mut i = self.inner.lock().unwrap();
        i.sm = Some(SubnetManagerStatus {
            backend: "fake".into(),
            reachable,
            last_error: error.into(),
            state,
            ..Default::default()
        });
        self.append(
            &mut i,
            event::Kind::SubnetManagerChanged(SubnetManagerChanged {
                backend: "fake".into(),
                reachable,
                error: error.into(),
                state,
            }),
        )
    }

    /// Appends an event of `kind` to the log and sends it to the open streams.
    fn append(&self, i: &mut Inner, kind: event::Kind) -> Event {
        let ev = Event {
            seq: i.log.len() as u64 + 1,
            time: Some(now()),
            node_id: self.node_id.clone(),
            log_epoch: i.epoch.clone(),
            kind: Some(kind),
        };
        i.log.push(ev.clone());
        let _ = self.live.send(ev.clone());
        ev
    }

    /// Appends a port-state event (load for the bench).
    pub fn port_flap(&self) {
        let mut i = self.inner.lock().unwrap();
        self.append(
            &mut i,
            event::Kind::PortStateChanged(PortStateChanged {
                device: "fake_0".into(),
                port_number: 1,
                port_guid: self.port_guid.clone(),
                from: PortState::Active as i32,
                to: PortState::Active as i32,
            }),
        );
    }
}

#[derive(Clone)]
struct Fake(Arc<FakeAgentState>);

type EventStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;

#[tonic::async_trait]
impl FabricAgent for Fake {
    async fn get_node(
        &self,
        _: Request<GetNodeRequest>,
    ) -> Result<Response<GetNodeResponse>, Status> {
        self.0.check_up()?;
        let i = self.0.inner.lock().unwrap();
        Ok(Response::new(GetNodeResponse {
            node_id: self.0.node_id.clone(),
            fabric: "fab1".into(),
            ports: vec![Port {
                device: "fake_0".into(),
                port_number: 1,
                port_guid: self.0.port_guid.clone(),
                state: PortState::Active as i32,
                link_layer: LinkLayer::Infiniband as i32,
                fabric_port: true,
                ..Default::default()
            }],
            last_event_seq: i.log.len() as u64,
            first_event_seq: u64::from(!i.log.is_empty()),
            log_epoch: i.epoch.clone(),
            subnet_manager: i.sm.clone(),
            ..Default::default()
        }))
    }

    async fn attach_partition(
        &self,
        r: Request<AttachPartitionRequest>,
    ) -> Result<Response<AttachPartitionResponse>, Status> {
        let r = r.into_inner();
        if r.grant.is_none() {
            return Err(Status::invalid_argument("grant: missing"));
        }
        let partition = r
            .partition
            .ok_or_else(|| Status::invalid_argument("partition"))?;
        self.0
            .transition(&r.instance_id, &partition, AttachmentState::Active);
        let a = self.0.inner.lock().unwrap().attachments[&r.instance_id].clone();
        Ok(Response::new(AttachPartitionResponse {
            attachment: Some(a),
            created: true,
        }))
    }

    async fn get_attachment(
        &self,
        r: Request<GetAttachmentRequest>,
    ) -> Result<Response<Attachment>, Status> {
        let i = self.0.inner.lock().unwrap();
        i.attachments
            .get(&r.into_inner().instance_id)
            .cloned()
            .map(Response::new)
            .ok_or_else(|| Status::not_found("instance"))
    }

    async fn list_attachments(
        &self,
        r: Request<ListAttachmentsRequest>,
    ) -> Result<Response<ListAttachmentsResponse>, Status> {
        let r = r.into_inner();
        let size = if r.page_size == 0 {
            500
        } else {
            r.page_size as usize
        };
        let i = self.0.inner.lock().unwrap();
        let page: Vec<Attachment> = i
            .attachments
            .range::<String, _>((
                std::ops::Bound::Excluded(r.page_token.clone()),
                std::ops::Bound::Unbounded,
            ))
            .take(size + 1)
            .map(|(_, a)| a.clone())
            .collect();
        let (attachments, next) = if page.len() > size {
            let a = page[..size].to_vec();
            let next = a.last().map(|a| a.instance_id.clone()).unwrap_or_default();
            (a, next)
        } else {
            (page, String::new())
        };
        Ok(Response::new(ListAttachmentsResponse {
            attachments,
            next_page_token: next,
        }))
    }

    async fn release_instance(
        &self,
        r: Request<ReleaseInstanceRequest>,
    ) -> Result<Response<ReleaseInstanceResponse>, Status> {
        let id = r.into_inner().instance_id;
        let partition = {
            let i = self.0.inner.lock().unwrap();
            i.attachments
                .get(&id)
                .and_then(|a| a.partition.clone())
                .ok_or_else(|| Status::not_found("instance"))?
        };
        // The lie: RELEASED without any evidence from the fabric.
        self.0
            .transition(&id, &partition, AttachmentState::Released);
        let a = self.0.inner.lock().unwrap().attachments[&id].clone();
        Ok(Response::new(ReleaseInstanceResponse {
            attachment: Some(a),
        }))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        r: Request<WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.0.check_up()?;
        let r = r.into_inner();
        let mut down = self.0.down.subscribe();
        let (replay, mut rx) = {
            let i = self.0.inner.lock().unwrap();
            if r.log_epoch.as_ref().is_some_and(|e| *e != i.epoch) {
                return Err(Status::out_of_range(format!(
                    "log epoch is {}, last seq {}",
                    i.epoch,
                    i.log.len()
                )));
            }
            if r.after_seq < i.pruned_through {
                return Err(Status::out_of_range(format!(
                    "after_seq {} was pruned; oldest retained is {}",
                    r.after_seq,
                    i.pruned_through + 1
                )));
            }
            if r.after_seq > i.log.len() as u64 {
                return Err(Status::out_of_range("after_seq is newer than the log"));
            }
            (
                i.log[r.after_seq as usize..].to_vec(),
                self.0.live.subscribe(),
            )
        };
        let mut last = replay.last().map_or(r.after_seq, |e| e.seq);
        let stream = async_stream(replay, move |tx| async move {
            loop {
                let got = tokio::select! {
                    got = rx.recv() => got,
                    _ = async { let _ = down.wait_for(|d| *d).await; } => {
                        let _ = tx.send(Err(Status::unavailable("fake node is down"))).await;
                        return;
                    }
                };
                match got {
                    Ok(ev) if ev.seq > last => {
                        last = ev.seq;
                        if tx.send(Ok(ev)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx
                            .send(Err(Status::resource_exhausted("slow consumer")))
                            .await;
                        return;
                    }
                    Err(_) => return,
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// A stream of `replay` followed by what `live` sends.
fn async_stream<F, Fut>(replay: Vec<Event>, live: F) -> EventStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Event, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let fut = live(tx.clone());
    tokio::spawn(async move {
        for ev in replay {
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
        }
        fut.await;
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Serves the fake on 127.0.0.1 (a free port) until `stop` resolves; returns its URL.
pub async fn serve(
    state: Arc<FakeAgentState>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(FabricAgentServer::new(Fake(state)))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop,
            ),
    );
    url
}
