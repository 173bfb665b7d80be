//! One node's resumable follower: GetNode, a full resync when the cursor is empty, of another
//! epoch, or refused (OUT_OF_RANGE), then WatchEvents from the cursor; every event is applied to
//! the view only when it is the cursor's next one, and the node's record (cursor included) goes
//! to the store writer. Connects and resyncs wait for a permit of the fleet-wide semaphore;
//! failures back off with jitter. A reconnect resumes from the cursor, so no event is skipped.

use crate::backoff::Backoff;
use crate::proto::agent::fabric_agent_client::FabricAgentClient;
use crate::proto::agent::{Event, GetNodeRequest, ListAttachmentsRequest, WatchEventsRequest};
use crate::registry::FollowConfig;
use crate::sm_state::SmState;
use crate::view::{now_ms, NodeDurable, View};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch, Semaphore};
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// What every follower shares.
pub(crate) struct Shared {
    pub view: Arc<Mutex<View>>,
    pub writes: mpsc::UnboundedSender<(String, NodeDurable)>,
    pub events: broadcast::Sender<(String, Event)>,
    pub permits: Arc<Semaphore>,
    pub config: FollowConfig,
}

/// Why one round of following ended.
#[derive(Debug)]
enum End {
    /// The cursor cannot be used: resynchronise at once.
    Resync(String),
    /// The node failed or went away: back off, then reconnect from the cursor.
    Failed(String),
    /// Shutdown was requested.
    Stop,
}

fn status_text(s: &Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// Follows one node until `stop` turns true.
pub(crate) async fn run(
    node_id: String,
    channel: Channel,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = FabricAgentClient::new(channel).max_decoding_message_size(64 << 20);
    let c = &shared.config;
    let mut backoff = Backoff::new(
        Duration::from_millis(c.backoff_initial_ms),
        Duration::from_millis(c.backoff_max_ms),
    );
    let mut force_resync = false;
    loop {
        if *stop.borrow() {
            return;
        }
        let end = tokio::select! {
            end = round(&node_id, &mut client, &shared, &mut force_resync, &mut backoff) => end,
            _ = stop.changed() => End::Stop,
        };
        match end {
            End::Stop => return,
            End::Resync(why) => {
                tracing::info!(node = %node_id, %why, "resynchronising");
                // A node that keeps refusing the fresh cursor must not be hammered.
                if force_resync && sleep_or_stop(backoff.next_delay(), &mut stop).await {
                    return;
                }
                force_resync = true;
            }
            End::Failed(why) => {
                tracing::debug!(node = %node_id, %why, "node unreachable");
                {
                    let mut view = shared.view.lock().expect("view lock");
                    let live = &mut view.nodes.entry(node_id.clone()).or_default().live;
                    live.reachable = false;
                    live.settled = true;
                    live.unreachable_since_ms.get_or_insert_with(now_ms);
                    live.last_error = why;
                }
                if sleep_or_stop(backoff.next_delay(), &mut stop).await {
                    return;
                }
            }
        }
    }
}

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// One connection: sync, open the stream, consume it until it ends. A forced resync is done
/// once: the flag is cleared when the stream opened from the fresh cursor.
async fn round(
    node_id: &str,
    client: &mut FabricAgentClient<Channel>,
    shared: &Shared,
    force_resync: &mut bool,
    backoff: &mut Backoff,
) -> End {
    let stream = {
        let _permit = shared.permits.acquire().await.expect("semaphore open");
        match open(node_id, client, shared, *force_resync).await {
            Ok(s) => s,
            Err(end) => return end,
        }
    };
    *force_resync = false;
    backoff.reset();
    consume(node_id, stream, shared).await
}

async fn open(
    node_id: &str,
    client: &mut FabricAgentClient<Channel>,
    shared: &Shared,
    force_resync: bool,
) -> Result<Streaming<Event>, End> {
    let timeout = shared.config.call_timeout();
    let node = call(timeout, client.get_node(GetNodeRequest {})).await?;
    if node.node_id != node_id {
        return Err(End::Failed(format!(
            "the endpoint answers as node {:?}, not {node_id:?}: not followed",
            node.node_id
        )));
    }
    let mut durable = {
        let mut view = shared.view.lock().expect("view lock");
        let entry = view.nodes.entry(node_id.to_owned()).or_default();
        entry.durable.fabric.clone_from(&node.fabric);
        for p in node.ports.iter().filter(|p| p.fabric_port) {
            entry.durable.ports.insert(p.port_guid.to_ascii_lowercase());
        }
        let live = &mut entry.live;
        live.head_seq = node.last_event_seq;
        live.conditions = node
            .conditions
            .iter()
            .map(|c| (c.kind.clone(), c.detail.clone()))
            .collect();
        let sm = node.subnet_manager.clone().unwrap_or_default();
        live.sm_reachable = sm.reachable;
        live.sm_state = SmState::from_report(sm.state, sm.reachable);
        live.sm_error = sm.last_error;
        entry.durable.clone()
    };
    if force_resync || durable.epoch.is_empty() || durable.epoch != node.log_epoch {
        let mut listed = Vec::new();
        let mut token = String::new();
        loop {
            let page = call(
                timeout,
                client.list_attachments(ListAttachmentsRequest {
                    page_size: shared.config.page_size,
                    page_token: token.clone(),
                    ..Default::default()
                }),
            )
            .await?;
            listed.extend(page.attachments);
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        let mut view = shared.view.lock().expect("view lock");
        let entry = view.nodes.entry(node_id.to_owned()).or_default();
        entry
            .durable
            .replace(&node.log_epoch, node.last_event_seq, &listed);
        entry.live.resyncs += 1;
        durable = entry.durable.clone();
        let _ = shared.writes.send((node_id.to_owned(), durable.clone()));
    }
    let request = WatchEventsRequest {
        after_seq: durable.seq,
        no_follow: false,
        log_epoch: Some(durable.epoch.clone()),
    };
    let stream = call(timeout, client.watch_events(request)).await?;
    let mut view = shared.view.lock().expect("view lock");
    let entry = view.nodes.entry(node_id.to_owned()).or_default();
    entry.live.reachable = true;
    entry.live.settled = true;
    entry.live.unreachable_since_ms = None;
    entry.live.last_error.clear();
    entry.live.caught_up = entry.durable.seq >= entry.live.head_seq;
    Ok(stream)
}

async fn call<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, End> {
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Err(End::Failed(format!("no answer within {timeout:?}"))),
        Ok(Err(s)) if s.code() == Code::OutOfRange => Err(End::Resync(status_text(&s))),
        Ok(Err(s)) => Err(End::Failed(status_text(&s))),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

async fn consume(node_id: &str, mut stream: Streaming<Event>, shared: &Shared) -> End {
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return End::Failed("the node closed the event stream".into()),
            Err(s) if s.code() == Code::OutOfRange => return End::Resync(status_text(&s)),
            Err(s) => return End::Failed(status_text(&s)),
        };
        // Apply whatever else already arrived in the same go: one store write per batch.
        let mut batch = vec![ev];
        while batch.len() < 1024 {
            match futures::FutureExt::now_or_never(stream.message()) {
                Some(Ok(Some(ev))) => batch.push(ev),
                Some(Ok(None)) | None => break,
                Some(Err(s)) if s.code() == Code::OutOfRange => {
                    return End::Resync(status_text(&s))
                }
                Some(Err(_)) => break,
            }
        }
        let (record, applied, resync) = {
            let mut view = shared.view.lock().expect("view lock");
            let entry = view.nodes.entry(node_id.to_owned()).or_default();
            let mut resync = None;
            let mut applied = 0usize;
            for ev in &batch {
                if let Err(why) = entry.durable.apply(ev) {
                    resync = Some(why.0);
                    break;
                }
                entry.note_live(ev);
                applied += 1;
            }
            entry.live.caught_up |= entry.durable.seq >= entry.live.head_seq;
            let record = entry.durable.clone();
            view.events_total += applied as u64;
            (record, applied, resync)
        };
        let _ = shared.writes.send((node_id.to_owned(), record));
        for ev in batch.into_iter().take(applied) {
            let _ = shared.events.send((node_id.to_owned(), ev));
        }
        if let Some(why) = resync {
            return End::Resync(why);
        }
    }
}
