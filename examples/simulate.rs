//! Long runs and replays of the reconciler's deterministic simulation.
//!
//! ```text
//! cargo run --release --example simulate -- --seeds 100000 [--start S] [--keep-going]
//! cargo run --release --example simulate -- --seed S          # replay one, schedule + trace
//! ```
//! Options: `--mixed-membership` lets two instances of one partition ask for different
//! memberships; `--opensm` applies through the real SM-host backend (`OpenSmBackend`) and a
//! model OpenSM process instead of the model SM; `--ufm` through the real UFM backend (`UfmSm`)
//! to a model UFM that executes requests late, out of order and after the client gave up;
//! `--ufm-window-ms N` sets that backend's late-write window (default 180,000: above the
//! model's latest execution; a shorter one lets late adds through, which the oracle catches);
//! `--whole-dir` makes every schedule put the node's whole state directory (database and side
//! file) back from a snapshot of the running node (not with `--ufm`);
//! `--digest` prints one line per seed (applies, RELEASED, simulated ms and a hash of its
//! trace): two runs of one binary replay exactly when their lines are the same.

use testkit::sim;

use std::process::ExitCode;
use std::time::Instant;

struct Args {
    seeds: u64,
    start: u64,
    replay: Option<u64>,
    keep_going: bool,
    digest: bool,
    options: sim::GenOptions,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1000,
        start: 0,
        replay: None,
        keep_going: false,
        digest: false,
        options: sim::GenOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match flag.as_str() {
            "--seeds" => a.seeds = num("--seeds")?,
            "--start" => a.start = num("--start")?,
            "--seed" => a.replay = Some(num("--seed")?),
            "--keep-going" => a.keep_going = true,
            "--digest" => a.digest = true,
            "--mixed-membership" => a.options.mixed_membership = true,
            "--opensm" => a.options.opensm = true,
            "--ufm" => a.options.ufm = true,
            "--whole-dir" => a.options.whole_dir = true,
            "--ufm-window-ms" => a.options.ufm_late_window_ms = Some(num("--ufm-window-ms")?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// One seed's fingerprint: what it did and a hash of everything it traced (simulated times
/// included), so a replay that took another path differs.
fn digest(o: &sim::Outcome) -> String {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same trace hashes the same in every run. A restarted log's
    // new epoch is drawn at random by the store (an opaque id nothing orders by): left out.
    let mut h = std::hash::DefaultHasher::new();
    for line in &o.trace {
        line.split(" new epoch ").next().hash(&mut h);
    }
    o.finding.hash(&mut h);
    format!(
        "seed {}: {} applies, {} RELEASED, {} ms simulated, trace {:016x}",
        o.schedule.seed,
        o.applies,
        o.released,
        o.sim_ms,
        h.finish()
    )
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("simulate: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.replay {
        let o = sim::run_seed(seed, args.options);
        if o.finding.is_some() {
            println!("{}", sim::report(&o, None));
            return ExitCode::FAILURE;
        }
        println!("{}", o.schedule);
        println!("trace:");
        for line in &o.trace {
            println!("  {line}");
        }
        println!(
            "seed {seed}: every check held ({} ms simulated, {} applies, {} reads, {} ACTIVE, {} RELEASED)",
            o.sim_ms, o.applies, o.reads, o.active, o.released
        );
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let mut failures = Vec::new();
    let (mut sim_ms, mut applies, mut released) = (0u64, 0u64, 0u64);
    let mut done = 0u64;
    for seed in args.start..args.start + args.seeds {
        let o = sim::run_seed(seed, args.options);
        done += 1;
        sim_ms += o.sim_ms;
        applies += o.applies;
        released += o.released;
        if args.digest {
            println!("{}", digest(&o));
        }
        if o.finding.is_some() {
            if failures.is_empty() {
                println!("{}", sim::report(&o, Some(60)));
            } else {
                println!("seed {seed}: {}", o.finding.as_deref().unwrap_or(""));
            }
            failures.push(seed);
            if !args.keep_going {
                break;
            }
        }
        if done % 1000 == 0 {
            eprintln!(
                "{done} schedules, {:.0}/s",
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{done} schedules in {secs:.1} s ({:.0} schedules/s); {:.0} simulated hours, {applies} applies, {released} RELEASED; {} failing seeds{}",
        done as f64 / secs,
        sim_ms as f64 / 3.6e6,
        failures.len(),
        if failures.is_empty() {
            String::new()
        } else {
            format!(": {failures:?}")
        }
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
