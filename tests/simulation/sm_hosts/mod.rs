//! Deterministic simulation of several SM hosts and their nodes, on the real code of both
//! sides, seeded.
//!
//! **SM hosts** (`hosts`): each is the real SM-host agent composed as `daemon::backend` composes
//! it: an `OpenSmBackend` on its own partitions file and in-memory store (kept across crashes),
//! every stored set held back at start (`GatedStore`, or `KeepRunningKeys` beside an OpenSM
//! that already runs), no commit before the catch-up, `PeerSync` pulling its peers over links
//! the schedule can cut, real `Fences` deciding on a model `FenceEvidence` (an SM that runs
//! answers SMInfo, one that does not is silent) and a role whose pid check is the model's, and
//! the real `Partitions` service the nodes call. Beside each agent a model OpenSM runs or not;
//! the master is the running OpenSM of highest priority (the lowest index), and after every step
//! it programs the ports from *its* file (as OpenSM does at every heavy sweep and at takeover).
//!
//! **Nodes** (`node`): what a node says is decided by the node's real truth rules, not a model:
//! its set by `agent::desired`, generations and what is in doubt by `SmKnowledge`, whether an
//! apply is acknowledged by the remote backend's `fold_answers` over every endpoint's answer
//! (the host-set rule: identities, the hosts the answers name, fenced hosts excused only when
//! every answering host holds them fenced, `SM_HOST_SET_INCOMPLETE`), and ACTIVE / RELEASED by
//! `agent::plan` on the port as the master programmed it. A seed may give one node an
//! `endpoints` list that misses one SM host.
//!
//! **Node agent restarts** (`node_life`, drawn from a stream of their own): a snapshot of a
//! node's store; a restart, clean, after a crash, or from the last snapshot of the running node
//! (a reverted VM). A new life resumes as the runner starts one, and until its start check is
//! settled (the real `agent::start_check`, asking every endpoint through the real
//! `GetNodeMemberships`) it sends only removals; a rollback verdict withholds the restored
//! attachments the port lacks until the control plane's resync sends their attach again.
//!
//! **Schedules** (`world`) draw attaches, releases and re-applies; an SM host's OpenSM dying
//! alone (its agent lives), its agent dying alone (its OpenSM runs on and may become master with
//! its file), the whole host dying; a host coming back in systemd's order (agent and catch-up,
//! then OpenSM); an agent restarted beside its running OpenSM; a whole-host restore (store and
//! partitions file from one earlier snapshot); fencing, by the hosts' pulls and by the
//! operator's `fence-sm-host` (`Fences::fence_now`); links between hosts, and between a node and
//! a host, cut and healed.
//!
//! **Oracle** (`oracle`), after every step:
//! 1. a key a node reported RELEASED is on none of its ports (until it attaches it again);
//! 2. nor in any live SM host's (agent or OpenSM running) served stored set or partitions file,
//!    except a host held fenced (a fence stored on any host) whose OpenSM is not running;
//! 3. an ACTIVE key survives a failover to a master that acknowledged it, whose agent has not
//!    restarted since and is caught up (or is down);
//! 4. an agent restarted beside its running OpenSM takes no ACTIVE key off a port.
//!
//! A node's `released` is the control plane's view: a restore of the node does not take it
//! back, so 1 and 2 hold a restored node to what it reported before.
//!
//! `FABRIC_SIM_SM_HOSTS_SEEDS=N` runs N seeds (default 16), `FABRIC_SIM_SM_HOSTS_SEED=S` one,
//! `FABRIC_SIM_SM_HOSTS_STEPS` the steps per seed (200); a failure prints its seed and the
//! trace. `FABRIC_SIM_SM_HOSTS_MUTATION=stale-endpoints|evidence-lies|skip-start-check`
//! switches one rule off (a stale `endpoints` list's acknowledgements count; fencing's evidence
//! always says the SM is silent; a node's start runs no start check) to show the oracle catches
//! it; the `..._catches_...` tests do that on every run. `FABRIC_SIM_SM_HOSTS_NODE_LIFE=N` draws
//! node snapshots and restarts at N times their rate (1; at most 10): 0 draws none (the
//! schedules as they were before they were drawn).
//! `FABRIC_SIM_SM_HOSTS_TAIL=N` prints the last N lines of a failing seed's trace (40).
//! `FABRIC_SIM_SM_HOSTS_KEEP_GOING=1` runs every seed and reports the failing ones at the end;
//! `FABRIC_SIM_SM_HOSTS_REJOIN_WHILE_FENCED=1` starts a host's OpenSM after its agent's catch-up
//! even while a peer holds the host fenced, as the real system does (the default schedules keep
//! it stopped until no stored fence names it); the finding tests at the end run both.

mod hosts;
mod node;
mod node_life;
mod oracle;
mod world;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use world::{Mutation, Stats, World, HOSTS, NODES};

async fn run(
    seed: u64,
    steps: usize,
    mutation: Mutation,
    rejoin_while_fenced: bool,
    node_life: u32,
) -> Result<Stats, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let stale = match mutation {
        Mutation::StaleEndpointsCount => Some((0, rng.random_range(1..HOSTS))),
        _ if rng.random_range(0..3) > 0 => {
            Some((rng.random_range(0..NODES), rng.random_range(0..HOSTS)))
        }
        _ => None,
    };
    let mut w = World::new(stale, mutation).await;
    w.rejoin_while_fenced = rejoin_while_fenced;
    if node_life > 0 {
        w.draw_node_life(seed, node_life);
    }
    for _ in 0..steps {
        if let Err(e) = w.step_once(&mut rng).await {
            let lines = env_usize("FABRIC_SIM_SM_HOSTS_TAIL").unwrap_or(40);
            let tail = w.log[w.log.len().saturating_sub(lines)..].join("\n  ");
            let head = if stale.is_some() { &w.log[0] } else { "" };
            return Err(format!(
                "seed {seed}, step {}: {e}\n  {head}\n  ...\n  {tail}",
                w.step
            ));
        }
    }
    Ok(w.stats)
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().map(|s| s.parse().expect(name))
}

/// One current-thread runtime with paused time, the backends' blocking I/O run inline: a seed
/// replays exactly, and no wait of the backends costs real time.
struct Runtime(tokio::runtime::Runtime);

impl Runtime {
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        fabric_agent::sm::blocking::inline_blocking_io(|| self.0.block_on(f))
    }
}

fn runtime() -> Runtime {
    Runtime(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap(),
    )
}

#[test]
fn several_sm_hosts_never_say_a_false_released_nor_lose_an_active_key() {
    let mutation = match std::env::var("FABRIC_SIM_SM_HOSTS_MUTATION").as_deref() {
        Ok("stale-endpoints") => Mutation::StaleEndpointsCount,
        Ok("evidence-lies") => Mutation::EvidenceLies,
        Ok("skip-start-check") => Mutation::SkipStartCheck,
        Ok(other) => panic!("unknown mutation {other:?}"),
        Err(_) => Mutation::None,
    };
    let seeds: Vec<u64> = match env_usize("FABRIC_SIM_SM_HOSTS_SEED") {
        Some(s) => vec![s as u64],
        None => (1..=env_usize("FABRIC_SIM_SM_HOSTS_SEEDS").unwrap_or(16) as u64).collect(),
    };
    let steps = env_usize("FABRIC_SIM_SM_HOSTS_STEPS").unwrap_or(200);
    let gap = std::env::var_os("FABRIC_SIM_SM_HOSTS_REJOIN_WHILE_FENCED").is_some();
    let node_life = env_usize("FABRIC_SIM_SM_HOSTS_NODE_LIFE").map_or(1, |n| n as u32);
    let rt = runtime();
    let started = std::time::Instant::now();
    let keep_going = std::env::var_os("FABRIC_SIM_SM_HOSTS_KEEP_GOING").is_some();
    let mut failed: Vec<String> = Vec::new();
    let mut total = Stats::default();
    for seed in &seeds {
        match rt.block_on(run(*seed, steps, mutation, gap, node_life)) {
            Ok(s) => {
                total.steps += s.steps;
                total.released += s.released;
                total.active += s.active;
                total.fences += s.fences;
                total.restores += s.restores;
                total.restarts_beside_opensm += s.restarts_beside_opensm;
                total.failovers += s.failovers;
                total.host_set_incomplete += s.host_set_incomplete;
                total.node_restarts += s.node_restarts;
                total.node_restores += s.node_restores;
                total.node_rollbacks += s.node_rollbacks;
                total.withheld += s.withheld;
                total.rollbacks_while_standing += s.rollbacks_while_standing;
            }
            Err(e) if keep_going => {
                eprintln!("{}", e.lines().next().unwrap_or_default());
                failed.push(e);
            }
            Err(e) => panic!("{e}"),
        }
    }
    if let Some(first) = failed.first() {
        panic!(
            "{} of {} seeds failed ({:?}); the first:\n{first}",
            failed.len(),
            seeds.len(),
            started.elapsed()
        );
    }
    eprintln!(
        "{} schedules of {steps} steps, {HOSTS} SM hosts, {NODES} nodes: no violation ({:?}); {total:?}",
        seeds.len(),
        started.elapsed()
    );
    if seeds.len() >= 8 {
        assert!(
            total.released > 0 && total.active > 0,
            "nothing exercised: {total:?}"
        );
    }
}

/// Runs each of `seeds` (200 steps, no mutation; OpenSMs started on fenced hosts when
/// `rejoin_while_fenced`; the schedules they were found on, without node restarts) and panics
/// with the first failure.
fn assert_seeds_pass(seeds: &[u64], rejoin_while_fenced: bool) {
    let rt = runtime();
    for seed in seeds {
        if let Err(e) = rt.block_on(run(*seed, 200, Mutation::None, rejoin_while_fenced, 0)) {
            panic!("{e}");
        }
    }
}

/// The first seed (of `limit`) whose run the oracle fails under `mutation` (node restarts drawn
/// only for the mutation of the start check: the others' schedules stay as they were found).
fn first_failure(mutation: Mutation, limit: u64) -> Option<(u64, String)> {
    let rt = runtime();
    let life = u32::from(mutation == Mutation::SkipStartCheck);
    (1..=limit).find_map(|seed| {
        rt.block_on(run(seed, 200, mutation, false, life))
            .err()
            .map(|e| (seed, e))
    })
}

#[test]
fn the_oracle_catches_a_stale_endpoints_list_counted_complete() {
    let found = first_failure(Mutation::StaleEndpointsCount, 40);
    let (seed, e) = found.expect("no seed caught the stale endpoints list counted complete");
    eprintln!("stale endpoints counted complete: caught at {e}");
    assert!(e.contains("RELEASED"), "seed {seed}: {e}");
}

#[test]
fn the_oracle_catches_fencing_without_evidence() {
    let found = first_failure(Mutation::EvidenceLies, 40);
    let (seed, e) = found.expect("no seed caught fencing without evidence");
    eprintln!("fencing without evidence: caught at {e}");
    assert!(e.contains("RELEASED"), "seed {seed}: {e}");
}

/// Found by this simulation (issue 38, seed 1 with the OpenSM of a fenced host started): a
/// stored fence was decided once and never checked again, so a fenced host whose OpenSM runs
/// again (brought back while its peers could not reach its agent) stayed excused: a release was
/// RELEASED without it while its file held the key. Fixed: every fenced peer's evidence is
/// checked again at every round until the fence is lifted, a pull from it ends its excuse, and
/// a host a peer states fenced holds its sets back while its OpenSM is down. This runs the
/// schedules as the real system allows them: an OpenSM starts after its agent's catch-up
/// whether or not a peer holds the host fenced (`rejoin_while_fenced`).
#[test]
fn a_fenced_host_whose_opensm_runs_again_is_no_longer_excused() {
    assert_seeds_pass(&[1, 77, 297, 332, 412], true);
}

/// Found by this simulation (issue 38, seeds 60, 92, 124, 346): a fence was lifted when the
/// peer answered "caught up", which says it pulled every peer once, not that it holds what was
/// confirmed while it was fenced. Fixed: lifted only when the peer serves no set older than this
/// host's (held-back ones included).
#[test]
fn a_fence_is_lifted_only_once_the_peer_holds_what_was_confirmed_meanwhile() {
    assert_seeds_pass(&[60, 92, 124, 346, 176], false);
}

/// Found by this simulation (issue 38, seeds 339, 384): a whole-host restore of the one host
/// that acknowledged a release (its peers fenced) brought the key back: at its catch-up a peer
/// that had been fenced (so never got the release) served the node's older set, which confirmed
/// the restored record. Passes since no round takes or confirms a set from a peer that any
/// answering host holds fenced. Not closed in general: when no surviving host states the fence
/// (every record of it was on the restored host), nothing on the fabric side knows of the
/// release but the node (docs/SIMULATION.md, "Open findings").
#[test]
fn a_restore_of_the_only_host_that_acknowledged_a_release_keeps_it_released() {
    assert_seeds_pass(&[339, 384], false);
}

/// A node restored from a snapshot of the running node that skips its start check sends the
/// restored set at once: seed 93 (found by running the mutation over seeds 1..=100; the only
/// one of them) restores node0 to before its release of 0x0a01 was acknowledged by every SM
/// host, and the key is back on its port after RELEASED. With the start check the same seed
/// passes (the default run covers it whenever it runs 93 seeds or more; this test runs it).
#[test]
fn the_oracle_catches_a_node_start_without_the_start_check() {
    let rt = runtime();
    let caught = rt.block_on(run(93, 200, Mutation::SkipStartCheck, false, 1));
    let e = caught.expect_err("seed 93 without the start check passed");
    eprintln!("a node start without the start check: caught at {e}");
    assert!(e.contains("RELEASED"), "{e}");
    rt.block_on(run(93, 200, Mutation::None, false, 1))
        .expect("seed 93 with the start check");
}

/// Runs each of `seeds` with node snapshots and restarts at `times` their rate and panics with
/// the first failure.
fn assert_node_life_seeds_pass(seeds: &[u64], times: u32) {
    let rt = runtime();
    for seed in seeds {
        if let Err(e) = rt.block_on(run(*seed, 200, Mutation::None, false, times)) {
            panic!("{e}");
        }
    }
}

/// Found by this simulation (issue 40, `FABRIC_SIM_SM_HOSTS_NODE_LIFE=10`, seeds 287, 313,
/// 322, 439, 775; with `FABRIC_SIM_SM_HOSTS_REJOIN_WHILE_FENCED=1` also 91, 127, 129, 261, 277,
/// 314, 479): a rollback verdict withheld nothing while `STORE_ROLLED_BACK` stood, and it stood
/// from the store itself when the snapshot put back was taken after an earlier rollback was
/// raised and before that life's first acknowledgement. An attachment attached or confirmed in
/// that window was unmarked in the snapshot; released after it, it was sent again after the
/// restore (seed 322, step 30: node2's 0x0a03). Passes since a rollback found at start is raised
/// and marks once per life whether or not the condition stands (`runner::start`, e4e711e).
#[test]
fn a_rollback_found_while_the_restored_store_says_rolled_back_still_withholds() {
    // Two of the seeds (all five and the rejoin ones pass: docs/SIMULATION.md), to keep CI short.
    assert_node_life_seeds_pass(&[322, 287], 10);
}

/// Found by this simulation (issue 40, `FABRIC_SIM_SM_HOSTS_NODE_LIFE=10`, seed 820, step 64):
/// a release that left no trace on the fabric side. The snapshot held an attachment whose key
/// was never sent (node2's 0x0a01, attached again by the control plane while the start check
/// waited, so only removals went out); the lost life released it (RELEASED) and sent the same
/// set as before, within the generation block the snapshot had reserved: every host held what
/// the store recorded in `sending`, below its reservation, and `judge` had no evidence. Passes
/// since the ledger bounds every generation sent (`SentSet::through`, written before a send
/// above it) and a start after a lost life with a change unsent settles every attachment by
/// the first port read (`runner::start::withhold_unsent`, e4e711e).
#[test]
fn a_release_of_a_key_never_sent_is_seen_after_a_restore() {
    assert_node_life_seeds_pass(&[820], 10);
}
