//! Group commit against a real OpenSM: NODES (default 500) HCAs on an ibsim leaf-spine fabric,
//! every node sending its desired set to the SM host's backend at once (in-process, one task
//! per node). Each of RUNS (default 3) runs prints: a single change (reply, key on the port),
//! then the burst with group commit on (sweeps, all replies, every port's table right, read by
//! 6 parallel SMP readers), then OFF_NODES (default 20) requests with group
//! commit off (one write + sweep each). Ends with min/median/max over the runs. Every wait has
//! a deadline: a missed one prints a `TIMEOUT ...` line and the bench exits 1.
//!
//! Run: `cargo bench --bench opensm_commit` (needs ibsim-utils, opensm, infiniband-diags);
//! the largest fabric ibsim accepts: `NODES=2000 PER_LEAF=47 cargo bench --bench opensm_commit`.

mod opensm_support;
#[path = "../tests/rig/mod.rs"]
mod rig;
mod support;

use fabric_agent::domain::PKey;
use fabric_agent::sm::opensm::InMemoryNodeStore;
use opensm_support::{
    backend, env_usize, finish, secs, set_of, storm, summary, wait_tables, Check, Want,
};
use rig::{Fabric, FabricSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPERATOR: &str = "# operator's part\nDefault=0x7fff, ipoib : ALL=limited, SELF=full;\n";
const NODES_PER_TENANT: usize = 8;
const DEADLINE: Duration = Duration::from_secs(120);

/// Figures of one run, seconds.
#[derive(Default)]
struct Run {
    single_reply: f64,
    single_visible: f64,
    burst_reply: f64,
    burst_right: f64,
    burst_sweeps: f64,
    off_per_request: f64,
}

fn run(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    ports: &[(String, u64, u16)],
    r: usize,
) -> Check<Run> {
    let mut out = Run::default();
    let key_base = 0x0100 + (r as u32) * 0x0100;
    // One change alone: the cost of one write + heavy sweep.
    let b = backend(fabric, true, Arc::new(InMemoryNodeStore::default()));
    let (name, guid, lid) = &ports[0];
    let key = PKey::new(0x7000 + r as u32).expect("key");
    let t = Instant::now();
    let (replied, failed, first) =
        storm(rt, &b, vec![set_of(name, *guid, Some(key))], 1, DEADLINE)?;
    if failed > 0 {
        return Err(format!("FAILED: single change: {first:?}"));
    }
    let want = [Want {
        lid: *lid,
        has: Some(key),
        lacks: None,
    }];
    let (visible, _) = wait_tables(fabric, 1, &want, t, DEADLINE)?;
    println!(
        "run {r}: single change: reply after {}, key on the port after {}",
        secs(replied),
        secs(visible)
    );
    out.single_reply = replied.as_secs_f64();
    out.single_visible = visible.as_secs_f64();
    drop(b);

    // Every node at once, group commit on.
    let b = backend(fabric, true, Arc::new(InMemoryNodeStore::default()));
    let key_of = |i: usize| PKey::new(key_base + (i / NODES_PER_TENANT) as u32).expect("key");
    let sets = ports
        .iter()
        .enumerate()
        .map(|(i, (n, g, _))| set_of(n, *g, Some(key_of(i))))
        .collect();
    let wants: Vec<Want> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, _, lid))| Want {
            lid: *lid,
            has: Some(key_of(i)),
            lacks: None,
        })
        .collect();
    let t = Instant::now();
    let (replied, failed, first) = storm(rt, &b, sets, 1, DEADLINE)?;
    let (right, polls) = wait_tables(fabric, 6, &wants, t, DEADLINE)?;
    println!(
        "run {r}: group commit on: {} nodes, {failed} failed{}, sweeps {}, file writes {}, all replies after {}, every table right (read by 6 parallel SMP readers) after {} ({polls} polls)",
        ports.len(),
        first.map(|e| format!(" (first: {e})")).unwrap_or_default(),
        b.sweeps(),
        b.writes(),
        secs(replied),
        secs(right),
    );
    if failed > 0 {
        return Err(format!(
            "FAILED: {failed} calls failed with group commit on"
        ));
    }
    out.burst_reply = replied.as_secs_f64();
    out.burst_right = right.as_secs_f64();
    out.burst_sweeps = b.sweeps() as f64;
    drop(b);

    // Group commit off: one write + sweep per request, so only a prefix is sent.
    let off = env_usize("OFF_NODES", 20).min(ports.len());
    let b = backend(fabric, false, Arc::new(InMemoryNodeStore::default()));
    let sets = ports[..off]
        .iter()
        .map(|(n, g, _)| set_of(n, *g, Some(PKey::new(0x0f00 + r as u32).expect("key"))))
        .collect();
    let (replied, failed, first) = storm(rt, &b, sets, 1, DEADLINE)?;
    if failed > 0 {
        return Err(format!("FAILED: group commit off: {first:?}"));
    }
    let per = replied.as_secs_f64() / off.max(1) as f64;
    println!(
        "run {r}: group commit off: {off} requests, sweeps {}, all replies after {} ({:.3} s per request; all {} nodes would take ~{:.0} s)",
        b.sweeps(),
        secs(replied),
        per,
        ports.len(),
        per * ports.len() as f64
    );
    out.off_per_request = per;
    Ok(out)
}

fn main() {
    let nodes = env_usize("NODES", 500);
    let runs = env_usize("RUNS", 3);
    // ibsim holds at most 2,048 nodes, switches included: 2,000 HCAs need PER_LEAF=47.
    let per_leaf = env_usize("PER_LEAF", 24);
    let t = Instant::now();
    let Some(fabric) = Fabric::start(&FabricSpec::leaf_spine(nodes, per_leaf), OPERATOR) else {
        println!("skipped: ibsim/opensm or the umad2sim shim not installed");
        return;
    };
    println!(
        "fabric: {nodes} HCAs + SM host, {} switches; ibsim + OpenSM up (SUBNET UP) in {}",
        fabric.spec().switches,
        secs(t.elapsed())
    );
    let t = Instant::now();
    let all = fabric.ports();
    let ports: Vec<(String, u64, u16)> = fabric
        .hcas()
        .into_iter()
        .map(|n| {
            let (g, l) = all[&n];
            (n, g, l)
        })
        .collect();
    println!(
        "discovery: port GUID + LID of every HCA from OpenSM's subnet dump in {}",
        secs(t.elapsed())
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut done = Vec::new();
    let result = (1..=runs).try_for_each(|r| {
        done.push(run(&rt, &fabric, &ports, r)?);
        Ok(())
    });
    let col = |f: fn(&Run) -> f64| done.iter().map(f).collect::<Vec<_>>();
    summary("single change: reply", &col(|r| r.single_reply));
    summary("single change: key on the port", &col(|r| r.single_visible));
    summary(
        "burst, group commit on: all replies",
        &col(|r| r.burst_reply),
    );
    summary(
        "burst, group commit on: every table right",
        &col(|r| r.burst_right),
    );
    let sweeps = col(|r| r.burst_sweeps);
    println!("burst, group commit on: sweeps per run {sweeps:?}");
    summary("group commit off: per request", &col(|r| r.off_per_request));
    finish(fabric, result);
}
