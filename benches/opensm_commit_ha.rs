//! The storm benchmark with two SM hosts: `--nodes` (default 500) HCAs on an ibsim leaf-spine
//! fabric with two real OpenSMs (the rig's own, priority 15, master; a second one on the first
//! HCA, priority 10, standby: `testkit::rig::ha::start_two_sms`), and two SM hosts in this
//! process, one per OpenSM, each with its own partitions file, the real file commit and
//! reloader (the sweep fence on the master; the standby's write confirmed by its STANDBY), a
//! gated store and peers pulling each other every `--sync-ms` (default 5000, the production
//! `sync_interval_ms`) ([`two_hosts`]). Every node sends its set to both hosts at once and
//! counts it acknowledged by the node's own rule (every SM host any answer names).
//!
//! Each of `--runs` (default 3) runs builds both hosts afresh (catch-up first), times one heavy
//! sweep of the master (median of `--sweeps`, default 3), then the attach storm and the release
//! storm (every node's set without its key), each printing: time to the last answer of each
//! host and to the last node's acknowledgement by both, per-node latency p50/p99 (send to the
//! later answer), reloads requested and commits (file writes) per host, `SUBNET UP`s in each
//! OpenSM's log, time until every port's table is right (read by [`opensm_support::tables`])
//! and the later of the two (the last ACTIVE/RELEASED a node could report), CPU seconds of this
//! process (both hosts) and of each OpenSM. Ends with min/median/max over the runs. Every wait
//! has a deadline: a missed one prints `TIMEOUT ...`, a node whose apply is not acknowledged
//! prints `FAILED ...`, and the bench exits 1.
//!
//! Run: `cargo bench --bench opensm_commit_ha` (needs ibsim-utils, opensm, infiniband-diags);
//! at 2,000 HCAs: `cargo bench --bench opensm_commit_ha -- --nodes 2000 --per-leaf 47`.
//! `--spread-ms N` spreads each storm's calls evenly over N milliseconds.

mod opensm_support;
use testkit::rig;
mod support;
#[path = "opensm_support/two_hosts.rs"]
mod two_hosts;

use fabric_agent::domain::{NodeMemberships, PKey};
use opensm_support::{
    finish, heavy_sweep, secs, set_of, summary, wait_tables, Check, TableReader, Want,
};
use rig::Fabric;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{arg_usize, cpu_seconds_of, percentile};
use two_hosts::{storm_both, OpenSmFiles, SmHost, TwoHosts};

const NODES_PER_TENANT: usize = 8;
const DEADLINE: Duration = Duration::from_secs(120);

/// One storm's figures (seconds; counts as f64).
#[derive(Default, Clone, Copy)]
struct Storm {
    last_a: f64,
    last_b: f64,
    last_both: f64,
    p50: f64,
    p99: f64,
    reloads: [f64; 2],
    commits: [f64; 2],
    subnet_ups: [f64; 2],
    right: f64,
    done: f64,
    cpu_self: f64,
    cpu_sm: [f64; 2],
}

#[derive(Default)]
struct Run {
    heavy_sweep: f64,
    attach: Storm,
    release: Storm,
}

fn subnet_ups(log: &Path, from: usize) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .get(from..)
        .map_or(0, |t| t.matches("SUBNET UP").count())
}

fn log_len(log: &Path) -> usize {
    std::fs::metadata(log).map_or(0, |m| m.len() as usize)
}

/// The OpenSM pids: the rig's, then the second's.
type Pids = [u32; 2];

#[allow(clippy::too_many_arguments)]
fn storm_line(
    rt: &tokio::runtime::Runtime,
    hosts: &Arc<[SmHost; 2]>,
    reader: &mut TableReader,
    pids: Pids,
    label: &str,
    sets: Vec<NodeMemberships>,
    generation: u64,
    wants: &[Want],
) -> Check<Storm> {
    let n = sets.len();
    let before = |h: &SmHost| (h.backend.sweeps(), h.backend.writes(), log_len(&h.log));
    let (b0, b1) = (before(&hosts[0]), before(&hosts[1]));
    let cpu = || {
        (
            cpu_seconds_of("self"),
            [
                cpu_seconds_of(&pids[0].to_string()),
                cpu_seconds_of(&pids[1].to_string()),
            ],
        )
    };
    let (cpu_self0, cpu_sm0) = cpu();
    let spread = Duration::from_millis(arg_usize("--spread-ms", 0) as u64);
    let t = Instant::now();
    let applies = storm_both(rt, hosts, sets, generation, DEADLINE, spread)?;
    let answered = t.elapsed();
    let failed: Vec<&String> = applies
        .iter()
        .filter_map(|a| a.verdict.as_ref().err())
        .collect();
    if let Some(first) = failed.first() {
        return Err(format!(
            "FAILED: {label}: {} of {n} nodes' applies not acknowledged by both SM hosts (first: {first})",
            failed.len()
        ));
    }
    let (right, polls) = wait_tables(reader, wants, t, DEADLINE)?;
    let (cpu_self1, cpu_sm1) = cpu();
    let last =
        |f: fn(&two_hosts::NodeApply) -> Duration| applies.iter().map(f).max().unwrap_or_default();
    let (last_a, last_b) = (last(|a| a.a), last(|a| a.b));
    let last_both = last_a.max(last_b);
    let latencies: Vec<Duration> = applies.iter().map(|a| a.latency()).collect();
    let pct =
        |p: f64| percentile(&latencies, p).ok_or_else(|| format!("FAILED: {label}: no latencies"));
    let (p50, p99) = (pct(0.50)?, pct(0.99)?);
    let delta = |h: &SmHost, b: (u64, u64, usize)| {
        (
            h.backend.sweeps() - b.0,
            h.backend.writes() - b.1,
            subnet_ups(&h.log, b.2),
        )
    };
    let (d0, d1) = (delta(&hosts[0], b0), delta(&hosts[1], b1));
    let done = last_both.max(right);
    let arrival = if spread.is_zero() {
        String::new()
    } else {
        format!(", calls spread over {}", secs(spread))
    };
    println!(
        "{label}: {n} nodes{arrival}; last answer: {} {} / {} {}, acknowledged by both {}; per node p50 {} p99 {}; \
         reloads requested a {} / b {}, commits a {} / b {}, SUBNET UP in the log a {} / b {}; \
         every table right after {} ({polls} polls), last ACTIVE/RELEASED possible after {}; \
         CPU s: both SM hosts (this process) {:.2}, OpenSM a {:.2} / b {:.2} (all answered after {})",
        hosts[0].name,
        secs(last_a),
        hosts[1].name,
        secs(last_b),
        secs(last_both),
        secs(p50),
        secs(p99),
        d0.0,
        d1.0,
        d0.1,
        d1.1,
        d0.2,
        d1.2,
        secs(right),
        secs(done),
        cpu_self1 - cpu_self0,
        cpu_sm1[0] - cpu_sm0[0],
        cpu_sm1[1] - cpu_sm0[1],
        secs(answered),
    );
    Ok(Storm {
        last_a: last_a.as_secs_f64(),
        last_b: last_b.as_secs_f64(),
        last_both: last_both.as_secs_f64(),
        p50: p50.as_secs_f64(),
        p99: p99.as_secs_f64(),
        reloads: [d0.0 as f64, d1.0 as f64],
        commits: [d0.1 as f64, d1.1 as f64],
        subnet_ups: [d0.2 as f64, d1.2 as f64],
        right: right.as_secs_f64(),
        done: done.as_secs_f64(),
        cpu_self: cpu_self1 - cpu_self0,
        cpu_sm: [cpu_sm1[0] - cpu_sm0[0], cpu_sm1[1] - cpu_sm0[1]],
    })
}

#[allow(clippy::too_many_arguments)]
fn run(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    files: [&OpenSmFiles; 2],
    pids: Pids,
    reader: &mut TableReader,
    ports: &[(String, u64, u16)],
    r: usize,
) -> Check<Run> {
    let mut out = Run::default();
    heavy_sweep(fabric, DEADLINE)?;
    let mut sweeps = (0..arg_usize("--sweeps", 3).max(1))
        .map(|_| heavy_sweep(fabric, DEADLINE))
        .collect::<Check<Vec<Duration>>>()?;
    sweeps.sort();
    let sweep = sweeps[sweeps.len() / 2];
    println!(
        "run {r}: one heavy sweep of the master (SIGHUP -> SUBNET UP, no change): median {}",
        secs(sweep)
    );
    out.heavy_sweep = sweep.as_secs_f64();

    let sync_every = Duration::from_millis(arg_usize("--sync-ms", 5000) as u64);
    let t = Instant::now();
    let hosts = TwoHosts::start(rt, files, sync_every)?;
    println!(
        "run {r}: two SM hosts built and caught up with each other in {} (peers pulled every {})",
        secs(t.elapsed()),
        secs(sync_every)
    );
    let key_of = |i: usize| PKey::new(0x0100 + (r as u32) * 0x0100 + (i / NODES_PER_TENANT) as u32);
    let key_of = |i: usize| key_of(i).expect("key");
    let sets = |with: bool| -> Vec<NodeMemberships> {
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
    for (what, with, generation) in [("attach", true, 1), ("release", false, 2)] {
        let label = format!("run {r}: {what} storm, two SM hosts");
        let storm = storm_line(
            rt,
            &hosts.hosts,
            reader,
            pids,
            &label,
            sets(with),
            generation,
            &wants(with),
        )?;
        if with {
            out.attach = storm;
        } else {
            out.release = storm;
        }
    }
    drop(hosts);
    Ok(out)
}

fn summaries(done: &[Run]) {
    for (what, pick) in [
        ("attach", (|r: &Run| r.attach) as fn(&Run) -> Storm),
        ("release", |r: &Run| r.release),
    ] {
        let col = |f: &dyn Fn(&Storm) -> f64| done.iter().map(|r| f(&pick(r))).collect::<Vec<_>>();
        summary(
            &format!("{what} storm: last answer, SM host a"),
            &col(&|s| s.last_a),
        );
        summary(
            &format!("{what} storm: last answer, SM host b"),
            &col(&|s| s.last_b),
        );
        summary(
            &format!("{what} storm: last node acknowledged by both"),
            &col(&|s| s.last_both),
        );
        summary(
            &format!("{what} storm: per-node latency p50"),
            &col(&|s| s.p50),
        );
        summary(
            &format!("{what} storm: per-node latency p99"),
            &col(&|s| s.p99),
        );
        summary(
            &format!("{what} storm: every table right"),
            &col(&|s| s.right),
        );
        summary(
            &format!("{what} storm: last ACTIVE/RELEASED possible"),
            &col(&|s| s.done),
        );
        println!(
            "{what} storm per run: reloads requested (a, b) {:?}, commits (a, b) {:?}, SUBNET UP in the log (a, b) {:?}, CPU s (SM hosts, OpenSM a, OpenSM b) {:?}",
            done.iter().map(|r| pick(r).reloads).collect::<Vec<_>>(),
            done.iter().map(|r| pick(r).commits).collect::<Vec<_>>(),
            done.iter().map(|r| pick(r).subnet_ups).collect::<Vec<_>>(),
            done.iter()
                .map(|r| {
                    let s = pick(r);
                    format!("({:.2}, {:.2}, {:.2})", s.cpu_self, s.cpu_sm[0], s.cpu_sm[1])
                })
                .collect::<Vec<_>>(),
        );
    }
    summary(
        "one heavy sweep of the master",
        &done.iter().map(|r| r.heavy_sweep).collect::<Vec<_>>(),
    );
}
fn main() {
    if opensm_support::tables::serve_if_child() {
        return;
    }
    let nodes = arg_usize("--nodes", 500);
    let runs = arg_usize("--runs", 3);
    let per_leaf = arg_usize("--per-leaf", 24);
    let spec = rig::FabricSpec::leaf_spine(nodes, per_leaf);
    let hcas = spec.hca_names();
    let (Some(second), Some(reader_node)) = (hcas.first().cloned(), hcas.last().cloned()) else {
        println!("FAILED: --nodes must be at least 1");
        std::process::exit(1);
    };
    let t = Instant::now();
    let Some((fabric, standby)) = rig::ha::start_two_sms(&spec, opensm_support::OPERATOR, &second)
    else {
        println!("skipped: ibsim/opensm or the umad2sim shim not installed");
        return;
    };
    println!(
        "fabric: {nodes} HCAs + SM host, {} switches ({per_leaf} end ports per leaf); two OpenSMs (master on the SM host, standby on {second}) up in {}",
        fabric.spec().switches,
        secs(t.elapsed())
    );
    let Some(second_pid) = standby.pid() else {
        println!("FAILED: the second OpenSM is not running");
        std::process::exit(1);
    };
    let pids = [fabric.opensm_pid(), second_pid];
    let files = [
        OpenSmFiles {
            partitions: fabric.partitions_path(),
            log: fabric.opensm_log_path(),
            pid_file: fabric.opensm_pid_path(),
        },
        OpenSmFiles {
            partitions: standby.partitions_path(),
            log: standby.log_path(),
            pid_file: standby.pid_path(),
        },
    ];
    let all = fabric.ports();
    let ports: Vec<(String, u64, u16)> = hcas
        .iter()
        .map(|n| {
            let (g, l) = all[n];
            (n.clone(), g, l)
        })
        .collect();
    let rt = opensm_support::runtime();
    let mut done = Vec::new();
    let result = TableReader::spawn(&fabric, &reader_node).and_then(|mut reader| {
        (1..=runs).try_for_each(|r| {
            done.push(run(
                &rt,
                &fabric,
                [&files[0], &files[1]],
                pids,
                &mut reader,
                &ports,
                r,
            )?);
            Ok(())
        })
    });
    summaries(&done);
    drop(rt);
    drop(standby);
    finish(fabric, result);
}
