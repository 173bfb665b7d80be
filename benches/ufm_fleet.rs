//! UFM at fleet scale: N agents (UFM backends, 8 port GUIDs and 32 keys each, keys shared by
//! pairs of agents) re-checking against one in-process fake UFM, counted at the fake.
//!
//! For every N and mode, each run seeds the fake with the fleet's partitions, lets every agent
//! make its first apply, then runs a window of `ROUNDS` resync rounds at a scaled-down period
//! (each agent's re-checks start at a random offset in the first period and repeat every
//! period +-10 %, as the reconciler's jitter does). In the stamp modes, agents are first put
//! at every phase of the skip cycle (agent `a` makes `a % 12` extra re-checks before the
//! window), so a window samples the steady state: about 1 in 12 re-checks reads the
//! partitions. Printed per row, min / median / max over
//! `RUNS` runs: requests per round at UFM, what that is per second at the real 300 s resync,
//! the request rate measured in the compressed window, and the p99 re-check apply latency.
//! The `churn` scenario has 1 % of the agents flip one key's membership once per round
//! (UFM's single `last_updated` stamp then moves for everyone); its p99 is of those changes.
//!
//! Modes: `per-key` is the old path (`list_reads = false`, `max_skipped_rechecks = 0`: one
//! GET per key per re-check); `stamp` is the new one (`max_skipped_rechecks = 11`, list reads
//! off because the fleet's list answer exceeds the 8 MiB cap at these sizes); `stamp+list`
//! (N = 100 only, where the list fits) also reads all keys through one list GET.
//!
//! The fake UFM runs in a child process (this program re-executed with `UFM_FLEET_FAKE=1`,
//! driven over its stdin), so the agents and the fake each have their own file-descriptor limit
//! and runtime: in one process the old path at 2,000 agents ran out of descriptors.
//!
//! `cargo bench --bench ufm_fleet -- [--fleet 100,1000,2000] [--runs 3] [--modes stamp|per-key]`
//! (`--modes stamp` skips the old path, `--modes per-key` runs only the old path).

use testkit::fake_ufm;
mod support;

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::ufm::{MemoryLedgerStore, UfmConfig, UfmSm};
use fabric_agent::sm::SubnetManager;
use fake_ufm::{FakeAuth, FakeMember, FakePartition, FakeUfm};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const GUIDS: u64 = 8;
const KEYS: u32 = 32;
const ROUNDS: u32 = 2;
/// The real resync period the per-second figure is scaled to.
const REAL_PERIOD_S: f64 = 300.0;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    PerKey,
    Stamp,
    StampList,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PerKey => "per-key (old)",
            Mode::Stamp => "stamp (new)",
            Mode::StampList => "stamp+list (new)",
        }
    }
}

fn guid(agent: usize, port: u64) -> u64 {
    0x0002_c903_0000_0000 + (agent as u64) * 16 + port
}

/// Agent `a`'s keys: 32 consecutive keys shared with its pair partner.
fn keys_of(agent: usize) -> Vec<u16> {
    (0..KEYS)
        .map(|j| 1 + (((agent / 2) as u32 * KEYS + j) % 32_000) as u16)
        .collect()
}

fn desired(agent: usize, limited_first: bool) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse(&format!("node-{agent}")).unwrap(),
        port_guids: (0..GUIDS).map(|p| Guid(guid(agent, p))).collect(),
        keys: keys_of(agent)
            .into_iter()
            .enumerate()
            .map(|(j, k)| {
                let membership = if j == 0 && limited_first {
                    Membership::Limited
                } else {
                    Membership::Full
                };
                (
                    PKey::new(u32::from(k)).expect("tenant key"),
                    KeySetting {
                        membership,
                        name: format!("p{k}"),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}

/// The fleet's final partitions, put in the fake directly (as if programmed earlier).
fn seed(fake: &FakeUfm, n: usize) {
    let mut parts: BTreeMap<u16, FakePartition> = BTreeMap::new();
    for a in 0..n {
        for k in keys_of(a) {
            let p = parts.entry(k).or_insert_with(|| FakePartition {
                name: format!("api_pkey_0x{k:x}"),
                ip_over_ib: true,
                members: BTreeMap::new(),
            });
            for port in 0..GUIDS {
                p.members.insert(
                    guid(a, port),
                    FakeMember {
                        membership: Membership::Full,
                        index0: false,
                    },
                );
            }
        }
    }
    for (k, p) in parts {
        fake.insert_partition(k, p);
    }
}

/// Environment variable that makes this program the fake UFM's process.
const CHILD_ENV: &str = "UFM_FLEET_FAKE";

/// The fake UFM's process: prints its URL, then answers one line per command read from stdin
/// (`seed N`, `clear`, `count`) until stdin closes.
async fn serve_fake() {
    let fake = FakeUfm::start_with(FakeAuth::Open).await;
    println!("{}", fake.url());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("seed"), Some(n)) => {
                seed(&fake, n.parse().expect("seed N"));
                println!("ok");
            }
            (Some("clear"), None) => {
                fake.clear_requests();
                println!("ok");
            }
            (Some("count"), None) => println!("{}", fake.request_count()),
            _ => println!("error: unknown command {line:?}"),
        }
    }
}

/// The fake UFM in its own process, stopped (by its pid) when dropped.
struct FakeProcess {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    url: String,
}

impl FakeProcess {
    async fn start() -> FakeProcess {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the fake UFM's process");
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let url = Self::line(&mut stdout, "its URL").await;
        FakeProcess {
            _child: child,
            stdin,
            stdout,
            url,
        }
    }

    async fn line(stdout: &mut Lines<BufReader<ChildStdout>>, what: &str) -> String {
        match tokio::time::timeout(Duration::from_secs(120), stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(_) => fail(&format!(
                "the fake UFM's process ended before answering {what}"
            )),
            Err(_) => fail(&format!(
                "the fake UFM's process did not answer {what} within 120 s"
            )),
        }
    }

    async fn command(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to the fake UFM's process");
        let answer = Self::line(&mut self.stdout, command).await;
        if answer.starts_with("error") {
            panic!("fake UFM: {answer}");
        }
        answer
    }

    async fn request_count(&mut self) -> usize {
        self.command("count").await.parse().expect("a count")
    }
}

fn config(url: &str, cred: &std::path::Path, mode: Mode) -> UfmConfig {
    let mut c = UfmConfig::with_credentials_file(url.to_owned(), cred.to_path_buf());
    c.request_timeout_ms = 30_000;
    c.list_reads = mode == Mode::StampList;
    c.max_skipped_rechecks = if mode == Mode::PerKey { 0 } else { 11 };
    c
}

struct RunResult {
    per_round: f64,
    measured_rps: f64,
    p99_ms: Option<f64>,
}

fn p99(mut v: Vec<Duration>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let idx = ((v.len() as f64) * 0.99).ceil() as usize - 1;
    Some(v[idx.min(v.len() - 1)].as_secs_f64() * 1e3)
}

fn fail(what: &str) -> ! {
    println!("TIMEOUT: {what}");
    std::process::exit(1);
}

async fn run(n: usize, mode: Mode, churn: bool, period: Duration) -> RunResult {
    let dir = tempfile::tempdir().expect("temp dir");
    let cred = dir.path().join("ufm.cred");
    std::fs::write(&cred, "admin:123456\n").expect("credentials");
    let mut fake = FakeProcess::start().await;
    fake.command(&format!("seed {n}")).await;
    let agents: Vec<Arc<UfmSm>> = (0..n)
        .map(|_| {
            Arc::new(
                UfmSm::new(
                    &config(&fake.url, &cred, mode),
                    Arc::new(MemoryLedgerStore::new()),
                )
                .expect("backend"),
            )
        })
        .collect();
    // First applies (start-up scan and confirmation), 64 at a time.
    let setup = futures::stream::iter(agents.iter().cloned().enumerate())
        .map(|(a, sm)| async move { sm.apply(&desired(a, false), 1).await })
        .buffer_unordered(64)
        .collect::<Vec<_>>();
    let results = tokio::time::timeout(Duration::from_secs(600), setup)
        .await
        .unwrap_or_else(|_| fail(&format!("first applies of {n} agents within 600 s")));
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
        panic!("a first apply failed: {e}");
    }
    // Steady state: agents are at every phase of the stamp's skip cycle (0-11 re-checks
    // answered from the stamp since the last full read), as they are after a while.
    if mode != Mode::PerKey {
        let phase = futures::stream::iter(agents.iter().cloned().enumerate())
            .map(|(a, sm)| async move {
                for g in 0..(a % 12) {
                    sm.apply(&desired(a, false), 2 + g as u64).await?;
                }
                Ok::<_, fabric_agent::sm::SmError>(())
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>();
        let results = tokio::time::timeout(Duration::from_secs(600), phase)
            .await
            .unwrap_or_else(|_| fail("phasing re-checks within 600 s"));
        if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
            panic!("a phasing re-check failed: {e}");
        }
    }

    // The window: ROUNDS periods of re-checks, measured at the fake.
    fake.command("clear").await;
    let start = Instant::now();
    let window = period * ROUNDS;
    let tasks: Vec<_> = agents
        .iter()
        .cloned()
        .enumerate()
        .map(|(a, sm)| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut at = period.mul_f64(rand::random_range(0.0..1.0));
                let changer = churn && a % 100 == 0;
                let mut flip = false;
                let mut generation = 20;
                while at < window {
                    tokio::time::sleep_until((start + at).into()).await;
                    if changer {
                        flip = !flip;
                    }
                    let t = Instant::now();
                    sm.apply(&desired(a, flip), generation)
                        .await
                        .expect("re-check apply");
                    if !churn || changer {
                        latencies.push(t.elapsed());
                    }
                    generation += 1;
                    at += period.mul_f64(rand::random_range(0.9..1.1));
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let deadline = start + window + Duration::from_secs(120);
    for t in tasks {
        match tokio::time::timeout_at(deadline.into(), t).await {
            Ok(Ok(l)) => latencies.extend(l),
            Ok(Err(e)) => panic!("agent task: {e}"),
            Err(_) => fail("re-check window did not end within 120 s of its end"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let requests = fake.request_count().await as f64;
    RunResult {
        per_round: requests / f64::from(ROUNDS),
        measured_rps: requests / elapsed,
        p99_ms: p99(latencies),
    }
}

fn spread(mut v: Vec<f64>, digits: usize) -> String {
    v.sort_by(f64::total_cmp);
    let f = |x: f64| format!("{x:.digits$}");
    format!(
        "{} / {} / {}",
        f(v[0]),
        f(v[v.len() / 2]),
        f(v[v.len() - 1])
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return serve_fake().await;
    }
    let fleet = support::arg_list("--fleet", "100,1000,2000");
    let runs = support::arg_usize("--runs", 3).max(1);
    println!(
        "UFM fleet: {GUIDS} GUIDs and {KEYS} keys per agent, keys shared by pairs, one fake UFM on loopback \
         (its own process; the agents' process has 2 worker threads), ledger in memory, {ROUNDS} resync rounds per run, {runs} runs (min / median / max)"
    );
    println!();
    println!("| agents | mode | scenario | period (scaled from 300 s) | requests per round at UFM | req/s at UFM at a 300 s resync | measured req/s (scaled window) | p99 apply ms |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|");
    for n in fleet {
        // Scaled period: long enough for the old path's round to fit on this machine.
        let period = Duration::from_millis((n as u64 * 5).max(2_000));
        let mut cases = vec![
            (Mode::PerKey, false),
            (Mode::Stamp, false),
            (Mode::Stamp, true),
        ];
        if n <= 100 {
            cases.push((Mode::StampList, false));
        }
        // `--modes stamp` runs only the new path, `--modes per-key` only the old one.
        match support::arg_text("--modes").as_deref() {
            Some("stamp") => cases.retain(|(m, _)| *m != Mode::PerKey),
            Some("per-key") => cases.retain(|(m, _)| *m == Mode::PerKey),
            None => {}
            Some(other) => panic!("--modes {other}: expected stamp or per-key"),
        }
        for (mode, churn) in cases {
            // The old path (and churn, where every re-check reads every key) sends N x 32
            // requests per round: give the round room for them at about 3,000 requests/s, so
            // the count is not cut short by this machine's CPU.
            let period = if mode == Mode::PerKey || churn {
                period.max(Duration::from_millis(n as u64 * u64::from(KEYS) / 3))
            } else {
                period
            };
            let mut rows = Vec::new();
            for _ in 0..runs {
                rows.push(run(n, mode, churn, period).await);
            }
            let p99s: Vec<f64> = rows.iter().filter_map(|r| r.p99_ms).collect();
            println!(
                "| {n} | {} | {} | {:.1} s | {} | {} | {} | {} |",
                mode.name(),
                if churn {
                    "churn 1 %/round (p99 of changes)"
                } else {
                    "quiet (p99 of re-checks)"
                },
                period.as_secs_f64(),
                spread(rows.iter().map(|r| r.per_round).collect(), 0),
                spread(
                    rows.iter().map(|r| r.per_round / REAL_PERIOD_S).collect(),
                    2
                ),
                spread(rows.iter().map(|r| r.measured_rps).collect(), 0),
                if p99s.is_empty() {
                    "n/a".into()
                } else {
                    spread(p99s, 1)
                },
            );
        }
    }
}
