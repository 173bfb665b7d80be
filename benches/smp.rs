//! SMP figures on the ibsim fabric: round-trip latency of P_KeyTable Gets (p50/p99 over 1000)
//! and the SMP observer's CPU use while idle-polling at the slow and the fast interval.
//!
//! Run: `cargo bench --bench smp`. The measuring side must run under umad2sim, so this program
//! starts a rig and re-executes itself under the shim as node "node1".

use testkit::rig;
mod support;

use fabric_agent::config::ObserverConfig;
use fabric_agent::observe::smp::SmpObserver;
use fabric_agent::observe::PortObserver;
use std::time::{Duration, Instant};
use support::{cpu_seconds_of, ms, percentile};

const CHILD_ENV: &str = "FABRIC_AGENT_SMP_BENCH_CHILD";
const GETS: usize = 1000;
const IDLE: Duration = Duration::from_secs(10);

async fn idle_cpu(observer: &SmpObserver, pending: bool) -> (f64, usize) {
    let start_cpu = cpu_seconds_of("self");
    let start = Instant::now();
    let mut polls = 0;
    while start.elapsed() < IDLE {
        observer.inventory().await.expect("inventory");
        polls += 1;
        tokio::select! {
            _ = observer.changed(pending) => {}
            _ = tokio::time::sleep(IDLE.saturating_sub(start.elapsed())) => {}
        }
    }
    let cpu = cpu_seconds_of("self") - start_cpu;
    (100.0 * cpu / start.elapsed().as_secs_f64(), polls)
}

fn child() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = ObserverConfig::default();
        let observer = SmpObserver::open(&config).expect("open umad0");
        for _ in 0..50 {
            observer.pkey_block(0).await.expect("warm-up");
        }
        let mut samples = Vec::with_capacity(GETS);
        for _ in 0..GETS {
            let t = Instant::now();
            observer.pkey_block(0).await.expect("P_KeyTable Get");
            samples.push(t.elapsed());
        }
        println!(
            "P_KeyTable Get round trip over {GETS}: p50 {}  p99 {}  max {}",
            percentile(&samples, 0.50).map(ms).unwrap_or_default(),
            percentile(&samples, 0.99).map(ms).unwrap_or_default(),
            samples.iter().max().copied().map(ms).unwrap_or_default()
        );
        let t = Instant::now();
        observer.inventory().await.expect("inventory");
        println!(
            "one inventory (NodeInfo + PortInfo + 2 P_KeyTable blocks): {:?}",
            t.elapsed()
        );
        for (label, pending, interval) in [
            ("slow", false, config.slow_poll()),
            ("fast", true, config.fast_poll()),
        ] {
            let (percent, polls) = idle_cpu(&observer, pending).await;
            println!(
                "idle polling at the {label} interval ({interval:?}) for {IDLE:?}: {polls} inventories, CPU {percent:.2}% of one core"
            );
        }
    });
}

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    // `cargo bench` passes `--bench`; nothing else is understood.
    let Some(fabric) = rig::Fabric::start(&rig::FabricSpec::new(2, 4), rig::DEFAULT_PARTITIONS)
    else {
        eprintln!("ibsim/OpenSM not installed: nothing measured");
        return;
    };
    let status = fabric
        .client_command("node1", std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .status()
        .expect("run the measuring child");
    assert!(status.success(), "measuring child: {status}");
}
