//! The real UFM backend in the simulation: the node's applies go through the real [`UfmSm`]
//! (its ledger written ahead, its late-write watch, its read-back rule, its retries), which
//! reaches a *model UFM* through the backend's [`UfmLink`] seam on the simulation's clock.
//!
//! The model UFM answers the documented endpoints with the rules of the fake UFM
//! (`testkit/src/fake_ufm/model.rs`: partitions with GUID memberships, the stamp, the removal forms,
//! some versions' quirks drawn per seed). Every attempt is a request on a network, executed in
//! a task of its own after a delay: with faults on it is refused without effect, answered 503
//! without effect, executed and answered 503, executed with its answer lost, executed after
//! seconds, or executed long after the client's request timeout gave up on it (up to
//! [`LATE_MAX`]). UFM has no fencing: whatever it executes, it takes. Partition changes that
//! touch the node's GUIDs are programmed onto the model ports like the model SM's sets (each
//! port after its own delay).
//!
//! The oracle's "may still be programmed" grows by every add UFM may still execute: a key is
//! not RELEASED while an add carrying it to a covered port is on its way (`Fabric::ufm_adds`).
//!
//! The backend's ledger lives in the node's store, as in the daemon ([`StoredUfmLedger`]): a
//! rollback of the store rolls the ledger back, and the agent started on the restored store
//! builds its backend with [`UfmSm::after_restore`], like the daemon.

use crate::fake_ufm::model as rules;

use super::core::keys::{keys_of, show_keys};
use super::core::ufm_world::UfmWorld;
use super::world::{with, Shared, World};
use async_trait::async_trait;
use fabric_agent::daemon::StoredUfmLedger;
use fabric_agent::domain::NodeMemberships;
use fabric_agent::sm::ufm::{LinkError, UfmAnswer, UfmConfig, UfmLink, UfmSm};
use fabric_agent::sm::{ApplyOutcome, SmError, SubnetManager};
use fabric_agent::store::Store;
use rand::Rng;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::oneshot;

/// The URL the backend is configured with (never connected to: the link answers).
const URL: &str = "http://127.0.0.1:9";
/// The backend's request timeout (the reqwest client's whole-request timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_millis(15_000);
/// The latest a model UFM executes an attempt after it was sent.
pub const LATE_MAX: Duration = Duration::from_millis(100_000);
/// The backend's late-write window in these runs: above the longest an apply keeps retrying
/// (the reconciler's 60 s apply timeout) plus [`LATE_MAX`].
pub const LATE_WINDOW_MS: u64 = 180_000;
/// Set (to anything), the model link reads the node's stepped wall clock at every call instead
/// of modelling the production steady clock: the late-write window on an un-steady clock, which
/// the schedule's clock steps must catch (docs/SIMULATION.md, "Clock steps").
pub const UNSTEADY_CLOCK_ENV: &str = "FABRIC_SIM_UFM_UNSTEADY_CLOCK";

/// What happens to one attempt.
enum Fate {
    /// Refused before UFM saw it (connection refused): no effect.
    Refused(Duration),
    /// Answered 503 without effect.
    Unavailable(Duration),
    /// Executed after `exec`; answered after `reply` more (`None`: the answer is lost), with
    /// 503 instead of UFM's answer when `answer_503`.
    Execute {
        exec: Duration,
        reply: Option<Duration>,
        answer_503: bool,
    },
}

fn choose(w: &mut World) -> Fate {
    if !w.faults {
        return Fate::Execute {
            exec: w.ms(1, 20),
            reply: Some(w.ms(1, 20)),
            answer_503: false,
        };
    }
    let normal = |w: &mut World, answer_503| Fate::Execute {
        exec: w.ms(1, 50),
        reply: Some(w.ms(1, 50)),
        answer_503,
    };
    match w.rng.random_range(0..100) {
        0..=44 => normal(w, false),
        45..=52 => Fate::Refused(w.ms(1, 50)),
        53..=57 => Fate::Unavailable(w.ms(1, 50)),
        58..=64 => normal(w, true),
        65..=74 => Fate::Execute {
            exec: w.ms(1, 50),
            reply: None,
            answer_503: false,
        },
        75..=88 => Fate::Execute {
            exec: w.ms(500, 20_000),
            reply: Some(w.ms(1, 50)),
            answer_503: false,
        },
        // Long after the client gave up on it.
        _ => Fate::Execute {
            exec: w.ms(16_000, LATE_MAX.as_millis() as u64),
            reply: Some(w.ms(1, 50)),
            answer_503: false,
        },
    }
}

#[derive(Debug)]
struct Failed(String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

fn transient(what: &str) -> LinkError {
    LinkError::Transient(Box::new(Failed(what.into())))
}

/// The backend's way to the model UFM.
struct ModelLink {
    world: Shared,
    /// The production steady clock (`system_unix_ms`): the node's wall clock read once, at
    /// the first reading of this agent life, then advanced by the runtime's clock.
    steady: OnceLock<(i64, tokio::time::Instant)>,
    /// [`UNSTEADY_CLOCK_ENV`]: the stepped wall clock at every call.
    unsteady: bool,
}

/// The request `path?query` below the API path, as the model routes it.
fn route(
    model: &mut rules::Model,
    method: &Method,
    path: &str,
    body: Option<&Value>,
) -> (rules::Reply, bool) {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let guids_data = query.contains("guids_data=true");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = || ((404, serde_json::json!({"error": "Not Found"})), false);
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["resources", "pkeys", "last_updated"]) => (model.last_updated(), false),
        ("GET", ["resources", "pkeys"]) => (model.list(guids_data), false),
        ("GET", ["resources", "pkeys", key]) => (model.get(key, guids_data), false),
        ("POST", ["resources", "pkeys"]) => {
            let (r, k) = model.add(body);
            (r, k.is_some())
        }
        ("POST", ["actions", "remove_guids_from_pkey"]) => {
            let (r, k) = model.remove_action(body);
            (r, k.is_some())
        }
        ("DELETE", ["resources", "pkeys", key, "guids", guids]) => {
            let (r, k) = model.remove_resource(key, guids);
            (r, k.is_some())
        }
        _ => not_found(),
    }
}

/// What an add carries to the node's ports: (base, port GUIDs).
fn add_of(body: Option<&Value>) -> Option<(u16, Vec<u64>)> {
    let body = body?;
    let base = u16::from_str_radix(body.get("pkey")?.as_str()?.strip_prefix("0x")?, 16).ok()?;
    let guids = body
        .get("guids")?
        .as_array()?
        .iter()
        .filter_map(|g| u64::from_str_radix(g.as_str()?, 16).ok())
        .collect();
    Some((base & 0x7FFF, guids))
}

/// UFM executes request `id`: the model's rules decide the answer; a change reprograms the
/// node's ports from the partitions. Returns the answer and the port sweeps to start.
fn execute(
    w: &mut World,
    id: u64,
    method: &Method,
    path: &str,
    body: Option<&Value>,
) -> (Option<UfmAnswer>, Vec<(usize, Duration)>) {
    w.fabric.ufm_adds.remove(&id);
    let sent = w.ufm.as_mut().and_then(|u| u.pending.remove(&id));
    let Some(sent) = sent else {
        w.log(format!("ufm: request #{id} was lost in a UFM restart"));
        return (None, Vec::new());
    };
    let ufm = w.ufm.as_mut().expect("a UFM run");
    let before = ufm.node_keys();
    let ((status, reply), changed) = route(&mut ufm.model, method, path, body);
    let after = ufm.node_keys();
    let write = *method != Method::GET;
    if write {
        let late = w.now_ms().saturating_sub(sent);
        w.log(format!(
            "ufm: EXECUTED #{id} {method} {path} -> {status}{}{}",
            if late > REQUEST_TIMEOUT.as_millis() as u64 {
                format!(", {late} ms after it was sent (the client gave up)")
            } else {
                String::new()
            },
            if changed && before != after {
                format!("; the node's keys now {}", show_keys(&after))
            } else {
                String::new()
            }
        ));
    }
    let sweeps = if before != after {
        w.fabric.sm.config = Some(after);
        super::model_sm::sweep_delays(w)
    } else {
        Vec::new()
    };
    let answer = UfmAnswer {
        status: StatusCode::from_u16(status).expect("status"),
        body: serde_json::to_vec(&reply).expect("json"),
    };
    (Some(answer), sweeps)
}

#[async_trait]
impl UfmLink for ModelLink {
    async fn send(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Value>,
        _cap: usize,
    ) -> Result<UfmAnswer, LinkError> {
        let path = url
            .strip_prefix(URL)
            .and_then(|p| p.strip_prefix("/ufmRest"))
            .unwrap_or(url)
            .to_owned();
        let body = body.cloned();
        let (fate, id) = with(&self.world, |w| {
            let fate = choose(w);
            let id = w.next_request;
            w.next_request += 1;
            let what = match &fate {
                Fate::Refused(_) => "refused (no effect)".to_owned(),
                Fate::Unavailable(_) => "503 (no effect)".to_owned(),
                Fate::Execute {
                    exec,
                    reply,
                    answer_503,
                } => format!(
                    "executed in {} ms{}",
                    exec.as_millis(),
                    match (reply, answer_503) {
                        (None, _) => ", its answer lost",
                        (_, true) => ", answered 503",
                        _ => "",
                    }
                ),
            };
            if *method != Method::GET {
                w.log(format!(
                    "backend: UFM request #{id} {method} {path} {} -> {what}",
                    body.as_ref().map(Value::to_string).unwrap_or_default()
                ));
            }
            if let Fate::Execute { .. } = fate {
                let now = w.now_ms();
                if let Some(u) = w.ufm.as_mut() {
                    u.pending.insert(id, now);
                }
                if *method == Method::POST && path.starts_with("/resources/pkeys") {
                    if let Some(add) = add_of(body.as_ref()) {
                        w.fabric.ufm_adds.insert(id, add);
                    }
                }
            }
            (fate, id)
        });
        let (exec, reply, answer_503) = match fate {
            Fate::Refused(after) => {
                tokio::time::sleep(after).await;
                return Err(transient("cannot connect: Connection refused"));
            }
            Fate::Unavailable(after) => {
                tokio::time::sleep(after).await;
                return Ok(UfmAnswer {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    body: b"{}".to_vec(),
                });
            }
            Fate::Execute {
                exec,
                reply,
                answer_503,
            } => (exec, reply, answer_503),
        };
        let (tx, rx) = oneshot::channel();
        let world = self.world.clone();
        let m = method.clone();
        tokio::spawn(async move {
            tokio::time::sleep(exec).await;
            let (answer, sweeps) = with(&world, |w| execute(w, id, &m, &path, body.as_ref()));
            super::model_sm::start_sweeps(&world, sweeps);
            let _ = tx.send(answer);
        });
        let answered = async {
            let answer = rx.await.ok().flatten();
            match (answer, reply) {
                (Some(a), Some(after)) => {
                    tokio::time::sleep(after).await;
                    Some(a)
                }
                // Lost: the client hears nothing.
                _ => std::future::pending().await,
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, answered).await {
            Ok(Some(_)) if answer_503 => Ok(UfmAnswer {
                status: StatusCode::SERVICE_UNAVAILABLE,
                body: b"{}".to_vec(),
            }),
            Ok(Some(a)) => Ok(a),
            Ok(None) | Err(_) => Err(transient("timed out")),
        }
    }

    fn unix_ms(&self) -> i64 {
        let wall = self.world.lock().expect("world lock").wall.clone();
        if self.unsteady {
            return wall.now_ms();
        }
        let (anchor_ms, anchor) = *self
            .steady
            .get_or_init(|| (wall.now_ms(), tokio::time::Instant::now()));
        anchor_ms + anchor.elapsed().as_millis() as i64
    }

    fn jitter_ms(&self, max: u64) -> u64 {
        self.world
            .lock()
            .expect("world lock")
            .rng
            .random_range(0..=max)
    }
}

/// The node's backend as the agent sees it: the real [`UfmSm`] behind the trace.
struct Traced {
    world: Shared,
    inner: UfmSm,
}

#[async_trait]
impl SubnetManager for Traced {
    fn backend(&self) -> &'static str {
        "ufm"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        with(&self.world, |w| {
            w.note_apply(generation);
            w.log(format!(
                "agent: apply generation {generation} keys {} -> the UFM backend",
                show_keys(&keys_of(desired))
            ));
            w.apply_started.notify_waiters();
        });
        let r = self.inner.apply(desired, generation).await;
        with(&self.world, |w| match &r {
            Ok(o) => w.log(format!("backend: Ok ({})", o.detail)),
            Err(e) => w.log(format!("backend: {e}")),
        });
        r
    }

    fn conditions(&self) -> Vec<fabric_agent::domain::Condition> {
        self.inner.conditions()
    }
}

/// UFM for one run: its configuration, and the store whose rollback a backend was last told
/// about.
pub struct Ufm {
    config: UfmConfig,
    /// A store reports its rollback for as long as it is open; the daemon sees it at the one
    /// start on it, so only the first backend built on it is told.
    told: Mutex<Weak<Store>>,
    /// [`UNSTEADY_CLOCK_ENV`] was set.
    unsteady: bool,
    _dir: tempfile::TempDir,
}

impl Ufm {
    /// A fresh backend, as a (re)started agent builds it on the node's `store`: the ledger
    /// from the store, nothing in memory, and, on a store found restored, the restore watch.
    pub fn backend(&self, world: &Shared, store: &Arc<Store>) -> Arc<dyn SubnetManager> {
        let restored = {
            let mut told = self.told.lock().expect("told lock");
            let first = !std::ptr::eq(told.as_ptr(), Arc::as_ptr(store));
            *told = Arc::downgrade(store);
            store.rolled_back().filter(|_| first)
        };
        if let Some(why) = restored {
            with(world, |w| {
                w.log(format!(
                    "agent: the UFM backend is told the store was restored ({why})"
                ))
            });
        }
        let inner = UfmSm::new(&self.config, Arc::new(StoredUfmLedger(store.clone())))
            .expect("the UFM backend")
            .with_link(Arc::new(ModelLink {
                world: world.clone(),
                steady: OnceLock::new(),
                unsteady: self.unsteady,
            }))
            .after_restore(restored)
            .expect("the restore watch recorded");
        Arc::new(Traced {
            world: world.clone(),
            inner,
        })
    }
}

/// Sets up the model UFM in the world (quirks drawn from the seed) and the backend's
/// configuration; `late_window_ms` overrides [`LATE_WINDOW_MS`]; `unsteady` (or
/// [`UNSTEADY_CLOCK_ENV`]) makes the link read the stepped wall clock at every call.
pub fn start(world: &Shared, late_window_ms: Option<u64>, unsteady: bool) -> Ufm {
    let dir = tempfile::tempdir().expect("temp dir");
    let cred = dir.path().join("ufm.cred");
    std::fs::write(&cred, "admin:123456\n").expect("credentials file");
    let mut config = UfmConfig::with_credentials_file(URL, cred);
    config.request_timeout_ms = REQUEST_TIMEOUT.as_millis() as u64;
    config.late_write_window_ms = late_window_ms.unwrap_or(LATE_WINDOW_MS);
    with(world, |w| {
        let quirks = rules::Quirks {
            missing_key_empty_object: w.chance(0.5),
            delete_emptied_partitions: w.chance(0.5),
            remove_action_gone: w.chance(0.3),
            no_last_updated: w.chance(0.3),
            ..Default::default()
        };
        if w.chance(0.3) {
            config.list_reads = false;
        }
        w.log(format!(
            "ufm: {quirks:?}, list reads {}, late-write window {} ms",
            config.list_reads, config.late_write_window_ms
        ));
        w.ufm = Some(UfmWorld {
            model: rules::Model {
                quirks,
                ..Default::default()
            },
            ..Default::default()
        });
    });
    let unsteady = unsteady || std::env::var_os(UNSTEADY_CLOCK_ENV).is_some();
    if unsteady {
        with(world, |w| {
            w.log(format!(
                "{UNSTEADY_CLOCK_ENV}: the UFM link reads the stepped wall clock at every call (a rule switched off)"
            ))
        });
    }
    Ufm {
        config,
        told: Mutex::new(Weak::new()),
        unsteady,
        _dir: dir,
    }
}

/// UFM restarts: it keeps its partitions; requests it had not executed yet are lost; its SM
/// programs the ports again.
pub fn restart(world: &Shared) {
    let sweeps = with(world, |w| {
        let ufm = w.ufm.as_mut().expect("a UFM run");
        let lost: Vec<u64> = std::mem::take(&mut ufm.pending).into_keys().collect();
        w.fabric.ufm_adds.clear();
        w.log(format!("ufm: restarted; requests lost: {lost:?}"));
        super::model_sm::sweep_delays(w)
    });
    super::model_sm::start_sweeps(world, sweeps);
}
