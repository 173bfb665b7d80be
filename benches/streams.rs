//! Stream flood: one client opens 10,000 WatchEvents streams against a real daemon (embedded
//! fabric, the default `[limits] max_watch_streams` unless `--limit` names one), so most are
//! refused. Prints:
//! - how many streams were accepted and how many refused with RESOURCE_EXHAUSTED,
//! - the daemon's RSS (VmRSS, VmHWM from /proc/<pid>/status) before, with the streams open, at
//!   peak and after they closed,
//! - attach -> ACTIVE and release -> RELEASED latency (p50/p99) without streams and with the
//!   streams open, and whether every open stream received every event of those cycles,
//! - stalled consumers: `--stalled N` (default 1,000) streams on a connection of their own
//!   that replay the whole log from seq 0 and never read: the daemon's RSS with them open.
//!
//! Run: `cargo bench --bench streams` (options: `-- --streams N --limit N --cycles N
//! --connections N`). All streams share one HTTP/2 connection unless `--connections` says
//! otherwise, so the daemon holds one socket per connection, not per stream; with many
//! connections raise the fd limit first (`ulimit -n`).

mod support;

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{
    arg, cpu_seconds, cpu_seconds_of, cycle, memory, ms, percentile, try_memory, BenchDaemon,
};
use tonic::transport::Channel;

/// Runs `cycles` and reports their latencies with the CPU the daemon and this client used.
async fn measured(what: &str, pid: u32, c: &mut FabricAgentClient<Channel>, first: u64, n: u64) {
    let (d0, s0, t0) = (cpu_seconds(pid), cpu_seconds_of("self"), Instant::now());
    let (attach, release) = cycles(c, first, n).await;
    let wall = t0.elapsed().as_secs_f64();
    report(what, &attach, &release);
    println!(
        "  over {wall:.1} s: daemon CPU {:.1} s, benchmark client CPU {:.1} s",
        cpu_seconds(pid) - d0,
        cpu_seconds_of("self") - s0
    );
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

fn partition(i: u64) -> pb::Partition {
    pb::Partition {
        id: format!("ibpart_s{i}"),
        name: format!("s{i}"),
        workspace: "bench".into(),
        account: "bench".into(),
        fabric: "bench".into(),
        pkey: 0x100 + (i % 0x7000) as u32,
    }
}

/// Attach-with-wait then release-with-wait, `cycles` times; the latencies of both.
async fn cycles(
    c: &mut FabricAgentClient<Channel>,
    first: u64,
    cycles: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut attach, mut release) = (Vec::new(), Vec::new());
    for i in first..first + cycles {
        let (a, r) = cycle(c, partition(i), &format!("vm-{i}"), Duration::from_secs(60)).await;
        attach.push(a);
        release.push(r);
    }
    (attach, release)
}

fn report(what: &str, attach: &[Duration], release: &[Duration]) {
    println!(
        "{what}: attach -> ACTIVE p50 {} p99 {} max {}; release -> RELEASED p50 {} p99 {}",
        percentile(attach, 0.5).map(ms).unwrap_or_default(),
        percentile(attach, 0.99).map(ms).unwrap_or_default(),
        attach.iter().max().copied().map(ms).unwrap_or_default(),
        percentile(release, 0.5).map(ms).unwrap_or_default(),
        percentile(release, 0.99).map(ms).unwrap_or_default(),
    );
}

fn main() {
    let streams = arg("--streams", 10_000);
    let limit = arg("--limit", 0);
    let n_cycles = arg("--cycles", 100).max(1);
    let connections = arg("--connections", 1).max(1);
    let stalled = arg("--stalled", 1000);
    let daemon = BenchDaemon::start(&if limit > 0 {
        format!("[limits]\nmax_watch_streams = {limit}\n")
    } else {
        String::new()
    });
    let pid = daemon.pid();
    let socket = daemon.socket.clone();
    // VmHWM is only updated lazily by the kernel: sample VmRSS every 20 ms for the peak too.
    let sampled_peak = Arc::new(AtomicU64::new(0));
    {
        let peak = sampled_peak.clone();
        std::thread::spawn(move || {
            while let Some((rss, _)) = try_memory(pid) {
                peak.fetch_max(rss, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut channels = Vec::new();
        for _ in 0..connections {
            channels.push(
                fabric_agent::api::client::unix(&socket)
                    .await
                    .expect("connect"),
            );
        }
        let mut c = FabricAgentClient::new(channels[0].clone());
        // Warm up (first commits, page cache), then the baseline.
        cycles(&mut c, 0, 10).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (rss_before, _) = memory(pid);
        measured(
            &format!("without streams ({n_cycles} cycles)"),
            pid,
            &mut c,
            1_000,
            n_cycles,
        )
        .await;

        // Open the streams, each from the newest event, each drained by its own task.
        let node = c
            .get_node(pb::GetNodeRequest {})
            .await
            .expect("node")
            .into_inner();
        let from = node.last_event_seq;
        let received = Arc::new(AtomicU64::new(0));
        let opened = Instant::now();
        let results: Vec<Result<tokio::task::JoinHandle<()>, tonic::Status>> =
            futures::stream::iter(0..streams)
                .map(|i| {
                    let mut c =
                        FabricAgentClient::new(channels[(i % connections) as usize].clone());
                    let epoch = node.log_epoch.clone();
                    let received = received.clone();
                    async move {
                        let mut s = c
                            .watch_events(pb::WatchEventsRequest {
                                after_seq: from,
                                no_follow: false,
                                log_epoch: Some(epoch),
                            })
                            .await?
                            .into_inner();
                        Ok(tokio::spawn(async move {
                            while let Some(Ok(_)) = s.next().await {
                                received.fetch_add(1, Ordering::Relaxed);
                            }
                        }))
                    }
                })
                .buffer_unordered(64)
                .collect()
                .await;
        let open_time = opened.elapsed();
        let mut readers = Vec::new();
        let (mut refused, mut other) = (0u64, Vec::new());
        for r in results {
            match r {
                Ok(task) => readers.push(task),
                Err(s) if s.code() == tonic::Code::ResourceExhausted => refused += 1,
                Err(s) => other.push(s),
            }
        }
        println!(
            "streams: {streams} requested over {connections} connection(s) in {:.2} s: {} open, \
             {refused} refused with RESOURCE_EXHAUSTED, {} other errors",
            open_time.as_secs_f64(),
            readers.len(),
            other.len()
        );
        if let Some(s) = other.first() {
            println!("  first other error: {s:?}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (rss_open, _) = memory(pid);

        measured(
            &format!("with {} streams open ({n_cycles} cycles)", readers.len()),
            pid,
            &mut c,
            2_000,
            n_cycles,
        )
        .await;
        let last = c
            .get_node(pb::GetNodeRequest {})
            .await
            .expect("node")
            .into_inner()
            .last_event_seq;
        let expected = (last - from) * readers.len() as u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        while received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let delivered = received.load(Ordering::Relaxed);
        println!(
            "delivery: {delivered} of {expected} events ({} per stream) reached the open streams",
            last - from
        );
        let (rss_peak, hwm) = memory(pid);

        for r in &readers {
            r.abort();
        }
        drop(readers);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (rss_after, hwm_after) = memory(pid);
        let peak = sampled_peak.load(Ordering::Relaxed).max(hwm_after);
        // The slots came back: a new stream opens.
        let reopened = c
            .watch_events(pb::WatchEventsRequest {
                after_seq: last,
                no_follow: false,
                log_epoch: None,
            })
            .await
            .is_ok();

        // Stalled consumers: replay everything, read nothing, on their own connection (one
        // HTTP/2 connection's flow-control window is shared by its streams).
        let stalled_channel = fabric_agent::api::client::unix(&socket)
            .await
            .expect("connect");
        let mut held = Vec::new();
        let (mut stalled_refused, mut stalled_other) = (0u64, None);
        for _ in 0..stalled {
            let mut c = FabricAgentClient::new(stalled_channel.clone());
            match c
                .watch_events(pb::WatchEventsRequest {
                    after_seq: 0,
                    no_follow: false,
                    log_epoch: None,
                })
                .await
            {
                Ok(s) => held.push(s.into_inner()),
                Err(e) if e.code() == tonic::Code::ResourceExhausted => stalled_refused += 1,
                Err(e) => {
                    stalled_other.get_or_insert(e);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (rss_stalled, _) = memory(pid);
        let mut c2 = FabricAgentClient::new(channels[0].clone());
        let t = Instant::now();
        c2.get_node(pb::GetNodeRequest {}).await.expect("node");
        let answered = t.elapsed();
        println!(
            "stalled: {stalled} requested, {stalled_refused} refused with RESOURCE_EXHAUSTED; {} \
             streams replaying a {last}-event log from seq 0, none read: daemon RSS {} \
             after 5 s ({} above the idle figure); GetNode answered meanwhile in {}",
            held.len(),
            mb(rss_stalled),
            mb(rss_stalled.saturating_sub(rss_after)),
            ms(answered)
        );
        if let Some(e) = stalled_other {
            println!("  a stalled stream failed otherwise: {e:?}");
        }
        drop(held);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (rss_end, _) = memory(pid);
        println!(
            "after closing the stalled streams: daemon RSS {}",
            mb(rss_end)
        );

        println!(
            "daemon RSS: before {}, streams open {}, after the loaded cycles {} (VmHWM then {}), \
             peak {} (max of 20 ms VmRSS samples and VmHWM), 5 s after closing them {}; \
             a new stream opens afterwards: {reopened}",
            mb(rss_before),
            mb(rss_open),
            mb(rss_peak),
            mb(hwm),
            mb(peak),
            mb(rss_after),
        );
    });
    drop(rt);
    drop(daemon);
}
