//! WatchEvents consumers inside a schedule: the agent's real event stream (`Agent::watch`, what
//! the gRPC service streams), followed by model control planes that start from seeded cursors,
//! read at seeded paces (some eagerly, some slowly, some pausing for minutes while retention
//! prunes the log beneath them), and resume from their cursor when the agent crashes or
//! restarts (each incarnation is a new `Agent`).
//!
//! On every item they check what the stream promises (`src/agent/watch.rs`): events come
//! gap-free from the cursor (each seq is the previous one + 1) and are exactly what the log held
//! under that seq (the oracle's record); a stream ends only with OUT_OF_RANGE when the cursor's
//! next event is really gone (pruned, or the log restarted under a new epoch), with UNAVAILABLE
//! carrying the cursor when the agent stops or the stream's maximum age is reached, or (without
//! `follow`) once it replayed every event there was when it started — never by skipping ahead.
//! A refused watch must be true too. After OUT_OF_RANGE a consumer resynchronises like a control
//! plane (README "Event cursors and resynchronising"): `GetNode`, then it watches from the
//! newest event, or from the oldest retained one.

use super::core::plan::Schedule;
use super::core::watcher_plan::{StartAt, WatcherPlan};
use super::world::{with, Shared, World};
use fabric_agent::agent::{Agent, AgentError, CursorError, StreamEnd, WatchFrom};
use fabric_agent::domain::Event;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use tokio_stream::StreamExt;

/// Draws a schedule's consumers (one to three).
pub fn draw_plans(rng: &mut StdRng) -> Vec<WatcherPlan> {
    let n = rng.random_range(1..=3);
    (0..n)
        .map(|_| WatcherPlan {
            seed: rng.random(),
            start: match rng.random_range(0..4) {
                0 | 1 => StartAt::Beginning,
                2 => StartAt::Newest,
                _ => StartAt::Seq(rng.random_range(0..200)),
            },
            first_ms: rng.random_range(0..60_000),
            batch: [1, 4, 16, 64, 512][rng.random_range(0..5)],
            follow: rng.random_bool(0.8),
            max_age_ms: rng
                .random_bool(0.3)
                .then(|| rng.random_range(5_000..120_000)),
            pace_ms: [0, 0, 20, 300, 2_000, 10_000][rng.random_range(0..6)],
            pause_one_in: [0, 0, 5, 20, 100][rng.random_range(0..5)],
            resync_from_oldest: rng.random_bool(0.5),
        })
        .collect()
}

/// The agent incarnation serving WatchEvents now.
#[derive(Clone, Default)]
struct Serving {
    /// Counts changes.
    version: u64,
    /// Counts incarnations.
    n: u64,
    /// The agent (None: down).
    agent: Option<Agent>,
    /// It went down with a clean stop (its streams end with UNAVAILABLE), not a crash.
    clean: bool,
}

/// The run's observers of the event log: the WatchEvents consumers and the prune probe.
pub struct Watchers {
    serving: Board,
    tasks: Vec<JoinHandle<()>>,
}

/// Who serves now, and one wake-up per consumer, signalled in consumer order (a
/// `tokio::sync::watch` wakes its receivers in a random order, which a replay would not repeat).
#[derive(Clone, Default)]
struct Board {
    now: Arc<Mutex<Serving>>,
    wakes: Vec<Arc<Notify>>,
    /// Per consumer: it holds an agent handle (a stream, or the agent it is about to watch).
    holding: Vec<Arc<AtomicBool>>,
}

impl Board {
    fn change(&self, f: impl FnOnce(&mut Serving)) {
        {
            let mut s = self.now.lock().expect("board lock");
            s.version += 1;
            f(&mut s);
        }
        for w in &self.wakes {
            w.notify_one();
        }
    }

    fn get(&self) -> Serving {
        self.now.lock().expect("board lock").clone()
    }
}

/// A consumer's view of the board.
struct Seat {
    board: Board,
    wake: Arc<Notify>,
    holding: Arc<AtomicBool>,
    /// The version last seen.
    seen: u64,
}

impl Seat {
    /// Who serves now (marked seen).
    fn borrow_and_update(&mut self) -> Serving {
        let s = self.board.get();
        self.seen = s.version;
        s
    }

    /// Returns once the board changed since last seen.
    async fn changed(&mut self) {
        while self.board.get().version == self.seen {
            self.wake.notified().await;
        }
    }
}

impl Watchers {
    /// Tells the oracle the run's retention (judged on the node's wall clock, `World::wall`)
    /// and starts the schedule's consumers and the prune probe.
    pub fn start(world: &Shared, schedule: &Schedule) -> Watchers {
        let retain = Duration::from_millis(schedule.retention.released_retain_ms);
        with(world, |w| {
            let wall = w.wall.clone();
            w.oracle.judge_pruning(retain, wall);
        });
        let serving = Board {
            now: Arc::default(),
            wakes: (0..schedule.retention.watchers.len())
                .map(|_| Arc::new(Notify::new()))
                .collect(),
            holding: (0..schedule.retention.watchers.len())
                .map(|_| Arc::default())
                .collect(),
        };
        let mut tasks = vec![tokio::spawn(super::prune_probe::run(world.clone()))];
        for (i, plan) in schedule.retention.watchers.iter().enumerate() {
            let c = Consumer {
                name: format!("watcher w{i}"),
                rng: StdRng::seed_from_u64(plan.seed),
                plan: plan.clone(),
                world: world.clone(),
                serving: Seat {
                    board: serving.clone(),
                    wake: serving.wakes[i].clone(),
                    holding: serving.holding[i].clone(),
                    seen: 0,
                },
                cursor: None,
            };
            tasks.push(tokio::spawn(c.run()));
        }
        Watchers { serving, tasks }
    }

    /// A new incarnation of the agent serves WatchEvents.
    pub fn serve(&self, agent: &Agent) {
        self.serving.change(|s| {
            s.n += 1;
            s.agent = Some(agent.clone());
            s.clean = false;
        });
    }

    /// The agent goes away: stopped cleanly (`clean`: it ends every stream with UNAVAILABLE
    /// first, as the daemon does) or crashed (every stream is cut where it stands).
    pub fn down(&self, agent: &Agent, clean: bool) {
        // The consumers are woken in their order first; the streams' own wake-ups follow.
        self.serving.change(|s| {
            s.agent = None;
            s.clean = clean;
        });
        if clean {
            agent.begin_shutdown();
        }
    }

    /// Returns once no consumer holds a handle of a stopped agent (its store may then be
    /// replaced): call after [`Watchers::down`].
    pub async fn released(&self) {
        for _ in 0..100_000 {
            if !self
                .serving
                .holding
                .iter()
                .any(|h| h.load(Ordering::SeqCst))
            {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("a WatchEvents consumer still holds the stopped agent");
    }

    /// Ends every consumer and the probe; traces what they saw.
    pub fn stop(&self, world: &Shared) {
        for t in &self.tasks {
            t.abort();
        }
        let mut w = world.lock().expect("world lock");
        let line = format!(
            "watchers: {} events streamed and checked, {} OUT_OF_RANGE; {} RELEASED attachments pruned",
            w.oracle.streamed, w.oracle.out_of_range, w.oracle.pruned
        );
        w.log(line);
    }
}

/// One consumer: a control plane's cursor on the node's log.
struct Consumer {
    name: String,
    plan: WatcherPlan,
    rng: StdRng,
    world: Shared,
    serving: Seat,
    /// (log epoch, last seq processed); None before the first watch.
    cursor: Option<(String, u64)>,
}

/// What a stream's item leads to.
enum Next {
    /// Read on.
    Read,
    /// Watch again from the cursor (after a backoff).
    Reconnect,
    /// A finding: stop.
    Stop,
}

impl Consumer {
    async fn run(mut self) {
        sleep(Duration::from_millis(self.plan.first_ms)).await;
        loop {
            if !self.watch_once().await {
                return;
            }
            // A control plane's backoff; one that only replays polls again later.
            let backoff = if self.plan.follow {
                self.rng.random_range(0..2_000)
            } else {
                self.rng.random_range(5_000..30_000)
            };
            sleep(Duration::from_millis(backoff)).await;
        }
    }

    /// One watch, followed to its end; every agent handle is dropped on return (false: a
    /// finding).
    async fn watch_once(&mut self) -> bool {
        let (n, agent) = self.agent().await;
        let go_on = self.watch_agent(n, &agent).await;
        drop(agent);
        self.serving.holding.store(false, Ordering::SeqCst);
        go_on
    }

    async fn watch_agent(&mut self, n: u64, agent: &Agent) -> bool {
        {
            let from = self.from(agent);
            // What a replay-only stream must reach before it ends.
            let last_at_start = if self.plan.follow {
                0
            } else {
                agent.node().map_or(0, |n| n.last_event_seq)
            };
            match agent.watch(from.clone()) {
                Ok(stream) => {
                    let epoch = agent.log_epoch();
                    self.cursor = Some((epoch, from.after));
                    self.log(format!("watches after seq {}", from.after));
                    !matches!(
                        self.follow(stream, (n, agent), last_at_start).await,
                        Next::Stop
                    )
                }
                Err(e) => self.refused(agent, &from, e),
            }
        }
    }

    /// The agent serving now and its incarnation, once one is up.
    async fn agent(&mut self) -> (u64, Agent) {
        loop {
            let s = self.serving.borrow_and_update();
            if let Some(a) = s.agent {
                self.serving.holding.store(true, Ordering::SeqCst);
                return (s.n, a);
            }
            self.serving.changed().await;
        }
    }

    fn from(&self, agent: &Agent) -> WatchFrom {
        let (after, epoch) = match (&self.cursor, self.plan.start) {
            (Some((epoch, seq)), _) => (*seq, Some(epoch.clone())),
            (None, StartAt::Beginning) => (0, None),
            (None, StartAt::Seq(s)) => (s, None),
            (None, StartAt::Newest) => match agent.node() {
                Ok(n) => (n.last_event_seq, Some(n.log_epoch)),
                Err(_) => (0, None),
            },
        };
        WatchFrom {
            after,
            epoch,
            follow: self.plan.follow,
            batch: self.plan.batch,
            max_age: self.plan.max_age_ms.map(Duration::from_millis),
        }
    }

    /// A trace line (the model world does not change: no check).
    fn log(&self, what: String) {
        let mut w = self.world.lock().expect("world lock");
        w.log(format!("{}: {what}", self.name));
    }

    /// Records a finding (with the simulated time) and stops.
    fn finding(&self, w: &mut World, what: String) -> Next {
        let now = w.now_ms();
        w.oracle
            .finding
            .get_or_insert(format!("seen at t={now} ms: {}: {what}", self.name));
        Next::Stop
    }

    /// A watch refused at the start: it must be true, then the consumer resynchronises.
    /// Returns false on a finding.
    fn refused(&mut self, agent: &Agent, from: &WatchFrom, e: AgentError) -> bool {
        let world = self.world.clone();
        with(&world, |w| {
            let node = match agent.node() {
                Ok(n) => n,
                Err(e) => {
                    self.finding(w, format!("GetNode failed: {e}"));
                    return false;
                }
            };
            let truthful = match &e {
                AgentError::Cursor(CursorError::OtherEpoch { given, .. }) => {
                    from.epoch.as_deref() == Some(given.as_str()) && *given != node.log_epoch
                }
                // A cursor of this epoch is never beyond its newest event.
                AgentError::Cursor(CursorError::BeyondNewest { after, .. }) => {
                    from.epoch.is_none() && *after > node.last_event_seq
                }
                AgentError::Cursor(CursorError::Pruned { first, .. }) => {
                    *first == node.first_event_seq && from.after.saturating_add(1) < *first
                }
                _ => false,
            };
            if !truthful {
                let what = format!(
                    "watch after seq {} (epoch {:?}) refused with \"{e}\" while the log is {} \
                     {}..={}",
                    from.after,
                    from.epoch,
                    node.log_epoch,
                    node.first_event_seq,
                    node.last_event_seq
                );
                self.finding(w, what);
                return false;
            }
            self.resync(w, &node, &refusal(&e));
            true
        })
    }

    /// Like a control plane on OUT_OF_RANGE: `GetNode`, then watch from the newest event (its
    /// records replaced by a listing) or from the oldest retained one.
    fn resync(&mut self, w: &mut World, node: &fabric_agent::agent::NodeView, why: &str) {
        let after = if self.plan.resync_from_oldest && node.first_event_seq > 0 {
            node.first_event_seq - 1
        } else {
            node.last_event_seq
        };
        self.cursor = Some((node.log_epoch.clone(), after));
        w.oracle.out_of_range += 1;
        w.log(format!(
            "{}: OUT_OF_RANGE ({why}); resynchronises from seq {after}",
            self.name
        ));
    }

    /// Reads the stream at the plan's pace until it ends or the agent goes away: a crash or a
    /// new incarnation cuts it; after a clean stop it is read to its end (UNAVAILABLE).
    async fn follow(
        &mut self,
        mut stream: fabric_agent::agent::EventStream,
        (n, agent): (u64, &Agent),
        last_at_start: u64,
    ) -> Next {
        let started = Instant::now();
        let mut draining = false;
        loop {
            let item = tokio::select! {
                biased;
                _ = self.serving.changed(), if !draining => {
                    let s = self.serving.borrow_and_update();
                    if s.n == n && s.agent.is_none() && s.clean {
                        draining = true;
                        continue;
                    }
                    self.log("stream cut: the agent crashed or restarted".into());
                    return Next::Reconnect;
                }
                item = stream.next() => item,
            };
            // The oracle reads the log up to now first (the item may be the newest event).
            let world = self.world.clone();
            let ended = (started, draining, last_at_start);
            let next = {
                let mut w = world.lock().expect("world lock");
                w.check();
                self.judge(&mut w, item, agent, ended)
            };
            match next {
                Next::Read => {}
                other => return other,
            }
            if self.plan.pace_ms > 0 {
                self.nap(self.plan.pace_ms).await;
            }
            if self.plan.pause_one_in > 0 && self.rng.random_range(0..self.plan.pause_one_in) == 0 {
                let pause = self.rng.random_range(60_000..600_000);
                self.log(format!("stops reading for {pause} ms"));
                self.nap(pause).await;
            }
        }
    }

    /// Sleeps `ms`, or less when the agent crashes or restarts meanwhile (the stream then goes
    /// at once, as a connection does).
    async fn nap(&mut self, ms: u64) {
        tokio::select! {
            biased;
            _ = self.serving.changed() => {}
            _ = sleep(Duration::from_millis(ms)) => {}
        }
    }

    fn judge(
        &mut self,
        w: &mut World,
        item: Option<Result<Arc<Event>, AgentError>>,
        agent: &Agent,
        (started, stopping, last_at_start): (Instant, bool, u64),
    ) -> Next {
        let (epoch, seq) = self.cursor.clone().expect("a stream has a cursor");
        match item {
            Some(Ok(e)) => {
                if e.seq != seq + 1 {
                    let what = format!(
                        "after seq {seq} the stream delivered seq {} (a skip or a repeat)",
                        e.seq
                    );
                    return self.finding(w, what);
                }
                let now = w.now_ms();
                w.oracle.check_streamed(&self.name, &e, now);
                self.cursor = Some((epoch, e.seq));
                Next::Read
            }
            Some(Err(AgentError::Cursor(CursorError::Pruned { first, .. }))) => {
                let node = match agent.node() {
                    Ok(n) => n,
                    Err(e) => return self.finding(w, format!("GetNode failed: {e}")),
                };
                // True only if the event after the cursor is gone from the log: pruned, or
                // the log restarted under another epoch.
                let gone = node.log_epoch != epoch
                    || node.first_event_seq == 0
                    || node.first_event_seq > seq + 1;
                if !gone || first <= seq + 1 {
                    let what = format!(
                        "the stream ended with OUT_OF_RANGE (oldest retained {first}) after seq \
                         {seq}, but the log {} holds {}..={}",
                        node.log_epoch, node.first_event_seq, node.last_event_seq
                    );
                    return self.finding(w, what);
                }
                self.resync(w, &node, &format!("pruned after seq {seq}, oldest {first}"));
                Next::Reconnect
            }
            Some(Err(AgentError::StreamEnded {
                why,
                sent,
                epoch: e,
            })) => {
                let expired = self
                    .plan
                    .max_age_ms
                    .is_some_and(|a| started.elapsed() >= Duration::from_millis(a));
                let why_ok = match why {
                    StreamEnd::Stopping => stopping,
                    StreamEnd::Expired => expired,
                };
                if sent != seq || e.to_string() != epoch || !why_ok {
                    let what = format!(
                        "the stream ended \"{why}\" with cursor {e}/{sent}, its cursor being \
                         {epoch}/{seq} (agent stopping: {stopping}, max age reached: {expired})"
                    );
                    return self.finding(w, what);
                }
                w.log(format!("{}: stream ended ({why}) at seq {seq}", self.name));
                Next::Reconnect
            }
            Some(Err(e)) => self.finding(w, format!("the stream failed: {e}")),
            None if self.plan.follow => {
                self.finding(w, "a following stream ended without an error".into())
            }
            None if seq < last_at_start => {
                let what = format!(
                    "the replay ended at seq {seq} before seq {last_at_start}, the newest when \
                     it started"
                );
                self.finding(w, what)
            }
            None => Next::Reconnect,
        }
    }
}

/// A refusal in a few words (no epoch: replays print the same trace).
fn refusal(e: &AgentError) -> String {
    match e {
        AgentError::Cursor(CursorError::OtherEpoch { .. }) => "another log epoch".into(),
        AgentError::Cursor(CursorError::BeyondNewest { after, last, .. }) => {
            format!("after seq {after} beyond the newest {last}")
        }
        AgentError::Cursor(CursorError::Pruned { first, .. }) => {
            format!("pruned, oldest retained {first}")
        }
        other => other.to_string(),
    }
}
