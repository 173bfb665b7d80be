//! Scale bench: one fleet client following N node agents (default 2,000).
//!
//! The agents are in-process fakes (`tests/common/fake_agent.rs`): one tonic server per agent,
//! each on its own loopback port, all in this process and runtime — so RSS and CPU below are the
//! follower's *and* the fakes' together (an upper bound for the follower). Prints: the cold
//! start (every node resynchronised through GetNode + ListAttachments), events per second
//! aggregated under an offered load, RSS, CPU, and the time to catch up after a restart of the
//! follower (cursors resumed from the store while the agents kept logging). Every wait is bounded;
//! a wait that runs out prints TIMEOUT and the program exits 1.
//!
//! `cargo bench -p fabric-fleet --bench follow -- --agents 2000 --seconds 10 --rate 20000`

#[path = "../tests/common/fake_agent.rs"]
mod fake_agent;

use fabric_fleet::proto::agent::{AttachmentState, Partition};
use fabric_fleet::registry::Registry;
use fabric_fleet::Fleet;
use fake_agent::FakeAgentState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    agents: usize,
    seconds: u64,
    rate: u64,
    limit: Duration,
}

fn args() -> Args {
    let mut a = Args {
        agents: 2000,
        seconds: 10,
        rate: 20_000,
        limit: Duration::from_secs(300),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || -> u64 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{k} takes a number"))
        };
        match k.as_str() {
            "--agents" => a.agents = v() as usize,
            "--seconds" => a.seconds = v(),
            "--rate" => a.rate = v(),
            "--limit-secs" => a.limit = Duration::from_secs(v()),
            "--bench" => {}
            other => panic!("unknown argument {other} (--agents, --seconds, --rate, --limit-secs)"),
        }
    }
    assert!(
        a.agents > 0 && a.seconds > 0,
        "--agents and --seconds must be above 0"
    );
    a
}

fn proc_status(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// User + system CPU seconds of this process (USER_HZ = 100).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // Fields 14 and 15 of stat(5); `after` starts at field 3.
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / 100.0
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            println!("TIMEOUT after {limit:?} waiting for {what}");
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

fn caught_up(fleet: &Fleet, agents: &[Arc<FakeAgentState>]) -> bool {
    fleet.with_view(|v| {
        agents.iter().all(|a| {
            v.nodes
                .get(&a.node_id)
                .is_some_and(|n| n.durable.seq == a.head() && n.live.reachable)
        })
    })
}

fn main() {
    let args = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args));
}

async fn run(args: Args) {
    let dir = tempfile::tempdir().expect("temp dir");
    let partition = |i: usize| Partition {
        id: format!("ibpart_b{}", i % 50),
        fabric: "fab1".into(),
        pkey: 0x100 + (i % 50) as u32,
        ..Default::default()
    };
    let mut agents = Vec::new();
    let mut text = String::from("[follow]\nbackoff_initial_ms = 100\nbackoff_max_ms = 2000\n");
    for i in 0..args.agents {
        let a = FakeAgentState::new(&format!("node-{i:05}"), &format!("0x{:016x}", 0xa000 + i));
        for k in 0..2 {
            a.transition(
                &format!("i-{i}-{k}"),
                &partition(i),
                AttachmentState::Active,
            );
        }
        let url = fake_agent::serve(a.clone(), std::future::pending()).await;
        text.push_str(&format!(
            "[[node]]\nid = \"{}\"\nendpoint = \"{url}\"\n",
            a.node_id
        ));
        agents.push(a);
    }
    let agents = Arc::new(agents);
    let registry = Registry::parse(&text).expect("nodes file");
    let store = dir.path().join("fleet.redb");
    println!(
        "agents: {} (in-process fakes, one loopback server each)",
        args.agents
    );
    let rss_before = proc_status("VmRSS:");

    // Cold start: every node resynchronised and following.
    let cpu0 = cpu_seconds();
    let mut fleet = Fleet::open(registry.clone(), &store).expect("open fleet");
    let t = Instant::now();
    fleet.follow();
    let cold = wait_until("the cold start", args.limit, || caught_up(&fleet, &agents)).await;
    let resyncs = fleet.with_view(|v| v.nodes.values().map(|n| n.live.resyncs).sum::<u64>());
    println!(
        "cold start: {:.2} s to resync and follow {} nodes ({resyncs} resyncs), CPU {:.2} s",
        cold.as_secs_f64(),
        args.agents,
        cpu_seconds() - cpu0
    );
    let _ = t;

    // Offered load: `rate` events per second across all agents, for `seconds`.
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let generator = {
        let (agents, stop, produced) = (agents.clone(), stop.clone(), produced.clone());
        let per_tick = (args.rate / 100).max(1);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut next = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_tick {
                    let i = next % agents.len();
                    let a = &agents[i];
                    if next % 4 == 0 {
                        let to = if (next / agents.len()) % 2 == 0 {
                            AttachmentState::Drifted
                        } else {
                            AttachmentState::Active
                        };
                        a.transition(&format!("i-{i}-0"), &partition(i), to);
                    } else {
                        a.port_flap();
                    }
                    next += 1;
                    produced.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let applied0 = fleet.with_view(|v| v.events_total);
    let cpu1 = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let applied = fleet.with_view(|v| v.events_total) - applied0;
    let cpu_load = cpu_seconds() - cpu1;
    stop.store(true, Ordering::Relaxed);
    let _ = generator.await;
    let offered = produced.load(Ordering::Relaxed);
    println!(
        "load: offered {} events in {} s ({:.0}/s), applied {:.0}/s, CPU {:.2} s ({:.0}% of one core)",
        offered,
        args.seconds,
        offered as f64 / args.seconds as f64,
        applied as f64 / args.seconds as f64,
        cpu_load,
        100.0 * cpu_load / args.seconds as f64
    );
    let drain = wait_until("the backlog to drain", args.limit, || {
        caught_up(&fleet, &agents)
    })
    .await;
    println!("drain after load: {:.2} s", drain.as_secs_f64());
    let rss = proc_status("VmRSS:");
    println!(
        "RSS: {:.1} MiB now, {:.1} MiB peak, {:.1} MiB before the follower started (fakes included)",
        rss as f64 / 1024.0,
        proc_status("VmHWM:") as f64 / 1024.0,
        rss_before as f64 / 1024.0
    );

    // Restart of the follower: stop (the store holds every applied event), agents keep
    // logging, start again from the store.
    fleet.shutdown().await;
    for (i, a) in agents.iter().enumerate() {
        a.transition(
            &format!("i-{i}-1"),
            &partition(i),
            AttachmentState::Releasing,
        );
        a.port_flap();
    }
    let t = Instant::now();
    fleet = Fleet::open(registry, &store).expect("reopen fleet");
    let loaded = t.elapsed();
    fleet.follow();
    let resume = wait_until("the restart's catch-up", args.limit, || {
        caught_up(&fleet, &agents)
    })
    .await;
    let resyncs = fleet.with_view(|v| v.nodes.values().map(|n| n.live.resyncs).sum::<u64>());
    println!(
        "restart: store loaded in {:.3} s, every node caught up {:.2} s later \
         ({} events logged while down, {resyncs} resyncs)",
        loaded.as_secs_f64(),
        resume.as_secs_f64(),
        2 * args.agents
    );
    fleet.shutdown().await;
}
