//! Group commit against a real OpenSM: `--nodes` (default 500) HCAs on an ibsim leaf-spine fabric,
//! every node sending its desired set to the SM host's backend at once (in-process, one task
//! per node). Each of `--runs` (default 3) runs prints: one heavy sweep of the unchanged fabric
//! (median of `--sweeps`, default 3), one verification pass (every table read once), a single
//! change (reply, key on the port), the attach storm and then the release storm (every node's
//! set without its key, same backend) with group commit on (sweeps, all replies, every port's
//! table right and its ratio to one heavy sweep, CPU seconds and peak RSS of this process,
//! which hosts the backend, and of OpenSM), then `--off-nodes` (default 20) attaches and releases
//! with group commit off (one write + sweep each; extrapolated to all nodes). Tables are read
//! by [`opensm_support::tables`] (one umad client, many SMPs in flight), first cross-checked
//! against `smpquery`. Ends with min/median/max over the runs. Every wait has a deadline: a
//! missed one prints a `TIMEOUT ...` line and the bench exits 1.
//!
//! Run: `cargo bench --bench opensm_commit` (needs ibsim-utils, opensm, infiniband-diags);
//! the largest fabric ibsim accepts: `cargo bench --bench opensm_commit -- --nodes 2000 --per-leaf 47`.
//! `--spread-ms N` spreads each storm's calls evenly over N milliseconds instead of sending them
//! all at once.

mod opensm_support;
use testkit::rig;
mod support;

use fabric_agent::domain::{NodeMemberships, PKey};
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend};
use opensm_support::{
    backend, finish, heavy_sweep, read_pass, secs, set_of, storm, summary, summary_ratio,
    wait_tables, Check, TableReader, Usage, Want,
};
use rig::Fabric;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::arg_usize;

const NODES_PER_TENANT: usize = 8;
const DEADLINE: Duration = Duration::from_secs(120);

/// Figures of one run, seconds (sweeps as counts).
#[derive(Default)]
struct Run {
    single_reply: f64,
    single_visible: f64,
    heavy_sweep: f64,
    verify_pass: f64,
    attach: Storm,
    release: Storm,
    off_attach: f64,
    off_release: f64,
}

/// One storm with group commit on: sweeps it used, all replies, every table right.
#[derive(Default, Clone, Copy)]
struct Storm {
    sweeps: f64,
    reply: f64,
    right: f64,
}

/// Sends `sets` at once through `b`, waits until every want is met, and prints one line:
/// sweeps, replies, tables right (and its ratio to `sweep`, one heavy sweep), CPU and RSS
/// (CPU from /proc's clock ticks: 0.01 s resolution).
#[allow(clippy::too_many_arguments)]
fn storm_line(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    reader: &mut TableReader,
    b: &OpenSmBackend,
    label: &str,
    sets: Vec<NodeMemberships>,
    generation: u64,
    wants: &[Want],
    sweep: Duration,
) -> Check<Storm> {
    let n = sets.len();
    let sweeps_before = b.sweeps();
    let usage = Usage::start(fabric.opensm_pid());
    let t = Instant::now();
    let spread = Duration::from_millis(arg_usize("--spread-ms", 0) as u64);
    let (replied, failed, first) = storm(rt, b, sets, generation, DEADLINE, spread)?;
    let sweeps = b.sweeps() - sweeps_before;
    if failed > 0 {
        return Err(format!(
            "FAILED: {label}: {failed} of {n} calls failed (first: {})",
            first.unwrap_or_default()
        ));
    }
    let (right, polls) = wait_tables(reader, wants, t, DEADLINE)?;
    let arrival = if spread.is_zero() {
        String::new()
    } else {
        format!(", calls spread over {}", secs(spread))
    };
    println!(
        "{label}: {n} nodes{arrival}, sweeps {sweeps}, all replies after {}, every table right after {} ({polls} polls; {:.1}x one heavy sweep); {}",
        secs(replied),
        secs(right),
        right.as_secs_f64() / sweep.as_secs_f64(),
        usage.report()
    );
    Ok(Storm {
        sweeps: sweeps as f64,
        reply: replied.as_secs_f64(),
        right: right.as_secs_f64(),
    })
}

fn run(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    reader: &mut TableReader,
    ports: &[(String, u64, u16)],
    r: usize,
) -> Check<Run> {
    let mut out = Run::default();
    let key_base = 0x0100 + (r as u32) * 0x0100;
    // One heavy sweep of this fabric, unchanged, timed on its own: the median of SWEEPS, after
    // one untimed sweep (the previous run's last write is confirmed when OpenSM has re-read
    // the file, so its sweep may still be running, and its SUBNET UP would end a timed one).
    heavy_sweep(fabric, DEADLINE)?;
    let mut sweeps = (0..arg_usize("--sweeps", 3).max(1))
        .map(|_| heavy_sweep(fabric, DEADLINE))
        .collect::<Check<Vec<Duration>>>()?;
    sweeps.sort();
    let sweep = sweeps[sweeps.len() / 2];
    let each: Vec<String> = sweeps.iter().map(|d| secs(*d)).collect();
    println!(
        "run {r}: one heavy sweep (SIGHUP -> SUBNET UP, no change): median {} of {}",
        secs(sweep),
        each.join(", ")
    );
    out.heavy_sweep = sweep.as_secs_f64();
    let lids: Vec<u16> = ports.iter().map(|p| p.2).collect();
    let pass = read_pass(reader, &lids)?;
    println!(
        "run {r}: one verification pass (every table read once) {}",
        secs(pass)
    );
    out.verify_pass = pass.as_secs_f64();

    // One change alone: the cost of one write + heavy sweep.
    let b = backend(fabric, true, Arc::new(InMemoryNodeStore::default()));
    let (name, guid, lid) = &ports[0];
    let key = PKey::new(0x7000 + r as u32).expect("key");
    let t = Instant::now();
    let (replied, failed, first) = storm(
        rt,
        &b,
        vec![set_of(name, *guid, Some(key))],
        1,
        DEADLINE,
        Duration::ZERO,
    )?;
    if failed > 0 {
        return Err(format!("FAILED: single change: {first:?}"));
    }
    let want = [Want {
        lid: *lid,
        has: Some(key),
        lacks: None,
    }];
    let (visible, _) = wait_tables(reader, &want, t, DEADLINE)?;
    println!(
        "run {r}: single change: reply after {}, key on the port after {}",
        secs(replied),
        secs(visible)
    );
    out.single_reply = replied.as_secs_f64();
    out.single_visible = visible.as_secs_f64();
    drop(b);

    // Every node at once, group commit on: the attach storm, then the release storm through
    // the same backend (every node's set without its key, all at once).
    let b = backend(fabric, true, Arc::new(InMemoryNodeStore::default()));
    let key_of = |i: usize| PKey::new(key_base + (i / NODES_PER_TENANT) as u32).expect("key");
    let sets = |with: bool| {
        ports
            .iter()
            .enumerate()
            .map(|(i, (n, g, _))| set_of(n, *g, with.then(|| key_of(i))))
            .collect()
    };
    let wants = |with: bool| -> Vec<Want> {
        ports
            .iter()
            .enumerate()
            .map(|(i, (_, _, lid))| Want {
                lid: *lid,
                has: with.then(|| key_of(i)),
                lacks: (!with).then(|| key_of(i)),
            })
            .collect()
    };
    let mut storm_of = |what: &str, with: bool, generation: u64| {
        let label = format!("run {r}: {what} storm, group commit on");
        let (sets, wants) = (sets(with), wants(with));
        storm_line(
            rt, fabric, reader, &b, &label, sets, generation, &wants, sweep,
        )
    };
    out.attach = storm_of("attach", true, 1)?;
    out.release = storm_of("release", false, 2)?;
    drop(b);

    // Group commit off: one write + sweep per request, so only a prefix is sent: attached,
    // then released.
    let off = arg_usize("--off-nodes", 20).min(ports.len());
    let b = backend(fabric, false, Arc::new(InMemoryNodeStore::default()));
    let key = PKey::new(0x0f00 + r as u32).expect("key");
    for (what, with, generation) in [("attach", true, 1), ("release", false, 2)] {
        let sets = ports[..off]
            .iter()
            .map(|(n, g, _)| set_of(n, *g, with.then_some(key)))
            .collect();
        let sweeps_before = b.sweeps();
        let (replied, failed, first) = storm(rt, &b, sets, generation, DEADLINE, Duration::ZERO)?;
        if failed > 0 {
            return Err(format!("FAILED: group commit off, {what}: {first:?}"));
        }
        let per = replied.as_secs_f64() / off.max(1) as f64;
        let on = if with {
            out.attach.reply
        } else {
            out.release.reply
        };
        println!(
            "run {r}: {what}, group commit off: {off} requests, sweeps {}, all replies after {} ({per:.3} s per request; all {} nodes would take ~{:.0} s, {:.0}x the storm with group commit on)",
            b.sweeps() - sweeps_before,
            secs(replied),
            ports.len(),
            per * ports.len() as f64,
            per * ports.len() as f64 / on.max(1e-9)
        );
        if with {
            out.off_attach = per;
        } else {
            out.off_release = per;
        }
    }
    Ok(out)
}

/// The fast reader against `smpquery` on a few ports spread over the fabric: the same tables,
/// or the bench fails.
fn cross_check(
    fabric: &Fabric,
    reader: &mut TableReader,
    ports: &[(String, u64, u16)],
) -> Check<()> {
    let step = (ports.len() / 4).max(1);
    for (name, _, lid) in ports.iter().step_by(step) {
        let fast = reader.read(&[*lid])?.remove(0);
        let slow = fabric.pkeys_at(rig::SM_HOST, *lid);
        if fast != slow {
            return Err(format!(
                "FAILED: table of {name} (LID {lid}): fast reader {fast:?}, smpquery {slow:?}"
            ));
        }
    }
    println!("fast reader: same tables as smpquery on every {step}th port");
    Ok(())
}

fn main() {
    if opensm_support::tables::serve_if_child() {
        return;
    }
    let nodes = arg_usize("--nodes", 500);
    let runs = arg_usize("--runs", 3);
    // ibsim holds at most 2,048 nodes, switches included: 2,000 HCAs need --per-leaf 47.
    let per_leaf = arg_usize("--per-leaf", 24);
    let Some(fabric) = opensm_support::start_fabric(nodes, per_leaf) else {
        return;
    };
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
    let rt = opensm_support::runtime();
    let mut done = Vec::new();
    // The reader is the last HCA (the single change goes to the first).
    let reader_node = ports.last().map_or(rig::SM_HOST, |p| p.0.as_str());
    let result = TableReader::spawn(&fabric, reader_node).and_then(|mut reader| {
        cross_check(&fabric, &mut reader, &ports)?;
        (1..=runs).try_for_each(|r| {
            done.push(run(&rt, &fabric, &mut reader, &ports, r)?);
            Ok(())
        })
    });
    let col = |f: fn(&Run) -> f64| done.iter().map(f).collect::<Vec<_>>();
    summary("single change: reply", &col(|r| r.single_reply));
    summary("single change: key on the port", &col(|r| r.single_visible));
    summary("attach storm: all replies", &col(|r| r.attach.reply));
    summary("attach storm: every table right", &col(|r| r.attach.right));
    summary("release storm: all replies", &col(|r| r.release.reply));
    summary(
        "release storm: every table right",
        &col(|r| r.release.right),
    );
    summary("one heavy sweep", &col(|r| r.heavy_sweep));
    summary("one verification pass", &col(|r| r.verify_pass));
    let ratio = |f: fn(&Run) -> f64| {
        done.iter()
            .map(|r| f(r) / r.heavy_sweep)
            .collect::<Vec<_>>()
    };
    summary_ratio(
        "attach storm: table right / heavy sweep",
        &ratio(|r| r.attach.right),
    );
    summary_ratio(
        "release storm: table right / heavy sweep",
        &ratio(|r| r.release.right),
    );
    println!(
        "sweeps per storm (attach, release): {:?}",
        done.iter()
            .map(|r| (r.attach.sweeps, r.release.sweeps))
            .collect::<Vec<_>>()
    );
    summary(
        "group commit off: per attach request",
        &col(|r| r.off_attach),
    );
    summary(
        "group commit off: per release request",
        &col(|r| r.off_release),
    );
    finish(fabric, result);
}
