//! Benchmark of the daemon on the embedded fabric with zero apply delay. Prints:
//! - the durable commits (fsync) per attach and per release, read from the daemon's
//!   `fabric_agent_store_commits_total` around each call over the first 200 cycles,
//! - attach -> ACTIVE latency (p50/p99/max in three runs of 1,000 cycles, with no scrape between
//!   the calls; each cycle attaches with wait and then releases with wait, so the table never
//!   fills), and min/median/max of the runs' p99,
//! - unary RPC throughput over the unix socket (GetAttachment, 4 concurrent clients, 5 s),
//! - the daemon's idle RSS and CPU over 10 s.
//!
//! Run: `cargo bench --bench daemon` (add `-- --cycles N` to change the cycle count).

mod support;

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::time::{Duration, Instant};
use support::{cpu_seconds, cycle, memory, ms, percentile, BenchDaemon};

/// Latency runs.
const RUNS: u32 = 3;

/// The daemon's `fabric_agent_store_commits_total` from its metrics endpoint.
async fn commits(metrics: &str) -> u64 {
    fabric_agent::tls::install_crypto_provider();
    let text = reqwest::get(metrics)
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("fabric_agent_store_commits_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("fabric_agent_store_commits_total in the metrics")
}

fn partition(i: u32) -> pb::Partition {
    pb::Partition {
        id: format!("ibpart_b{i}"),
        name: format!("b{i}"),
        workspace: "bench".into(),
        account: "bench".into(),
        fabric: "bench".into(),
        pkey: 0x100 + (i % 0x7000),
    }
}

fn main() {
    let cycles: u32 = std::env::args()
        .skip_while(|a| a != "--cycles")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let daemon = BenchDaemon::start(&format!(
        "[metrics]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let pid = daemon.pid();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = fabric_agent::api::client::unix(&daemon.socket).await.unwrap();
        let mut c = FabricAgentClient::new(channel.clone());

        // Durable commits per attach and per release, scraped around each call (the scrapes
        // are kept out of the latency runs below).
        let counted = cycles.min(200);
        let (mut attach_commits, mut release_commits) = (0u64, 0u64);
        for i in 0..counted {
            let before = commits(&metrics).await;
            let r = c
                .attach_partition(pb::AttachPartitionRequest {
                    partition: Some(partition(i)),
                    instance_id: format!("vm-{i}"),
                    membership: pb::Membership::Full as i32,
                    wait_ms: Some(10_000),
                    grant: None,
                    ports: Vec::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.attachment.unwrap().state, pb::AttachmentState::Active as i32);
            let attached = commits(&metrics).await;
            attach_commits += attached - before;
            c.release_instance(pb::ReleaseInstanceRequest { instance_id: format!("vm-{i}"), wait_ms: Some(10_000) })
                .await
                .unwrap();
            release_commits += commits(&metrics).await - attached;
        }
        println!(
            "durable commits (fsync) over {counted} cycles: per attach -> ACTIVE {:.2}; per release -> RELEASED {:.2}",
            attach_commits as f64 / f64::from(counted),
            release_commits as f64 / f64::from(counted)
        );

        // attach -> ACTIVE latency: three runs of `cycles` attach+release cycles, nothing else
        // between the calls.
        println!("attach -> ACTIVE, {RUNS} runs of {cycles} cycles (embedded fabric, apply delay 0):");
        let mut p99s = Vec::new();
        for run in 0..RUNS {
            let mut lat = Vec::with_capacity(cycles as usize);
            let started = Instant::now();
            for i in 0..cycles {
                let n = counted + run * cycles + i;
                let (attached, _) = cycle(&mut c, partition(n), &format!("vm-{n}"), Duration::from_secs(10)).await;
                lat.push(attached);
            }
            let total = started.elapsed();
            let p99 = percentile(&lat, 0.99).expect("cycles");
            p99s.push(p99);
            println!(
                "  run {}: p50 {}  p99 {}  max {}  ({:.0} attach+release cycles/s)",
                run + 1,
                percentile(&lat, 0.5).map(ms).unwrap_or_default(),
                ms(p99),
                lat.iter().max().copied().map(ms).unwrap_or_default(),
                f64::from(cycles) / total.as_secs_f64()
            );
        }
        println!(
            "  p99 over the runs: min {}  median {}  max {}",
            percentile(&p99s, 0.0).map(ms).unwrap_or_default(),
            percentile(&p99s, 0.5).map(ms).unwrap_or_default(),
            percentile(&p99s, 1.0).map(ms).unwrap_or_default(),
        );

        // Unary RPC throughput.
        let run_for = Duration::from_secs(5);
        let deadline = Instant::now() + run_for;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let mut c = FabricAgentClient::new(channel.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    c.get_attachment(pb::GetAttachmentRequest { instance_id: "vm-0".into() }).await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        let mut calls = 0;
        for t in tasks {
            calls += t.await.unwrap();
        }
        println!(
            "unary RPC throughput (GetAttachment, unix socket, 4 concurrent clients, {}s): {:.0} calls/s",
            run_for.as_secs(),
            calls as f64 / run_for.as_secs_f64()
        );
    });
    drop(rt);

    // Idle: nothing calls the daemon for 10 s.
    std::thread::sleep(Duration::from_secs(1));
    let cpu0 = cpu_seconds(pid);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let cpu = (cpu_seconds(pid) - cpu0) / start.elapsed().as_secs_f64() * 100.0;
    let (rss, _) = memory(pid);
    println!(
        "idle over 10 s: CPU {cpu:.3}% of one core, RSS {:.1} MB",
        rss as f64 / 1024.0
    );
    drop(daemon);
}
