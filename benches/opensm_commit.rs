//! Group commit against a real OpenSM: NODES (default 500) HCAs on an ibsim fabric, every node
//! sending its desired set to the SM host's backend at once (in-process, one task per node).
//! Prints sweeps triggered, time until every call returned, and time until every node's P_Key
//! table holds its key (checked by one `smpquery pkeys <lid>` per node, sequentially, from one
//! client), with group commit on and off, plus a single change for comparison.
//!
//! Run: `cargo bench --bench opensm_commit` (needs ibsim-utils, opensm, infiniband-diags).

#[path = "../tests/opensm_rig.rs"]
mod opensm_rig;

use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::opensm::OwnershipConfig;
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend, OpenSmConfig, ReloadMethod};
use opensm_rig::Fabric;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPERATOR: &str = "# operator's part\nDefault=0x7fff, ipoib : ALL=limited, SELF=full;\n";
const NODES_PER_TENANT: usize = 8;

fn backend(fabric: &Fabric, group_commit: bool) -> OpenSmBackend {
    let config = OpenSmConfig {
        partitions_file: fabric.partitions.clone(),
        log_file: fabric.log.clone(),
        pid_file: Some(fabric.pid_file.clone()),
        reload: ReloadMethod::Sighup,
        reload_check_ms: 3000,
        group_commit,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    OpenSmBackend::new(config, "h1".into(), Arc::new(InMemoryNodeStore::default())).unwrap()
}

fn desired(i: usize, guid: u64, key_base: u32) -> (NodeMemberships, PKey) {
    let key = PKey::new(key_base + (i / NODES_PER_TENANT) as u32).unwrap();
    let m = NodeMemberships {
        node_id: format!("h{}", i + 1),
        port_guids: vec![Guid(guid)],
        keys: [(
            key,
            KeySetting {
                membership: Membership::Full,
                name: format!("tenant{}", i / NODES_PER_TENANT),
            },
        )]
        .into_iter()
        .collect(),
    };
    (m, key)
}

/// Polls each node in turn until its table holds `key` (full); returns when all do.
fn wait_visible(
    fabric: &Fabric,
    ports: &[(u64, u16)],
    keys: &[PKey],
    deadline: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    for ((_, lid), key) in ports.iter().zip(keys) {
        let want = key.value(Membership::Full).0;
        while !fabric.pkeys("h1", *lid).contains(&want) {
            if start.elapsed() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Some(start.elapsed())
}

fn round(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    ports: &[(u64, u16)],
    group_commit: bool,
    key_base: u32,
) {
    let b = backend(fabric, group_commit);
    let sets: Vec<(NodeMemberships, PKey)> = ports
        .iter()
        .enumerate()
        .map(|(i, (g, _))| desired(i, *g, key_base))
        .collect();
    let keys: Vec<PKey> = sets.iter().map(|(_, k)| *k).collect();
    let start = Instant::now();
    let results = rt.block_on(async {
        let tasks: Vec<_> = sets
            .into_iter()
            .map(|(m, _)| {
                let b = b.clone();
                tokio::spawn(async move { b.set_node(m, 1).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let replied = start.elapsed();
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err()) {
        println!("  first error: {e}");
    }
    // A spread sample first (10 nodes, polled until each holds its key): bounds the time the
    // keys landed to within a few SMP round trips. Then every node, sequentially.
    let step = (ports.len() / 10).max(1);
    let sample: Vec<usize> = (0..ports.len()).step_by(step).collect();
    let sample_ports: Vec<(u64, u16)> = sample.iter().map(|i| ports[*i]).collect();
    let sample_keys: Vec<PKey> = sample.iter().map(|i| keys[*i]).collect();
    let sampled = wait_visible(
        fabric,
        &sample_ports,
        &sample_keys,
        Duration::from_secs(300),
    )
    .map(|_| start.elapsed());
    println!(
        "  sample of {} nodes (every {step}th) held their keys {} after the requests started",
        sample.len(),
        sampled.map_or("TIMEOUT".to_owned(), |d| format!(
            "{:.2} s",
            d.as_secs_f64()
        ))
    );
    let check_start = Instant::now();
    let visible = wait_visible(fabric, ports, &keys, Duration::from_secs(300));
    println!(
        "group commit {:>3}: {} nodes, {} failed, sweeps {}, file writes {}, all replies after {:.2} s, every table verified after {} (sequential SMP check of all nodes took {:.2} s)",
        if group_commit { "on" } else { "off" },
        ports.len(),
        failed,
        b.sweeps(),
        b.writes(),
        replied.as_secs_f64(),
        visible.map_or("TIMEOUT".to_owned(), |_| format!("{:.2} s", start.elapsed().as_secs_f64())),
        check_start.elapsed().as_secs_f64(),
    );
}

fn main() {
    if !opensm_rig::available() {
        println!("skipped: ibsim/opensm/smpquery or the umad2sim shim not installed");
        return;
    }
    let nodes: usize = std::env::var("NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let t = Instant::now();
    let fabric = Fabric::start(nodes, OPERATOR);
    println!(
        "fabric: {nodes} HCAs, ibsim + OpenSM up in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let ports: Vec<(u64, u16)> = (1..=nodes)
        .map(|i| fabric.port_of(&format!("h{i}")))
        .collect();
    println!(
        "discovery: port GUID + LID of every HCA in {:.2} s ({:.1} ms per smpquery)",
        t.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64() * 1000.0 / (2 * nodes) as f64
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // One change alone: the cost of one write + heavy sweep.
    let b = backend(&fabric, true);
    let (m, key) = desired(0, ports[0].0, 0x0700);
    let t = Instant::now();
    let out = rt.block_on(b.set_node(m, 1)).unwrap();
    let replied = t.elapsed();
    let visible = wait_visible(&fabric, &ports[..1], &[key], Duration::from_secs(60));
    println!(
        "single change: reply after {:.3} s ({}), key visible on the port after {:.3} s",
        replied.as_secs_f64(),
        out.detail,
        visible.map_or(f64::NAN, |_| t.elapsed().as_secs_f64())
    );

    round(&rt, &fabric, &ports, true, 0x0100);
    round(&rt, &fabric, &ports, false, 0x0400);
}
