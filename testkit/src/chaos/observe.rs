//! The checker's two independent sources, recording into the campaign's history: the nodes'
//! event streams as the control plane follows them ([`watch_node`]: reconnects after every
//! restart from its last seq and epoch, and starts over from what the node retains when told
//! its cursor no longer holds), and the ports' P_Key tables read with `smpquery`
//! ([`PortReader`], one query at a time, round-robin, on a thread of its own).

use super::history::{
    now_ms, record, tenant_bases, Change, Entry, PortRead, SeenEvent, SharedHistory,
};
use fabric_agent::api::client::ClientTls;
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::StreamExt;

/// The control plane's view of each instance's last reported state, from the event streams:
/// instance -> (state, when received).
pub type StateView = Arc<Mutex<HashMap<String, (i32, u64)>>>;

fn millis(seconds: i64, nanos: i32) -> u64 {
    seconds.max(0) as u64 * 1000 + nanos.max(0) as u64 / 1_000_000
}

/// Per node: how many times its watcher resynchronised (the driver sends again what it wants of
/// that node after each: the node's store may have gone back).
pub type Resyncs = Arc<Mutex<HashMap<String, u64>>>;

/// How the control plane reaches an agent's API.
#[derive(Debug, Clone)]
pub enum AgentApi {
    /// Its unix socket (the plaintext campaign).
    Unix(PathBuf),
    /// TCP at `url`: mTLS with `tls` (the control plane's certificate, the CA and name the
    /// agent's certificate is verified by) when the URL is https.
    Tcp {
        /// `https://127.0.0.1:PORT` (or `http://` to a plaintext test listener).
        url: String,
        /// The client's TLS material.
        tls: ClientTls,
    },
}

impl AgentApi {
    /// A channel to the agent, or `None` while it does not answer within 2 s.
    pub async fn channel(&self) -> Option<tonic::transport::Channel> {
        let connect = async {
            match self {
                AgentApi::Unix(socket) => fabric_agent::api::client::unix(socket).await,
                AgentApi::Tcp { url, tls } => fabric_agent::api::client::tcp(url, tls).await,
            }
        };
        tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .ok()?
            .ok()
    }
}

/// The standing conditions `GetNode` at `api` reports, as (kind, detail); `Err` when it does
/// not answer.
pub async fn conditions(api: &AgentApi) -> Result<Vec<(String, String)>, String> {
    let mut c = connect(api).await.ok_or("not connected")?;
    let node = tokio::time::timeout(Duration::from_secs(10), c.get_node(pb::GetNodeRequest {}))
        .await
        .map_err(|_| "GetNode: deadline".to_owned())?
        .map_err(|s| format!("GetNode: {:?}: {}", s.code(), s.message()))?;
    Ok(node
        .into_inner()
        .conditions
        .into_iter()
        .map(|c| (c.kind, c.detail))
        .collect())
}

/// A connected client of the agent at `api`, or `None` while it does not answer.
pub async fn connect(api: &AgentApi) -> Option<FabricAgentClient<tonic::transport::Channel>> {
    Some(FabricAgentClient::new(api.channel().await?))
}

/// Follows `node`'s events at `api` until `stop`, recording each into `history` and its
/// attachment changes into `view`.
pub async fn watch_node(
    node: String,
    api: AgentApi,
    history: SharedHistory,
    view: StateView,
    resyncs: Resyncs,
    stop: Arc<AtomicBool>,
) {
    let mut after = 0u64;
    let mut epoch: Option<String> = None;
    while !stop.load(Ordering::SeqCst) {
        let Some(mut c) = connect(&api).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let request = pb::WatchEventsRequest {
            after_seq: after,
            no_follow: false,
            log_epoch: epoch.clone(),
        };
        let mut stream = match c.watch_events(request).await {
            Ok(s) => s.into_inner(),
            Err(s) if s.code() == tonic::Code::OutOfRange => {
                // The cursor no longer holds: start over from what the node retains.
                record(
                    &history,
                    Entry::Resync {
                        node: node.clone(),
                        at: now_ms(),
                        why: s.message().to_owned(),
                    },
                );
                // As the API says: GetNode, ListAttachments, then watch from the newest seq of
                // the node's epoch.
                let Ok(n) = c.get_node(pb::GetNodeRequest {}).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let Ok(list) = c
                    .list_attachments(pb::ListAttachmentsRequest::default())
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let n = n.into_inner();
                resync_view(
                    &view,
                    &list.into_inner().attachments,
                    known_here(&history, &node),
                );
                epoch = Some(n.log_epoch);
                after = n.last_event_seq;
                *resyncs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(node.clone())
                    .or_default() += 1;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if stop.load(Ordering::SeqCst) { return; }
                    continue;
                }
            };
            let Some(Ok(e)) = next else { break };
            let change = match &e.kind {
                Some(pb::event::Kind::AttachmentChanged(a)) => Some(Change {
                    instance: a.instance_id.clone(),
                    pkey: (a.pkey_value & 0x7fff) as u16,
                    to: a.to,
                    reason: a.reason.clone(),
                }),
                _ => None,
            };
            if let Some(c) = &change {
                view.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(c.instance.clone(), (c.to, now_ms()));
            }
            after = e.seq;
            epoch = Some(e.log_epoch.clone());
            record(
                &history,
                Entry::Event(SeenEvent {
                    node: node.clone(),
                    epoch: e.log_epoch.clone(),
                    seq: e.seq,
                    at: e
                        .time
                        .as_ref()
                        .map(|t| millis(t.seconds, t.nanos))
                        .unwrap_or_default(),
                    digest: format!("{:?}@{:?}", e.kind, e.time),
                    change,
                }),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The instances `node`'s stream ever named.
fn known_here(history: &SharedHistory, node: &str) -> Vec<String> {
    let h = history.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<String> = h
        .events()
        .filter(|e| e.node == node)
        .filter_map(|e| e.change.as_ref().map(|c| c.instance.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// After a resync: the node's instances take the states its list gives; one it no longer lists
/// keeps RELEASED if that was its last state (nothing to hold) and is forgotten otherwise.
fn resync_view(view: &StateView, listed: &[pb::Attachment], known: Vec<String>) {
    let mut v = view.lock().unwrap_or_else(|p| p.into_inner());
    for i in known {
        if v.get(&i)
            .is_some_and(|(s, _)| *s != super::checker::RELEASED)
        {
            v.remove(&i);
        }
    }
    for a in listed {
        v.insert(a.instance_id.clone(), (a.state, now_ms()));
    }
}

/// `node`'s port 1 LinkState (`smpquery -D portinfo 0 1`, e.g. "Active", "Down", "Init");
/// `None` when the query failed.
pub fn link_state(sock: &str, dir: &Path, node: &str) -> Option<String> {
    use std::os::unix::process::CommandExt;
    let tool = ["/usr/sbin/smpquery", "/usr/bin/smpquery"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("smpquery");
    let out = std::process::Command::new(tool)
        .args(["-D", "portinfo", "0", "1"])
        .env("LD_PRELOAD", crate::rig::UMAD2SIM)
        .env("SIM_HOST", node)
        .env("IBSIM_SOCKNAME", sock)
        .current_dir(dir)
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key == "LinkState").then(|| value.trim_start_matches('.').trim().to_owned())
    })
}

/// Reads every node's port 1 P_Key table with `smpquery`, one query at a time, round-robin,
/// until stopped.
pub struct PortReader {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PortReader {
    /// Starts reading `nodes` on the fabric with ibsim socket `sock` and rig dir `dir`, pausing
    /// `pace` between queries.
    pub fn start(
        sock: &str,
        dir: &Path,
        nodes: Vec<String>,
        pace: Duration,
        history: SharedHistory,
    ) -> PortReader {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let (st, r, f) = (stop.clone(), reads.clone(), failed.clone());
        let (sock, dir) = (sock.to_owned(), dir.to_owned());
        let thread = std::thread::spawn(move || {
            let mut i = 0usize;
            while !st.load(Ordering::SeqCst) {
                let node = &nodes[i % nodes.len()];
                i += 1;
                let started = now_ms();
                match crate::rig::ha::pkeys_of(&sock, &dir, node) {
                    Some(keys) => {
                        r.fetch_add(1, Ordering::SeqCst);
                        let ended = now_ms();
                        let bases = tenant_bases(&keys);
                        let link = if bases.is_empty() {
                            None
                        } else {
                            link_state(&sock, &dir, node)
                        };
                        record(
                            &history,
                            Entry::Read(PortRead {
                                node: node.clone(),
                                started,
                                ended,
                                bases,
                                link,
                            }),
                        );
                    }
                    None => {
                        f.fetch_add(1, Ordering::SeqCst);
                    }
                }
                std::thread::sleep(pace);
            }
        });
        PortReader {
            stop,
            reads,
            failed,
            thread: Some(thread),
        }
    }

    /// (reads recorded, queries that failed) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.reads.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
        )
    }

    /// Stops reading and waits for the thread.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PortReader {
    fn drop(&mut self) {
        self.stop();
    }
}
