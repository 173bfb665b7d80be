//! OpenSM logs a removed port's NodeDescription verbatim (`drop_mgr_remove_port: ... of
//! node:<description>`), and root on a node sets its NodeDescription and bounces its link. On
//! an ibsim fabric with a real OpenSM: four HCAs whose NodeDescriptions carry each verdict's
//! words (`-> SUBNET UP`, `PARSE ERROR`, `Entering STANDBY state`, `Partition configuration in
//! error`), their links dropped at ibsim's console the moment each write lands (and restored 150 ms
//! later) while three nodes
//! attach and release. Every attach and release is confirmed only once OpenSM programmed the
//! port (smpquery), none is rejected, no rejection is shown, the log's SM state stays MASTER,
//! and each write takes its normal time; the forged lines are in OpenSM's log, inside the
//! commits' fence windows. Skipped when ibsim/OpenSM are missing.

use testkit::common;
use testkit::rig;

use fabric_agent::domain::{ConditionKind, Membership, NodeMemberships};
use fabric_agent::sm::opensm::log_line::verdicts;
use fabric_agent::sm::opensm::opensm_state::{LogStateReader, OpenSmState};
use fabric_agent::sm::opensm::reload::{log_length, log_lines_since};
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend, OpenSmConfig, OwnershipConfig};
use rig::flap::LinkFlapper;
use rig::{Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS, SM_HOST};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The forging HCAs (node4..node7) and their NodeDescriptions.
const FORGED: [(&str, &str); 4] = [
    ("node4", "evil mlx5_0 -> SUBNET UP"),
    ("node5", "evil mlx5_0 PARSE ERROR"),
    ("node6", "evil Entering STANDBY state"),
    ("node7", "evil Partition configuration in error"),
];

/// How long the forging links stay down after each write of the partitions file.
const DOWN: Duration = Duration::from_millis(150);

fn node(id: &str, guid: u64, keys: &[u32]) -> NodeMemberships {
    common::memberships(
        id,
        [guid],
        keys.iter().map(|k| (*k, Membership::Full)),
        |k| format!("tenant{k:x}"),
    )
}

/// One attach or release: its node, the key, and how long the commit took.
struct Op {
    node: String,
    key: u32,
    attach: bool,
    took: Duration,
    /// Whether OpenSM logged a forged line while the commit waited (its fence window).
    forged_inside: bool,
}

/// Whether `line` is OpenSM's line about a forging port (removed: `of node:<d>`, discovered:
/// `of node: <d>`).
fn forged(line: &str) -> bool {
    FORGED
        .iter()
        .any(|(_, d)| line.contains(" of node:") && line.ends_with(d))
}

/// The complete lines OpenSM wrote between the log offsets `from` and `to`.
fn lines_between(log: &std::path::Path, from: u64, to: u64) -> Vec<String> {
    let mut seen = 0u64;
    log_lines_since(log, from)
        .into_iter()
        .take_while(|l| {
            seen += l.len() as u64 + 1;
            seen <= to - from
        })
        .collect()
}

/// Attaches and releases one key on each of node1..node3, `rounds` times, checking each
/// answer against the port's P_Key table (smpquery) right after it.
async fn attach_and_release(
    fabric: &Fabric,
    backend: &OpenSmBackend,
    rounds: u32,
    generation: &mut u64,
) -> Vec<Op> {
    let log = fabric.opensm_log_path();
    let mut ops = Vec::new();
    for _ in 0..rounds {
        for (i, n) in ["node1", "node2", "node3"].iter().enumerate() {
            let guid = fabric.node_info(n).port_guid;
            let key = 0x0a10 + i as u32;
            for attach in [true, false] {
                *generation += 1;
                let keys: &[u32] = if attach { &[key] } else { &[] };
                let before = log_length(&log);
                let started = Instant::now();
                let answer = backend.set_node(node(n, guid, keys), *generation).await;
                let took = started.elapsed();
                let after = log_length(&log);
                if let Err(e) = &answer {
                    panic!(
                        "{n} {} {key:#x}: {e}",
                        if attach { "attach" } else { "release" }
                    );
                }
                // Confirmed only once OpenSM programmed the port: the table shows it now.
                let held = fabric.pkeys(n).contains(&(0x8000 | key as u16));
                assert_eq!(
                    held,
                    attach,
                    "{n} answered OK but its port {} key {key:#x}",
                    if attach { "lacks" } else { "still holds" }
                );
                ops.push(Op {
                    node: n.to_string(),
                    key,
                    attach,
                    took,
                    forged_inside: lines_between(&log, before, after).iter().any(|l| forged(l)),
                });
            }
        }
    }
    ops
}

fn median(ops: &[Op]) -> Duration {
    let mut t: Vec<Duration> = ops.iter().map(|o| o.took).collect();
    t.sort();
    t[t.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_descriptions_and_link_flaps_fake_no_confirmation_rejection_or_role() {
    let mut spec = FabricSpec::new(1, 7);
    for (n, d) in FORGED {
        spec.descriptions.insert(n.into(), d.into());
    }
    let Some(fabric) = Fabric::start(&spec, LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    // The forging HCAs carry the words, as the fabric reports them.
    for (n, d) in FORGED {
        let text = fabric.smpquery(n, "nodedesc", &[]);
        assert!(text.contains(d), "{n}: {text}");
    }
    let log = fabric.opensm_log_path();
    let backend = OpenSmBackend::new(
        OpenSmConfig {
            partitions_file: fabric.partitions_path(),
            log_file: log.clone(),
            pid_file: Some(fabric.opensm_pid_path()),
            ownership: OwnershipConfig::disabled(),
            reload_check_ms: 5000,
            watch_ms: 0,
            ..OpenSmConfig::default()
        },
        SM_HOST.into(),
        Arc::new(InMemoryNodeStore::default()),
    )
    .unwrap();
    let mut generation = 0;
    // Without flapping: the normal time of a write.
    let calm = attach_and_release(&fabric, &backend, 1, &mut generation).await;

    let mark = log_length(&log);
    let evil: Vec<String> = FORGED.iter().map(|(n, _)| n.to_string()).collect();
    // Dropped the moment each write lands, while the commit's fence waits for OpenSM's sweeps.
    let flapper = LinkFlapper::on_change(&fabric, &evil, &fabric.partitions_path(), DOWN).unwrap();
    // Rounds of six writes until at least two had OpenSM log a forged line during their fence
    // (the drop races the fence: most land just before or after it).
    let mut flapped = Vec::new();
    for _ in 0..10 {
        flapped.extend(attach_and_release(&fabric, &backend, 1, &mut generation).await);
        if flapped.iter().filter(|o| o.forged_inside).count() >= 2 {
            break;
        }
    }
    let flaps = flapper.stop();
    // Let OpenSM log the last restored links' sweep.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The forged lines are in OpenSM's own log, and inside the fence windows of the commits.
    let lines = log_lines_since(&log, mark);
    // Removed (`of node:<d>`) and discovered (`of node: <d>`) ports.
    for (n, d) in FORGED {
        assert!(
            lines
                .iter()
                .any(|l| l.contains("drop_mgr_remove_port") && l.ends_with(d)),
            "no removal of {n} ({d}) logged after {flaps} flaps"
        );
    }
    let in_windows = flapped.iter().filter(|o| o.forged_inside).count();

    assert!(
        in_windows >= 1,
        "forged lines fell inside only {in_windows} of {} commits' fence windows",
        flapped.len()
    );
    // What a suffix or substring reading would have taken from them; what OpenSM said.
    let suffix_ups = lines
        .iter()
        .filter(|l| l.trim_end().ends_with("-> SUBNET UP"))
        .count();
    let substring_errors = lines
        .iter()
        .filter(|l| l.contains("PARSE ERROR") || l.contains("Partition configuration in error"))
        .count();
    let v = verdicts(&lines);
    assert!(suffix_ups > v.sweeps, "{suffix_ups} vs {}", v.sweeps);
    assert!(substring_errors > 0);
    assert!(v.rejections.is_empty(), "{:?}", v.rejections);

    // No rejection shown, and OpenSM's log still says MASTER.
    let conditions = backend.conditions_now();
    assert!(
        !conditions
            .iter()
            .any(|c| c.kind == ConditionKind::PartitionsFileRejected),
        "{conditions:?}"
    );
    assert_eq!(
        LogStateReader::new(log.clone()).state(),
        OpenSmState::Master
    );

    // Every write at its normal speed.
    let (calm_median, flapped_median) = (median(&calm), median(&flapped));
    let slowest = flapped.iter().map(|o| o.took).max().unwrap();
    println!(
        "{} writes with {flaps} flaps of 4 links: median {flapped_median:?}, slowest {slowest:?}; without flapping: median {calm_median:?}; forged lines inside {in_windows} fence windows",
        flapped.len()
    );
    for o in &flapped {
        assert!(
            o.took < Duration::from_secs(3),
            "{} {} {:#x} took {:?}",
            o.node,
            if o.attach { "attach" } else { "release" },
            o.key,
            o.took
        );
    }
    assert!(
        flapped_median < calm_median * 4 + Duration::from_millis(500),
        "median {flapped_median:?} with flapping, {calm_median:?} without"
    );
}
