//! The agent's Prometheus metrics (OpenMetrics text through the `prometheus-client` crate).
//!
//! Counters and histograms are recorded where things happen (the reconciler's applies and
//! reads, transitions as they commit); gauges that describe the current state (attachments by
//! state, ports, conditions, the event log's bounds) are refreshed from the agent at each scrape,
//! so they are never stale and cost nothing between scrapes.

use crate::domain::{AttachmentState, ConditionKind, SmState};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::time::Duration;

/// Label set: `(name, value)` pairs.
type Labels = Vec<(&'static str, String)>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// Serialises scrapes (the gauges are refreshed, then encoded).
    scrape: Mutex<()>,
    attachments: Family<Labels, Gauge>,
    oldest_releasing: Gauge<f64, std::sync::atomic::AtomicU64>,
    transitions: Family<Labels, Histogram, fn() -> Histogram>,
    applies: Family<Labels, Counter>,
    apply_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    sm_reachable: Gauge,
    sm_state: Family<Labels, Gauge>,
    apply_in_flight: Gauge<f64, std::sync::atomic::AtomicU64>,
    in_doubt: Gauge,
    generation: Gauge,
    reads: Family<Labels, Counter>,
    read_seconds: Histogram,
    port_state: Family<Labels, Gauge>,
    port_entries: Family<Labels, Gauge>,
    port_table_size: Family<Labels, Gauge>,
    events_first: Gauge,
    events_last: Gauge,
    conditions: Family<Labels, Gauge>,
    sweeps: Gauge,
    commits: Counter,
    commit_seconds: Histogram,
}

/// A transition whose latency is measured.
#[derive(Debug, Clone, Copy)]
pub enum Timed {
    /// Attach request -> ACTIVE.
    AttachToActive,
    /// Release request -> RELEASED.
    ReleaseToReleased,
    /// DRIFTED -> ACTIVE again.
    DriftRepaired,
}

impl Timed {
    fn label(self) -> &'static str {
        match self {
            Timed::AttachToActive => "attach_to_active",
            Timed::ReleaseToReleased => "release_to_released",
            Timed::DriftRepaired => "drift_to_repaired",
        }
    }
}

/// The state of things at a scrape, gathered by the agent.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Attachments per state.
    pub attachments: Vec<(AttachmentState, u64)>,
    /// Age of the oldest RELEASING attachment, seconds (0: none).
    pub oldest_releasing_secs: f64,
    /// Fabric and other ports: (device, port, IBA state number, non-empty entries, table size).
    pub ports: Vec<(String, u8, i64, i64, i64)>,
    /// Event log bounds.
    pub events: (u64, u64),
    /// Active standing conditions.
    pub conditions: Vec<ConditionKind>,
    /// Whether the last apply succeeded.
    pub sm_reachable: bool,
    /// Acknowledged, refused or unreachable.
    pub sm_state: SmState,
    /// Age of the apply in flight, seconds (None: none in flight).
    pub apply_in_flight_secs: Option<f64>,
    /// Keys in doubt.
    pub in_doubt: usize,
    /// Generation of the last apply.
    pub generation: u64,
    /// Heavy sweeps requested (SM host only).
    pub sweeps: Option<u64>,
}

impl Metrics {
    /// Registers every metric under the `fabric_agent_` prefix.
    pub fn new(backend: &str) -> Metrics {
        let mut registry = Registry::with_prefix("fabric_agent");
        let m = Metrics {
            registry: Registry::default(),
            scrape: Mutex::new(()),
            attachments: Family::default(),
            oldest_releasing: Gauge::default(),
            transitions: Family::new_with_constructor(latency_histogram),
            applies: Family::default(),
            apply_seconds: Family::new_with_constructor(latency_histogram),
            sm_reachable: Gauge::default(),
            sm_state: Family::default(),
            apply_in_flight: Gauge::default(),
            in_doubt: Gauge::default(),
            generation: Gauge::default(),
            reads: Family::default(),
            read_seconds: latency_histogram(),
            port_state: Family::default(),
            port_entries: Family::default(),
            port_table_size: Family::default(),
            events_first: Gauge::default(),
            events_last: Gauge::default(),
            conditions: Family::default(),
            sweeps: Gauge::default(),
            commits: Counter::default(),
            commit_seconds: latency_histogram(),
        };
        registry.register(
            "build",
            "Build information",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("backend", backend.to_owned()),
            ]),
        );
        registry.register("attachments", "Attachments by state", m.attachments.clone());
        registry.register(
            "oldest_releasing_seconds",
            "Age of the oldest attachment still RELEASING (0 when none)",
            m.oldest_releasing.clone(),
        );
        registry.register(
            "transition_seconds",
            "Latency of attach -> ACTIVE, release -> RELEASED and drift -> repaired",
            m.transitions.clone(),
        );
        registry.register(
            "sm_applies",
            "Subnet-manager applies by outcome",
            m.applies.clone(),
        );
        registry.register(
            "sm_apply_seconds",
            "Subnet-manager apply latency by outcome",
            m.apply_seconds.clone(),
        );
        registry.register(
            "sm_reachable",
            "1 when the last subnet-manager apply was acknowledged",
            m.sm_reachable.clone(),
        );
        registry.register(
            "sm_state",
            "1 for the subnet manager's state after the last apply: REACHABLE (acknowledged), \
             REFUSED (answered and said no), UNREACHABLE (no answer), UNKNOWN (no apply yet)",
            m.sm_state.clone(),
        );
        registry.register(
            "sm_apply_in_flight_seconds",
            "Age of the apply waiting for the subnet manager's answer (0 when none)",
            m.apply_in_flight.clone(),
        );
        registry.register(
            "in_doubt_keys",
            "P_Keys carried by an apply with no positive answer since (never RELEASED while in doubt)",
            m.in_doubt.clone(),
        );
        registry.register(
            "sm_generation",
            "Generation of the last apply (a persisted counter)",
            m.generation.clone(),
        );
        registry.register("observer_reads", "Port reads by outcome", m.reads.clone());
        registry.register(
            "observer_read_seconds",
            "Port read latency",
            m.read_seconds.clone(),
        );
        registry.register(
            "port_state",
            "Port logical state (IBA: 1 DOWN .. 4 ACTIVE, 0 unknown)",
            m.port_state.clone(),
        );
        registry.register(
            "port_pkey_entries",
            "Non-empty P_Key table entries per port",
            m.port_entries.clone(),
        );
        registry.register(
            "port_pkey_table_size",
            "P_Key table size per port",
            m.port_table_size.clone(),
        );
        registry.register(
            "event_log_first_seq",
            "Oldest retained event sequence number",
            m.events_first.clone(),
        );
        registry.register(
            "event_log_last_seq",
            "Newest event sequence number",
            m.events_last.clone(),
        );
        registry.register(
            "condition",
            "Standing conditions (1 while active), e.g. FULL_DEFAULT_MEMBERSHIP: an insecure posture",
            m.conditions.clone(),
        );
        registry.register(
            "sweeps_requested",
            "Heavy sweeps requested from OpenSM since start (SM host)",
            m.sweeps.clone(),
        );
        registry.register(
            "store_commits",
            "Durable store commits (each one write transaction, fsync'd)",
            m.commits.clone(),
        );
        registry.register(
            "store_commit_seconds",
            "Time of one durable store commit",
            m.commit_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Records one durable commit.
    pub fn commit(&self, elapsed: Duration) {
        self.commits.inc();
        self.commit_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records an attachment reaching a state, `elapsed` after its cause.
    pub fn transition(&self, which: Timed, elapsed: Duration) {
        self.transitions
            .get_or_create(&vec![("transition", which.label().to_owned())])
            .observe(elapsed.as_secs_f64());
    }

    /// Records one apply and how it ended ("ok", "unavailable", "refused", "stale_generation").
    pub fn apply(&self, outcome: &'static str, elapsed: Duration) {
        let labels = vec![("outcome", outcome.to_owned())];
        self.applies.get_or_create(&labels).inc();
        self.apply_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// Records one port read.
    pub fn read(&self, ok: bool, elapsed: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.reads
            .get_or_create(&vec![("outcome", outcome.to_owned())])
            .inc();
        self.read_seconds.observe(elapsed.as_secs_f64());
    }

    /// Refreshes the state gauges from `snapshot` and encodes everything as OpenMetrics text.
    pub fn encode(&self, snapshot: Snapshot) -> String {
        let _one = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.attachments.clear();
        for (state, n) in snapshot.attachments {
            self.attachments
                .get_or_create(&vec![("state", state.name().to_owned())])
                .set(n as i64);
        }
        self.oldest_releasing.set(snapshot.oldest_releasing_secs);
        self.port_state.clear();
        self.port_entries.clear();
        self.port_table_size.clear();
        for (device, port, state, entries, size) in snapshot.ports {
            let labels = vec![("device", device), ("port", port.to_string())];
            self.port_state.get_or_create(&labels).set(state);
            self.port_entries.get_or_create(&labels).set(entries);
            self.port_table_size.get_or_create(&labels).set(size);
        }
        self.events_first.set(snapshot.events.0 as i64);
        self.events_last.set(snapshot.events.1 as i64);
        self.conditions.clear();
        for kind in snapshot.conditions {
            self.conditions
                .get_or_create(&vec![("kind", kind.name().to_owned())])
                .set(1);
        }
        self.sm_reachable.set(i64::from(snapshot.sm_reachable));
        for state in SmState::ALL {
            self.sm_state
                .get_or_create(&vec![("state", state.name().to_owned())])
                .set(i64::from(state == snapshot.sm_state));
        }
        self.apply_in_flight
            .set(snapshot.apply_in_flight_secs.unwrap_or(0.0));
        self.in_doubt.set(snapshot.in_doubt as i64);
        self.generation.set(snapshot.generation as i64);
        self.sweeps.set(snapshot.sweeps.unwrap_or(0) as i64);
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
