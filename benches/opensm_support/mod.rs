//! What the OpenSM benches share: the SM-host backend on the rig's OpenSM, storms of
//! `set_node` calls, deadline-bounded waits that report `TIMEOUT ...` instead of hanging,
//! table checks by a fast SMP reader ([`tables`]), CPU and peak
//! RSS from /proc, and min/median/max of repeated runs.
//!
//! Included by each OpenSM bench next to the rig and the bench support:
//! `use testkit::rig;`, `mod support;` and `mod opensm_support;`.

#![allow(dead_code)] // each bench uses a part

pub mod tables;
pub use tables::TableReader;

use crate::rig::{Fabric, FabricSpec};
use crate::support::{cpu_seconds_of, try_memory};
use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::sm::opensm::{
    NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig, ReloadMethod,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The partitions file the benches start OpenSM with: the operator's part only.
pub const OPERATOR: &str = "# operator's part\nDefault=0x7fff, ipoib : ALL=limited, SELF=full;\n";

/// Starts a leaf-spine fabric of `hcas` HCAs (`per_leaf` end ports per leaf) with OpenSM and
/// prints its shape and start time; `None` (printed as skipped) without ibsim/OpenSM/the shim.
pub fn start_fabric(hcas: usize, per_leaf: usize) -> Option<Fabric> {
    let t = Instant::now();
    let Some(fabric) = Fabric::start(&FabricSpec::leaf_spine(hcas, per_leaf), OPERATOR) else {
        println!("skipped: ibsim/opensm or the umad2sim shim not installed");
        return None;
    };
    println!(
        "fabric: {hcas} HCAs + SM host, {} switches ({per_leaf} end ports per leaf); ibsim + OpenSM up (SUBNET UP) in {}",
        fabric.spec().switches,
        secs(t.elapsed())
    );
    Some(fabric)
}

/// The runtime the backend runs on: 2 workers, as on the 2-core machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A failed wait or check: one line starting with `TIMEOUT` or `FAILED`.
pub type Check<T> = Result<T, String>;

/// Seconds with three decimals.
pub fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// The SM host's backend on the rig's OpenSM (SIGHUP reload; the re-read is watched for up to
/// 30 s, above one heavy sweep of the largest fabric ibsim accepts).
pub fn backend(
    fabric: &Fabric,
    group_commit: bool,
    store: Arc<dyn NodeMembershipStore>,
) -> OpenSmBackend {
    let config = OpenSmConfig {
        partitions_file: fabric.partitions_path(),
        log_file: fabric.opensm_log_path(),
        pid_file: Some(fabric.opensm_pid_path()),
        reload: ReloadMethod::Sighup,
        reload_check_ms: 30_000,
        group_commit,
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    };
    OpenSmBackend::new(config, crate::rig::SM_HOST.into(), store).expect("backend")
}

/// A node's desired set: its one port in `key` (none when `key` is None).
pub fn set_of(node: &str, guid: u64, key: Option<PKey>) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse(node).unwrap(),
        port_guids: vec![Guid(guid)],
        keys: key
            .map(|k| {
                (
                    k,
                    KeySetting {
                        membership: Membership::Full,
                        name: format!("t{:x}", k.base()),
                        ports: None,
                    },
                )
            })
            .into_iter()
            .collect(),
    }
}

/// What one port's table must show: `lid` holds `has` (full member) and lacks `lacks` (as
/// either member).
#[derive(Debug, Clone)]
pub struct Want {
    /// The port's LID.
    pub lid: u16,
    /// A key the port must hold as a full member.
    pub has: Option<PKey>,
    /// A key the port must not hold.
    pub lacks: Option<PKey>,
}

impl Want {
    fn met_by(&self, table: &[u16]) -> bool {
        self.has
            .is_none_or(|k| table.contains(&k.value(Membership::Full).0))
            && self
                .lacks
                .is_none_or(|k| !table.iter().any(|v| v & 0x7fff == k.base()))
    }
}

/// Sends every set (one task each) and waits for every answer, up to `deadline`: all at once,
/// or with the calls' starts spread evenly over `spread` (call i starts at i * spread / n), as
/// calls from many nodes arrive. Returns the time until the last answer and the failures
/// (count, first error).
pub fn storm(
    rt: &tokio::runtime::Runtime,
    backend: &OpenSmBackend,
    sets: Vec<NodeMemberships>,
    generation: u64,
    deadline: Duration,
    spread: Duration,
) -> Check<(Duration, usize, Option<String>)> {
    let n = sets.len();
    let start = Instant::now();
    let results = rt.block_on(async {
        let begin = tokio::time::Instant::now();
        let tasks: Vec<_> = sets
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let b = backend.clone();
                let at = begin + spread.mul_f64(i as f64 / n.max(1) as f64);
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    b.set_node(m, generation).await
                })
            })
            .collect();
        tokio::time::timeout(deadline, async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("set_node task"));
            }
            out
        })
        .await
    });
    let results = results.map_err(|_| {
        format!(
            "TIMEOUT: {n} Partitions calls not all answered within {}",
            secs(deadline)
        )
    })?;
    let replied = start.elapsed();
    let failed = results.iter().filter(|r| r.is_err()).count();
    let first = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .map(|e| e.to_string());
    Ok((replied, failed, first))
}

/// Polls the ports' tables with `reader` (each poll re-reads only the ports not yet right)
/// until every want is met; returns when, counted from `since`, and how many polls it took.
/// (A whole-fabric `saquery PKTR` returns only a couple of records on ibsim at 500 HCAs, so
/// the SA is not used.)
pub fn wait_tables(
    reader: &mut TableReader,
    wants: &[Want],
    since: Instant,
    deadline: Duration,
) -> Check<(Duration, usize)> {
    let start = Instant::now();
    let mut polls = 0;
    let mut unmet: Vec<&Want> = wants.iter().collect();
    loop {
        polls += 1;
        let lids: Vec<u16> = unmet.iter().map(|w| w.lid).collect();
        let tables = reader.read(&lids)?;
        unmet = unmet
            .into_iter()
            .zip(&tables)
            .filter(|(w, t)| !t.as_ref().is_ok_and(|t| w.met_by(t)))
            .map(|(w, _)| w)
            .collect();
        if unmet.is_empty() {
            return Ok((since.elapsed(), polls));
        }
        if start.elapsed() > deadline {
            return Err(format!(
                "TIMEOUT: {} of {} ports' tables not right after {} ({polls} polls)",
                unmet.len(),
                wants.len(),
                secs(deadline)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One full verification pass: every port at `lids` read once. Fails when a port does not
/// answer.
pub fn read_pass(reader: &mut TableReader, lids: &[u16]) -> Check<Duration> {
    let start = Instant::now();
    let tables = reader.read(lids)?;
    if let Some((lid, Err(e))) = lids.iter().zip(&tables).find(|(_, t)| t.is_err()) {
        return Err(format!("FAILED: reading the table at LID {lid}: {e}"));
    }
    Ok(start.elapsed())
}

/// One heavy sweep of the unchanged fabric: SIGHUP to OpenSM, until its log shows the next
/// `SUBNET UP`.
pub fn heavy_sweep(fabric: &Fabric, deadline: Duration) -> Check<Duration> {
    let offset = fabric.opensm_log().len();
    let start = Instant::now();
    fabric.hup_opensm();
    loop {
        if fabric
            .opensm_log()
            .get(offset..)
            .is_some_and(|t| t.contains("SUBNET UP"))
        {
            return Ok(start.elapsed());
        }
        if start.elapsed() > deadline {
            return Err(format!(
                "TIMEOUT: no SUBNET UP within {} of a SIGHUP\n{}",
                secs(deadline),
                crate::rig::logs_of(fabric.dir())
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CPU seconds and peak RSS (kB) of this process and of OpenSM, over a span started by
/// [`Usage::start`] (which resets both peaks through `/proc/<pid>/clear_refs`).
pub struct Usage {
    opensm: u32,
    cpu_self: f64,
    cpu_opensm: f64,
}

impl Usage {
    /// Starts a span.
    pub fn start(opensm: u32) -> Usage {
        for pid in ["self".to_owned(), opensm.to_string()] {
            // "5" resets the peak RSS (VmHWM) to the current RSS.
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
        Usage {
            opensm,
            cpu_self: cpu_seconds_of("self"),
            cpu_opensm: cpu_seconds_of(&opensm.to_string()),
        }
    }

    /// "SM-host backend X CPU s, peak RSS Y MB; OpenSM ...".
    pub fn report(&self) -> String {
        let peak = |pid: u32| try_memory(pid).map_or(0.0, |(_, hwm)| hwm as f64 / 1024.0);
        format!(
            "CPU s / peak RSS MB: SM-host backend (this process) {:.2} / {:.1}, OpenSM {:.2} / {:.1}",
            cpu_seconds_of("self") - self.cpu_self,
            peak(std::process::id()),
            cpu_seconds_of(&self.opensm.to_string()) - self.cpu_opensm,
            peak(self.opensm),
        )
    }
}

/// Prints `label: min / median / max` of `values` (seconds) over the runs.
pub fn summary(label: &str, values: &[f64]) {
    summary_in(label, values, " s");
}

/// Prints `label: min / median / max` of `values` (ratios, `x`) over the runs.
pub fn summary_ratio(label: &str, values: &[f64]) {
    summary_in(label, values, "x");
}

fn summary_in(label: &str, values: &[f64], unit: &str) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        println!("{label}: no runs");
        return;
    }
    println!(
        "{label}: min {:.3} / median {:.3} / max {:.3}{unit} over {} runs",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1],
        v.len()
    );
}

/// Ends the bench: on a failed check prints its line, stops the fabric (by pid, through its
/// drop) and exits 1.
pub fn finish(fabric: Fabric, result: Check<()>) {
    if let Err(line) = result {
        println!("{line}");
        drop(fabric);
        std::process::exit(1);
    }
}
