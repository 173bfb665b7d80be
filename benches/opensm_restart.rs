//! A restart of the SM-host backend on the daemon's real store: `--nodes` (default 2000) node sets
//! stored in a redb file (`fabric_agent::store::Store` through the daemon's `StoredSmNodes`
//! adapter, in a temp dir), then per restart: open the store, build the backend (it loads
//! every stored set), send one node's new set, until that write is confirmed (written in the
//! region with all the others, OpenSM seen re-reading it). On an ibsim fabric of `--nodes` HCAs
//! with a real OpenSM. `--runs` (default 3) restarts; min/median/max.
//!
//! Run: `cargo bench --bench opensm_restart` (needs ibsim-utils, opensm).

mod opensm_support;
use testkit::rig;
mod support;

use fabric_agent::daemon::StoredSmNodes;
use fabric_agent::domain::PKey;
use fabric_agent::sm::opensm::{NodeMembershipStore, StoredNode};
use fabric_agent::store::Store;
use opensm_support::{backend, finish, secs, set_of, storm, summary, Check};
use rig::Fabric;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::arg_usize;

/// Events the store keeps (the daemon's lowest accepted bound).
const RETAIN: u64 = 1000;

fn open_store(path: &Path) -> Check<Arc<Store>> {
    Store::open(path, RETAIN)
        .map(Arc::new)
        .map_err(|e| format!("FAILED: opening {}: {e}", path.display()))
}

fn restart(
    rt: &tokio::runtime::Runtime,
    fabric: &Fabric,
    path: &Path,
    stored: &[StoredNode],
    r: usize,
) -> Check<(f64, f64)> {
    let t = Instant::now();
    let store = open_store(path)?;
    let opened = t.elapsed();
    let b = {
        let _enter = rt.enter();
        backend(fabric, true, Arc::new(StoredSmNodes(store)))
    };
    let loaded = t.elapsed();
    let first = &stored[0].memberships;
    let key = PKey::new(0x0800 + r as u32).expect("key");
    let set = set_of(first.node_id.as_str(), first.port_guids[0].0, Some(key));
    let (_, failed, err) = storm(
        rt,
        &b,
        vec![set],
        1 + r as u64,
        Duration::from_secs(120),
        Duration::ZERO,
    )?;
    if failed > 0 {
        return Err(format!("FAILED: first write after restart: {err:?}"));
    }
    let took = t.elapsed();
    println!(
        "restart {r}: store opened in {}, backend built ({} stored sets loaded) after {}, first confirmed write after {}",
        secs(opened),
        stored.len(),
        secs(loaded),
        secs(took)
    );
    Ok((loaded.as_secs_f64(), took.as_secs_f64()))
}

fn main() {
    let nodes = arg_usize("--nodes", 2000);
    let runs = arg_usize("--runs", 3);
    let Some(fabric) = opensm_support::start_fabric(nodes, arg_usize("--per-leaf", 47)) else {
        return;
    };
    let ports = fabric.ports();
    let stored: Vec<StoredNode> = fabric
        .hcas()
        .iter()
        .enumerate()
        .map(|(i, n)| {
            StoredNode::new(
                set_of(
                    n,
                    ports[n].0,
                    Some(PKey::new(0x0100 + (i / 8) as u32).expect("key")),
                ),
                1,
            )
        })
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("opensm-restart-")
        .tempdir()
        .expect("temp dir");
    let path = dir.path().join("state.redb");
    let rt = opensm_support::runtime();
    let mut loads = Vec::new();
    let mut times = Vec::new();
    let result = open_store(&path)
        .and_then(|store| {
            let t = Instant::now();
            StoredSmNodes(store)
                .put_group(&stored, None)
                .map_err(|e| format!("FAILED: storing the node sets: {e}"))?;
            println!(
                "{} node sets stored in one transaction in {}",
                stored.len(),
                secs(t.elapsed())
            );
            Ok(())
        })
        .and_then(|()| {
            (1..=runs).try_for_each(|r| {
                let (loaded, took) = restart(&rt, &fabric, &path, &stored, r)?;
                loads.push(loaded);
                times.push(took);
                Ok(())
            })
        });
    summary("store opened + backend built (sets loaded)", &loads);
    summary("store opened -> first confirmed write", &times);
    finish(fabric, result);
}
