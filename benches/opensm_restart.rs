//! A restart of the SM-host backend holding NODES (default 2000) stored node sets: time from
//! building the backend (it loads every stored set) to its first confirmed write (one node's
//! new set written in the region with all the others, OpenSM seen re-reading it), on an ibsim
//! fabric of NODES HCAs with a real OpenSM. RUNS (default 3) restarts; min/median/max.
//! The store is the in-memory one (the daemon's redb adapter is private to the agent), so redb's
//! load time is not included.
//!
//! Run: `cargo bench --bench opensm_restart` (needs ibsim-utils, opensm).

mod opensm_support;
#[path = "../tests/rig/mod.rs"]
mod rig;
mod support;

use fabric_agent::domain::PKey;
use fabric_agent::sm::opensm::{InMemoryNodeStore, NodeMembershipStore, StoredNode};
use opensm_support::{backend, env_usize, finish, secs, set_of, storm, summary, Check};
use rig::{Fabric, FabricSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPERATOR: &str = "# operator's part\nDefault=0x7fff, ipoib : ALL=limited, SELF=full;\n";

fn restart(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    stored: &[StoredNode],
    r: usize,
) -> Check<f64> {
    let store = Arc::new(InMemoryNodeStore::default());
    store
        .put_group(stored, None)
        .map_err(|e| format!("FAILED: {e}"))?;
    let t = Instant::now();
    let b = {
        let _enter = rt.enter();
        backend(fabric, true, store)
    };
    let loaded = t.elapsed();
    let first = &stored[0].memberships;
    let key = PKey::new(0x0800 + r as u32).expect("key");
    let set = set_of(first.node_id.as_str(), first.port_guids[0].0, Some(key));
    let (_, failed, err) = storm(rt, &b, vec![set], 1 + r as u64, Duration::from_secs(120))?;
    if failed > 0 {
        return Err(format!("FAILED: first write after restart: {err:?}"));
    }
    let took = t.elapsed();
    println!(
        "restart {r}: {} stored sets loaded in {}, first confirmed write after {}",
        stored.len(),
        secs(loaded),
        secs(took)
    );
    Ok(took.as_secs_f64())
}

fn main() {
    let nodes = env_usize("NODES", 2000);
    let runs = env_usize("RUNS", 3);
    let Some(fabric) = Fabric::start(&FabricSpec::leaf_spine(nodes, 47), OPERATOR) else {
        println!("skipped: ibsim/opensm or the umad2sim shim not installed");
        return;
    };
    let ports = fabric.ports();
    let stored: Vec<StoredNode> = fabric
        .hcas()
        .iter()
        .enumerate()
        .map(|(i, n)| StoredNode {
            memberships: set_of(
                n,
                ports[n].0,
                Some(PKey::new(0x0100 + (i / 8) as u32).expect("key")),
            ),
            generation: 1,
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut times = Vec::new();
    let result = (1..=runs).try_for_each(|r| {
        times.push(restart(&rt, &fabric, &stored, r)?);
        Ok(())
    });
    summary("restart to first confirmed write", &times);
    finish(fabric, result);
}
