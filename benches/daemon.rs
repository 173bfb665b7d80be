//! Benchmark of the daemon on the embedded fabric with zero apply delay. Prints:
//! - attach -> ACTIVE latency (p50/p99 over 1,000 cycles; each cycle attaches with wait and then
//!   releases with wait, so the table never fills),
//! - unary RPC throughput over the unix socket (GetAttachment, 4 concurrent clients, 5 s),
//! - the daemon's idle RSS and CPU over 10 s.
//!
//! Run: `cargo bench --bench daemon` (add `-- --cycles N` to change the cycle count).

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fabric-agent");

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// (utime + stime in clock ticks, RSS in kB) of a process.
fn proc_usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields after the comm: state is index 0, utime is field 14 overall -> index 11 here.
    let ticks = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let socket = dir.join("agent.sock");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "node_id = \"bench\"\nfabric = \"bench\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
            dir.join("state").display(),
            socket.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("serve")
        .env("FABRIC_AGENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start fabric-agent");
    let pid = child.id();
    wait_for_socket(&socket);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = fabric_agent::api::client::unix(&socket).await.unwrap();
        let mut c = FabricAgentClient::new(channel.clone());

        // attach -> ACTIVE latency.
        let mut lat = Vec::with_capacity(cycles as usize);
        let started = Instant::now();
        for i in 0..cycles {
            let t = Instant::now();
            let r = c
                .attach_partition(pb::AttachPartitionRequest {
                    partition: Some(partition(i)),
                    instance_id: format!("vm-{i}"),
                    membership: pb::Membership::Full as i32,
                    wait_ms: Some(10_000),
                })
                .await
                .unwrap()
                .into_inner();
            lat.push(t.elapsed());
            assert_eq!(r.attachment.unwrap().state, pb::AttachmentState::Active as i32);
            c.release_instance(pb::ReleaseInstanceRequest { instance_id: format!("vm-{i}"), wait_ms: Some(10_000) })
                .await
                .unwrap();
        }
        let total = started.elapsed();
        lat.sort();
        println!("attach -> ACTIVE over {cycles} cycles (embedded fabric, apply delay 0):");
        println!(
            "  p50 {}  p99 {}  max {}  ({:.0} attach+release cycles/s)",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            ms(*lat.last().unwrap()),
            f64::from(cycles) / total.as_secs_f64()
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
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let (t0, _) = proc_usage(pid);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let (t1, rss) = proc_usage(pid);
    let cpu = (t1 - t0) as f64 / tick / start.elapsed().as_secs_f64() * 100.0;
    println!(
        "idle over 10 s: CPU {cpu:.3}% of one core, RSS {:.1} MB",
        rss as f64 / 1024.0
    );

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}
