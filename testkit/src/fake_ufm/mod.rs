//! A fake NVIDIA UFM REST server on 127.0.0.1, inside the test process.
//!
//! It models the partition endpoints (`/ufmRest`, `/ufmRestV2` and `/ufmRestV3` prefixes):
//! `GET resources/pkeys[/{pkey}]?guids_data=true`, `GET resources/pkeys/last_updated` (one
//! stamp moved by every accepted change, operator changes through this handle included),
//! `POST resources/pkeys`,
//! `POST actions/remove_guids_from_pkey`, `DELETE resources/pkeys/{pkey}/guids/{g1,g2}`,
//! `DELETE resources/pkeys/{pkey}`, `GET resources/ports` (the port inventory a test sets) and
//! `GET app/ufm_version`; checks basic or token
//! authentication; switches UFM's quirks ([`Quirks`]); injects slowness, 503 bursts,
//! outages (503 or connection refused) and writes whose answer comes too late to be seen
//! although they took effect; logs every request; and reports membership changes
//! (broadcast and callback, with a configurable delay) so tests can drive port tables.
//!
//! Used by the integration tests and benches as `testkit::fake_ufm`.

pub mod model;

pub use model::{FakeMember, FakePartition, FakePort, Quirks};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use fabric_agent::domain::Membership;
use fabric_agent::sm::ufm::UfmConfig;
use model::{Model, Reply};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, oneshot};

/// One request as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedRequest {
    /// `GET`, `POST`, `DELETE`…
    pub method: String,
    /// Path and query, e.g. `/ufmRest/resources/pkeys/0x0a12?guids_data=true`.
    pub path: String,
    /// The JSON body, if any.
    pub body: Option<Value>,
    /// The status the fake answered.
    pub status: u16,
    /// When it arrived.
    pub at: Instant,
}

/// A partition's membership after a change, and the full key list of every GUID it touched
/// (what a port's P_Key table should now hold besides the default partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipChange {
    /// The 15-bit key that changed.
    pub pkey: u16,
    /// Its members after the change (empty when the partition is gone).
    pub members: BTreeMap<u64, Membership>,
    /// For each GUID added or removed: every key it holds now.
    pub guid_keys: BTreeMap<u64, Vec<(u16, Membership)>>,
}

/// Who may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeAuth {
    /// Anyone.
    Open,
    /// `Authorization: Basic base64(user:password)`.
    Basic {
        /// User.
        user: String,
        /// Password.
        password: String,
    },
    /// `Authorization: <scheme> <token>`, scheme `Basic` or `Bearer`.
    Token {
        /// `Basic` or `Bearer`.
        scheme: String,
        /// Token.
        token: String,
    },
}

type ChangeCallback = Arc<dyn Fn(&MembershipChange) + Send + Sync>;

struct Inner {
    model: Model,
    auth: FakeAuth,
    delay: Duration,
    /// The next `.0` requests answer status `.1`.
    inject: (usize, u16),
    /// The next `.0` writes (POST, DELETE) take effect, then answer only after `.1`.
    late_writes: (usize, Duration),
    /// The next `.0` adds (POST …/resources/pkeys) answer 503 at once and take effect `.1`
    /// later: UFM executing a request after the client gave up on it.
    executed_late: (usize, Duration),
    outage_until: Option<Instant>,
    /// Injected answers quote the request's `Authorization` header (a careless server).
    echo_auth: bool,
    log: Vec<LoggedRequest>,
    change_delay: Duration,
    callback: Option<ChangeCallback>,
}

struct Shared {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<MembershipChange>,
}

/// Accepts TCP connections and completes a TLS handshake (client certificates are checked by
/// the `ServerConfig`); failed handshakes are dropped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// The fake server. Stops when dropped.
pub struct FakeUfm {
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    running: Arc<Mutex<Option<Running>>>,
}

impl FakeUfm {
    /// Starts a fake on an ephemeral loopback port, accepting basic `admin:123456`.
    pub async fn start() -> FakeUfm {
        Self::start_with(FakeAuth::Basic {
            user: "admin".into(),
            password: "123456".into(),
        })
        .await
    }

    /// Starts a fake with the given authentication.
    pub async fn start_with(auth: FakeAuth) -> FakeUfm {
        Self::start_inner(auth, None).await
    }

    /// Starts a fake speaking HTTPS with `tls` (which may require client certificates).
    pub async fn start_tls(auth: FakeAuth, tls: Arc<rustls::ServerConfig>) -> FakeUfm {
        Self::start_inner(auth, Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn start_inner(auth: FakeAuth, tls: Option<tokio_rustls::TlsAcceptor>) -> FakeUfm {
        let (changes, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                model: Model::default(),
                auth,
                delay: Duration::ZERO,
                inject: (0, 503),
                late_writes: (0, Duration::ZERO),
                executed_late: (0, Duration::ZERO),
                outage_until: None,
                echo_auth: false,
                log: Vec::new(),
                change_delay: Duration::ZERO,
                callback: None,
            }),
            changes,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let running = Arc::new(Mutex::new(Some(serve(
            listener,
            tls.clone(),
            shared.clone(),
        ))));
        FakeUfm {
            addr,
            tls,
            shared,
            running,
        }
    }

    /// `http://127.0.0.1:<port>` (`https` when started with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// A backend configuration for tests against this fake: basic credentials from `cred`,
    /// short timeouts and retry delays, `retries` extra attempts, and no `last_updated` stamp
    /// read (so each apply's reads are exactly the partition reads).
    pub fn test_config(&self, cred: std::path::PathBuf, retries: u32) -> UfmConfig {
        let mut c = UfmConfig::with_credentials_file(self.url(), cred);
        c.connect_timeout_ms = 300;
        c.request_timeout_ms = 1_000;
        c.retries = retries;
        c.backoff_initial_ms = 2;
        c.backoff_max_ms = 10;
        c.max_skipped_rechecks = 0;
        c
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.shared.inner.lock().expect("fake UFM lock"))
    }

    /// Changes who may call.
    pub fn set_auth(&self, auth: FakeAuth) {
        self.with(|i| i.auth = auth);
    }

    /// Switches quirks.
    pub fn set_quirks(&self, quirks: Quirks) {
        self.with(|i| i.model.quirks = quirks);
    }

    /// Delays every answer.
    pub fn set_delay(&self, delay: Duration) {
        self.with(|i| i.delay = delay);
    }

    /// The next `n` requests answer 503.
    pub fn fail_next(&self, n: usize) {
        self.inject_status(n, 503);
    }

    /// The next `n` requests answer `status` (with a JSON error body), whatever they ask.
    pub fn inject_status(&self, n: usize, status: u16) {
        self.with(|i| i.inject = (n, status));
    }

    /// The next `n` writes (POST, DELETE) take effect at once but are answered only after
    /// `delay`: with `delay` beyond the client's timeout, a change whose answer was lost.
    pub fn answer_writes_late(&self, n: usize, delay: Duration) {
        self.with(|i| i.late_writes = (n, delay));
    }

    /// The next `n` adds (`POST …/resources/pkeys`) are answered 503 at once and executed
    /// `delay` later: a write UFM carries out after the client gave up on it.
    pub fn execute_adds_late(&self, n: usize, delay: Duration) {
        self.with(|i| i.executed_late = (n, delay));
    }

    /// Makes injected answers quote the request's `Authorization` header, like a careless
    /// server would, to check that clients do not pass it on.
    pub fn set_echo_auth(&self, echo: bool) {
        self.with(|i| i.echo_auth = echo);
    }

    /// Every request answers 503 for `duration`.
    pub fn outage_503(&self, duration: Duration) {
        self.with(|i| i.outage_until = Some(Instant::now() + duration));
    }

    /// Stops listening (connections are refused) for `duration`, then listens again on the
    /// same port. Returns once the listener is closed.
    pub async fn outage_refused(&self, duration: Duration) {
        let old = self.running.lock().expect("lock").take();
        if let Some(old) = old {
            let _ = old.stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(2), old.task).await;
        }
        let (addr, shared, running) = (self.addr, self.shared.clone(), self.running.clone());
        let tls = self.tls.clone();
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .expect("re-bind the fake UFM port");
            *running.lock().expect("lock") = Some(serve(listener, tls, shared));
        });
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.with(|i| i.log.clone())
    }

    /// How many requests so far.
    pub fn request_count(&self) -> usize {
        self.with(|i| i.log.len())
    }

    /// Replaces the port inventory `GET …/resources/ports` answers.
    pub fn set_ports(&self, ports: Vec<FakePort>) {
        self.with(|i| i.model.ports = ports);
    }

    /// Requests that changed partitions (every method but GET).
    pub fn writes(&self) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.with(|i| i.log.clear());
    }

    /// A partition's current state.
    pub fn partition(&self, pkey: u16) -> Option<FakePartition> {
        self.with(|i| i.model.partitions.get(&pkey).cloned())
    }

    /// Members of a partition (empty when absent).
    pub fn members(&self, pkey: u16) -> BTreeMap<u64, Membership> {
        self.partition(pkey)
            .map(|p| p.members.iter().map(|(g, m)| (*g, m.membership)).collect())
            .unwrap_or_default()
    }

    /// Every key (with membership) a GUID holds.
    pub fn keys_of(&self, guid: u64) -> Vec<(u16, Membership)> {
        self.with(|i| i.model.keys_of(guid))
    }

    /// The current `last_updated` stamp (microseconds; 0 before any change).
    pub fn last_updated_us(&self) -> u64 {
        self.with(|i| i.model.last_updated_us)
    }

    /// Every partition key.
    pub fn pkeys(&self) -> Vec<u16> {
        self.with(|i| i.model.partitions.keys().copied().collect())
    }

    /// Seeds or replaces a partition, as an operator would (moves `last_updated`; not
    /// reported as a change).
    pub fn insert_partition(&self, pkey: u16, partition: FakePartition) {
        self.with(|i| {
            i.model.partitions.insert(pkey, partition);
            i.model.touch();
        });
    }

    /// Drops a partition as an operator (or UFM itself) would (reported as a change; moves
    /// `last_updated`).
    pub fn drop_partition(&self, pkey: u16) {
        let before = self.members(pkey);
        self.with(|i| {
            i.model.partitions.remove(&pkey);
            i.model.touch();
        });
        report(&self.shared, pkey, before.keys().copied().collect());
    }

    /// Receives every membership change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<MembershipChange> {
        self.shared.changes.subscribe()
    }

    /// Calls `callback` for every membership change, `delay` after it happened (like an SM
    /// that programs ports a little after accepting a request).
    pub fn on_change(
        &self,
        delay: Duration,
        callback: impl Fn(&MembershipChange) + Send + Sync + 'static,
    ) {
        self.with(|i| {
            i.change_delay = delay;
            i.callback = Some(Arc::new(callback));
        });
    }
}

impl Drop for FakeUfm {
    fn drop(&mut self) {
        if let Ok(mut running) = self.running.lock() {
            if let Some(r) = running.take() {
                let _ = r.stop.send(());
                r.task.abort();
            }
        }
    }
}

fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let app = Router::new().fallback(handle).with_state(shared);
    let stopped = async {
        let _ = stopped.await;
    };
    let task = match tls {
        None => tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await;
        }),
        Some(acceptor) => tokio::spawn(async move {
            let listener = TlsListener {
                tcp: listener,
                acceptor,
            };
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await;
        }),
    };
    Running { stop, task }
}

/// Standard base64 (for checking basic authentication).
fn base64(input: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(input)
}

fn authorised(auth: &FakeAuth, headers: &HeaderMap) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth {
        FakeAuth::Open => true,
        FakeAuth::Basic { user, password } => {
            given
                == Some(
                    format!("Basic {}", base64(format!("{user}:{password}").as_bytes())).as_str(),
                )
        }
        FakeAuth::Token { scheme, token } => given == Some(format!("{scheme} {token}").as_str()),
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let add = method == Method::POST && uri.path().ends_with("/resources/pkeys");
    let late_add = {
        let mut i = shared.inner.lock().expect("fake UFM lock");
        (add && i.executed_late.0 > 0 && authorised(&i.auth, &headers)).then(|| {
            i.executed_late.0 -= 1;
            i.executed_late.1
        })
    };
    if let Some(late) = late_add {
        let shared = shared.clone();
        let (method, uri, body) = (method.clone(), uri.clone(), body.clone());
        tokio::spawn(async move {
            tokio::time::sleep(late).await;
            let json: Option<Value> = serde_json::from_slice(&body).ok();
            let changed = {
                let mut i = shared.inner.lock().expect("fake UFM lock");
                route(&mut i.model, &method, &uri, json.as_ref()).1
            };
            if let Some(pkey) = changed {
                report(&shared, pkey, touched_guids(&uri, json.as_ref()));
            }
        });
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"error": "busy (the request will still be executed)"}).to_string(),
        )
            .into_response();
    }
    let (delay, injected) = {
        let mut i = shared.inner.lock().expect("fake UFM lock");
        let down = i.outage_until.is_some_and(|t| Instant::now() < t);
        let injected = if down {
            Some(503)
        } else if i.inject.0 > 0 {
            i.inject.0 -= 1;
            Some(i.inject.1)
        } else {
            None
        };
        (i.delay, injected)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok().or(Some(Value::String(
            String::from_utf8_lossy(&body).into_owned(),
        )))
    };
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let (reply, changed, late) = {
        let mut i = shared.inner.lock().expect("fake UFM lock");
        let result = if let Some(status) = injected {
            let mut body = json!({"error": format!("injected {status}")});
            if i.echo_auth {
                body["authorization"] = json!(headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or(""));
            }
            ((status, body), None)
        } else if !authorised(&i.auth, &headers) {
            ((401, json!({"error": "Unauthorized"})), None)
        } else {
            route(&mut i.model, &method, &uri, json_body.as_ref())
        };
        i.log.push(LoggedRequest {
            method: method.to_string(),
            path,
            body: json_body.clone(),
            status: result.0 .0,
            at: Instant::now(),
        });
        let touched: Vec<u64> = match (&result.1, json_body.as_ref()) {
            (Some(_), _) => touched_guids(&uri, json_body.as_ref()),
            _ => Vec::new(),
        };
        let write = method == Method::POST || method == Method::DELETE;
        let late = if write && injected.is_none() && i.late_writes.0 > 0 {
            i.late_writes.0 -= 1;
            Some(i.late_writes.1)
        } else {
            None
        };
        (result.0, result.1.map(|k| (k, touched)), late)
    };
    if let Some((pkey, guids)) = changed {
        report(&shared, pkey, guids);
    }
    if let Some(late) = late {
        tokio::time::sleep(late).await;
    }
    let (status, value) = reply;
    (
        StatusCode::from_u16(status).expect("valid status"),
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// GUIDs named by a mutating request (body list or DELETE path).
fn touched_guids(uri: &Uri, body: Option<&Value>) -> Vec<u64> {
    let parse = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    if let Some(list) = body.and_then(|b| b.get("guids")).and_then(Value::as_array) {
        return list
            .iter()
            .filter_map(|g| g.as_str().and_then(parse))
            .collect();
    }
    match uri.path().rsplit_once("/guids/") {
        Some((_, list)) => list.split(',').filter_map(parse).collect(),
        None => Vec::new(),
    }
}

fn report(shared: &Arc<Shared>, pkey: u16, guids: Vec<u64>) {
    let (change, delay, callback) = {
        let i = shared.inner.lock().expect("fake UFM lock");
        let members = i
            .model
            .partitions
            .get(&pkey)
            .map(|p| p.members.iter().map(|(g, m)| (*g, m.membership)).collect())
            .unwrap_or_default();
        let guid_keys = guids.iter().map(|g| (*g, i.model.keys_of(*g))).collect();
        (
            MembershipChange {
                pkey,
                members,
                guid_keys,
            },
            i.change_delay,
            i.callback.clone(),
        )
    };
    let sender = shared.changes.clone();
    let deliver = move || {
        if let Some(cb) = &callback {
            cb(&change);
        }
        let _ = sender.send(change);
    };
    if delay.is_zero() {
        deliver();
    } else {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            deliver();
        });
    }
}

fn route(
    model: &mut Model,
    method: &Method,
    uri: &Uri,
    body: Option<&Value>,
) -> (Reply, Option<u16>) {
    let path = uri.path();
    let guids_data = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "guids_data=true"));
    let rest = ["/ufmRestV2/", "/ufmRestV3/", "/ufmRest/"]
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix));
    let Some(rest) = rest else {
        return ((404, json!({"error": "Not Found"})), None);
    };
    let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["app", "ufm_version"]) => {
            ((200, json!({"ufm_release_version": "6.19.0-fake"})), None)
        }
        ("GET", ["resources", "pkeys"]) => (model.list(guids_data), None),
        ("GET", ["resources", "ports"]) => (
            (
                200,
                Value::Array(model.ports.iter().map(FakePort::json).collect()),
            ),
            None,
        ),
        ("GET", ["resources", "pkeys", "last_updated"]) => (model.last_updated(), None),
        ("GET", ["resources", "pkeys", pkey]) => (model.get(pkey, guids_data), None),
        ("POST", ["resources", "pkeys"]) => model.add(body),
        ("POST", ["actions", "remove_guids_from_pkey"]) => model.remove_action(body),
        ("DELETE", ["resources", "pkeys", pkey, "guids", guids]) => {
            model.remove_resource(pkey, guids)
        }
        ("DELETE", ["resources", "pkeys", pkey]) => model.delete(pkey),
        (_, ["resources", "pkeys", ..]) | (_, ["actions", ..]) => {
            ((405, json!({"error": "Method Not Allowed"})), None)
        }
        _ => ((404, json!({"error": "Not Found"})), None),
    }
}
