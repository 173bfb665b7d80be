//! Soak: attach -> ACTIVE -> release -> RELEASED cycles against one daemon (embedded fabric,
//! release build) for a fixed time, with one WatchEvents follower reading every event, and
//! RELEASED attachments kept listed for `--retain-secs`. Prints, per interval: cycles done,
//! cycles/s, the attach -> ACTIVE p50/p99 of that interval, the daemon's RSS, how many
//! attachments are stored, and the cost of one cycle: the daemon's CPU milliseconds (user and
//! system apart: system time includes waiting out page-cache writeback) and the kilobytes it
//! wrote to storage (`/proc/<pid>/io`), with the store's size. A node whose cost
//! grows with its history shows falling cycles/s, rising RSS and a rising cost per cycle; a
//! healthy one stays flat within noise once the first retention period is over (cycles/s also
//! moves with the disk's fsync latency, which the cost per cycle does not).
//!
//! Run: `cargo bench --bench soak` (options: `-- --minutes N --interval-secs N --retain-secs N`;
//! defaults 10 minutes, 60 s intervals, 60 s retention).

mod support;

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{
    arg, cpu_split, cycle, dir_bytes, memory, ms, percentile, written_bytes, BenchDaemon,
};

fn partition(i: u64) -> pb::Partition {
    pb::Partition {
        id: format!("ibpart_s{}", i % 64),
        name: format!("s{}", i % 64),
        workspace: "soak".into(),
        account: "soak".into(),
        fabric: "bench".into(),
        pkey: 0x100 + (i % 64) as u32,
    }
}

fn main() {
    let minutes = arg("--minutes", 10);
    let interval = Duration::from_secs(arg("--interval-secs", 60).max(1));
    let retain = arg("--retain-secs", 60);
    let total = Duration::from_secs(minutes * 60);
    let daemon = BenchDaemon::start(&format!("[events]\nreleased_retain_secs = {retain}\n"));
    let pid = daemon.pid();
    let state_dir = daemon.state_dir();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let channel = fabric_agent::api::client::unix(&daemon.socket)
            .await
            .expect("connect");
        let mut c = FabricAgentClient::new(channel.clone());
        // The follower: reads every event as it comes.
        let followed = Arc::new(AtomicU64::new(0));
        let follower = {
            let followed = followed.clone();
            let mut f = FabricAgentClient::new(channel.clone());
            tokio::spawn(async move {
                let mut s = f
                    .watch_events(pb::WatchEventsRequest::default())
                    .await
                    .expect("watch")
                    .into_inner();
                while let Some(Ok(e)) = s.next().await {
                    followed.store(e.seq, Ordering::Relaxed);
                }
            })
        };
        println!(
            "soak: {minutes} min of attach+release cycles, one follower, released_retain_secs = {retain}"
        );
        println!(
            "{:>7} {:>8} {:>9} {:>11} {:>11} {:>8} {:>8} {:>9} {:>12} {:>11} {:>10} {:>9}",
            "t(s)",
            "cycles",
            "cycles/s",
            "attach p50",
            "attach p99",
            "RSS MB",
            "stored",
            "followed",
            "user ms/cyc",
            "sys ms/cyc",
            "KB wr/cyc",
            "store MB"
        );
        let start = Instant::now();
        let mut i = 0u64;
        let mut rates = Vec::new();
        let mut rss = Vec::new();
        let mut costs = Vec::new();
        while start.elapsed() < total {
            let window = Instant::now();
            let (cpu0, written0) = (cpu_split(pid), written_bytes(pid));
            let mut lat = Vec::new();
            while window.elapsed() < interval && start.elapsed() < total {
                let (attached, _) = cycle(
                    &mut c,
                    partition(i),
                    &format!("vm-{i}"),
                    Duration::from_secs(10),
                )
                .await;
                lat.push(attached);
                i += 1;
            }
            let secs = window.elapsed().as_secs_f64();
            lat.sort();
            let node = c
                .get_node(pb::GetNodeRequest {})
                .await
                .expect("node")
                .into_inner();
            let stored: u64 = node.attachment_counts.values().sum();
            let (kb, _) = memory(pid);
            let rate = lat.len() as f64 / secs;
            rates.push(rate);
            rss.push(kb as f64 / 1024.0);
            let n = lat.len().max(1) as f64;
            let cpu1 = cpu_split(pid);
            let user_ms = (cpu1.0 - cpu0.0) * 1e3 / n;
            let sys_ms = (cpu1.1 - cpu0.1) * 1e3 / n;
            let written_kb = written_bytes(pid).saturating_sub(written0) as f64 / 1024.0 / n;
            costs.push((user_ms + sys_ms, written_kb));
            println!(
                "{:>7.0} {:>8} {:>9.1} {:>11} {:>11} {:>8.1} {:>8} {:>9} {:>12.2} {:>11.2} {:>10.1} {:>9.1}",
                start.elapsed().as_secs_f64(),
                lat.len(),
                rate,
                percentile(&lat, 0.5).map(ms).unwrap_or_else(|| "-".into()),
                percentile(&lat, 0.99).map(ms).unwrap_or_else(|| "-".into()),
                kb as f64 / 1024.0,
                stored,
                followed.load(Ordering::Relaxed),
                user_ms,
                sys_ms,
                written_kb,
                dir_bytes(&state_dir) as f64 / 1e6,
            );
        }
        follower.abort();
        let spread = |v: &[f64]| {
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            (min, max)
        };
        // The first interval holds no pruning yet (nothing is older than the retention).
        let steady = if rates.len() > 2 { &rates[1..] } else { &rates[..] };
        let (lo, hi) = spread(steady);
        let (rlo, rhi) = spread(if rss.len() > 2 { &rss[1..] } else { &rss[..] });
        let steady_costs = if costs.len() > 2 { &costs[1..] } else { &costs[..] };
        let cpu: Vec<f64> = steady_costs.iter().map(|c| c.0).collect();
        let wr: Vec<f64> = steady_costs.iter().map(|c| c.1).collect();
        let ((clo, chi), (wlo, whi)) = (spread(&cpu), spread(&wr));
        println!(
            "total {i} cycles; over intervals 2..: cycles/s min {lo:.1} max {hi:.1}; RSS MB min {rlo:.1} max {rhi:.1}; daemon CPU ms per cycle min {clo:.2} max {chi:.2}; KB written per cycle min {wlo:.1} max {whi:.1}"
        );
    });
}
