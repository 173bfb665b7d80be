//! End to end on an ibsim fabric with a real OpenSM: an SM-host agent (`backend = "opensm"`)
//! and node agents (`backend = "remote"`), every one with the SMP observer under the umad2sim
//! shim, driven only through the public gRPC API and cross-checked with `smpquery`/`saquery`.
//! Skipped (with a message) when ibsim/OpenSM or the shim are not installed.
//!
//! The operator's file makes every port a *limited* member of the default partition (the SM's
//! own port full): limited members cannot talk to each other, so the default partition gives
//! two tenant ports no path, and the SA's PathRecords show exactly which ports share a tenant
//! partition. With the rig's usual `ALL=full` default, every pair of ports would have a path
//! through P_Key 0xffff and the isolation checks would prove nothing.

use testkit::common;
use testkit::rig;

use common::{
    assert_gap_free, attach, attach_now, events, free_port, get, has_base, node, partition,
    release, state, wait_attachment, wait_state, CONVERGE,
};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::event::Kind;
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::region::{BEGIN_MARKER, END_MARKER};
use rig::agents::{node_config, sm_config, Agent};
use rig::{Fabric, FabricSpec};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Code;

/// The operator's file: tenant ports are limited members of the default partition.
const OPERATOR: &str = "# operator's partitions: kept byte for byte\n\
Default=0x7fff : ALL=limited, SELF=full ;\n\
storage=0x0100, ipoib : ALL_SWITCHES=full, SELF=full ;\n";

/// The SM-host agent plus agents on `nodes`, all started.
fn start_agents(fabric: &Fabric, nodes: &[&str]) -> (u16, Agent, Vec<Agent>) {
    let port = free_port();
    let sm = Agent::start(fabric, rig::SM_HOST, &sm_config(fabric, port));
    let agents = nodes
        .iter()
        .map(|n| Agent::start(fabric, n, &node_config(fabric, n, port)))
        .collect();
    (port, sm, agents)
}

fn limited(instance: &str, p: pb::Partition, wait_ms: Option<u32>) -> pb::AttachPartitionRequest {
    pb::AttachPartitionRequest {
        membership: pb::Membership::Limited as i32,
        ..attach(instance, p, wait_ms)
    }
}

/// Checks one agent's whole event log: seq gap-free from 1, every attachment's
/// AttachmentChanged events a continuous chain (each `from` is the previous `to`, the first from
/// UNSPECIFIED), no event repeated, and each chain ending in the attachment's current state.
/// Returns the log.
async fn check_history(agent: &Agent) -> Vec<pb::Event> {
    let mut c = agent.client().await;
    let log = events(&mut c, 0).await;
    assert_gap_free(&log);
    let mut last: HashMap<String, (i32, String)> = HashMap::new();
    for e in &log {
        assert_eq!(e.node_id, agent.node, "event of another node: {e:?}");
        if let Some(Kind::AttachmentChanged(ch)) = &e.kind {
            let prev = last.insert(ch.instance_id.clone(), (ch.to, ch.reason.clone()));
            let prev_to = prev.as_ref().map(|p| p.0).unwrap_or(0);
            assert_eq!(
                ch.from, prev_to,
                "{}: {} history broken at seq {}: {ch:?}",
                agent.node, ch.instance_id, e.seq
            );
            assert!(
                prev != Some((ch.to, ch.reason.clone())) || ch.from != ch.to,
                "{}: duplicate event at seq {}: {ch:?}",
                agent.node,
                e.seq
            );
        }
    }
    let list = c
        .list_attachments(pb::ListAttachmentsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .attachments;
    for a in &list {
        let (to, _) = last
            .get(&a.instance_id)
            .unwrap_or_else(|| panic!("{}: no events for {}", agent.node, a.instance_id));
        assert_eq!(
            *to, a.state,
            "{}: history of {} ends elsewhere",
            agent.node, a.instance_id
        );
    }
    assert_eq!(
        list.len(),
        last.len(),
        "{}: events for unknown attachments",
        agent.node
    );
    log
}

/// Asserts the log shows `key` leaving a port (PKeyTableChanged) before `instance` went
/// RELEASED: the agent waited for the observer, not for the subnet manager's word.
fn assert_released_after_drop(log: &[pb::Event], instance: &str, key: u32) {
    let seq_of = |found: &dyn Fn(&Kind) -> bool| {
        log.iter()
            .find(|e| e.kind.as_ref().is_some_and(found))
            .map(|e| e.seq)
    };
    let dropped = seq_of(&|k| matches!(k, Kind::PkeyTableChanged(p) if p.removed.contains(&key)))
        .unwrap_or_else(|| panic!("no event of a port dropping {key:#x}: {log:?}"));
    let released = seq_of(&|k| {
        matches!(k, Kind::AttachmentChanged(a)
            if a.instance_id == instance && a.to == pb::AttachmentState::Released as i32)
    })
    .unwrap_or_else(|| panic!("no event of {instance} RELEASED: {log:?}"));
    assert!(
        dropped < released,
        "{instance} RELEASED (seq {released}) before {key:#x} left the port (seq {dropped})"
    );
}

/// The operator's parts of a partitions file: before BEGIN and after END (the whole file when
/// there is no region).
fn operator_parts(text: &str) -> (String, String) {
    let Some(begin) = text.find(&format!("{BEGIN_MARKER}\n")) else {
        return (text.to_owned(), String::new());
    };
    let end_line = format!("{END_MARKER}\n");
    let end = text[begin..]
        .find(&end_line)
        .map(|i| begin + i + end_line.len())
        .unwrap_or_else(|| panic!("BEGIN without END:\n{text}"));
    (text[..begin].to_owned(), text[end..].to_owned())
}

fn assert_opensm_never_rejected(fabric: &Fabric) {
    let log = fabric.opensm_log();
    for bad in ["PARSE ERROR", "Partition configuration in error"] {
        assert!(!log.contains(bad), "OpenSM logged {bad:?}:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_partition_connects_two_nodes_isolates_the_third_and_release_drops_the_key() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(2, 4), OPERATOR) else {
        return;
    };
    let started = Instant::now();
    let (_, mut sm, mut agents) = start_agents(&fabric, &["node1", "node2", "node3"]);
    let mut c1 = agents[0].client().await;
    let mut c2 = agents[1].client().await;
    let mut c3 = agents[2].client().await;
    let pa = || partition("ibpart_a", 0x0a12);
    for c in [&mut c1, &mut c2, &mut c3] {
        assert_eq!(node(c).await.observer, "smp");
    }

    // 1. node1 and node2 share partition a; node3 is in partition b.
    for (c, instance) in [(&mut c1, "i-1"), (&mut c2, "i-2")] {
        let a = attach_now(c, attach(instance, pa(), Some(20_000))).await;
        assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
        assert_eq!(a.pkey_value, 0x8a12);
    }
    let a3 = attach_now(
        &mut c3,
        attach("i-3", partition("ibpart_b", 0x0b21), Some(20_000)),
    )
    .await;
    assert_eq!(state(&a3), pb::AttachmentState::Active, "{a3:?}");
    assert!(fabric.pkeys("node1").contains(&0x8a12));
    assert!(fabric.pkeys("node2").contains(&0x8a12));
    assert!(fabric.pkeys("node3").contains(&0x8b21));
    assert!(!has_base(&fabric.pkeys("node3"), 0x0a12));
    let lid = |n: &str| fabric.port_info(n).lid;
    let (l1, l2, l3) = (lid("node1"), lid("node2"), lid("node3"));
    assert_eq!(fabric.path_pkey("node1", l1, l2), Some(0x8a12));
    assert_eq!(fabric.path_pkey("node2", l2, l1), Some(0x8a12));
    for (from, src, dst) in [("node3", l3, l1), ("node3", l3, l2), ("node1", l1, l3)] {
        assert_eq!(
            fabric.path_pkey(from, src, dst),
            None,
            "node3 shares no partition with node1/node2 (LID {src} -> {dst})"
        );
    }

    // 2. A partition of another fabric is refused and leaves nothing behind.
    let other = pb::Partition {
        fabric: "fab2".into(),
        ..partition("ibpart_x", 0x0a14)
    };
    let err = c3
        .attach_partition(attach("i-x", other, Some(1000)))
        .await
        .expect_err("another fabric's partition");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let missing = c3
        .get_attachment(pb::GetAttachmentRequest {
            instance_id: "i-x".into(),
        })
        .await
        .expect_err("nothing was created");
    assert_eq!(missing.code(), Code::NotFound);
    // Limited membership reaches the port as the limited key (node3's port carries one
    // partition at a time: i-3 is released first).
    let r = release(&mut c3, "i-3", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    assert!(!has_base(&fabric.pkeys("node3"), 0x0b21));
    let l = attach_now(
        &mut c3,
        limited("i-3l", partition("ibpart_c", 0x0a13), Some(20_000)),
    )
    .await;
    assert_eq!(state(&l), pb::AttachmentState::Active, "{l:?}");
    assert_eq!(l.pkey_value, 0x0a13);
    let t3 = fabric.pkeys("node3");
    assert!(t3.contains(&0x0a13) && !t3.contains(&0x8a13), "{t3:x?}");

    // 3. node1's instance is terminated: RELEASED only once node1's port dropped the key.
    let r = release(&mut c1, "i-1", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    let t1 = fabric.pkeys("node1");
    assert!(
        !has_base(&t1, 0x0a12),
        "RELEASED while node1 still holds the key: {t1:x?}"
    );
    assert_eq!(
        state(&get(&mut c2, "i-2").await),
        pb::AttachmentState::Active
    );
    assert!(fabric.pkeys("node2").contains(&0x8a12));
    assert_eq!(fabric.path_pkey("node2", l2, l1), None);
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert_eq!(
        operator_parts(&text),
        (OPERATOR.to_owned(), String::new()),
        "{text}"
    );
    assert_opensm_never_rejected(&fabric);

    let mut logs = Vec::new();
    for agent in agents.iter().chain([&sm]) {
        logs.push(check_history(agent).await);
    }
    assert_released_after_drop(&logs[0], "i-1", 0x8a12);
    stop_all(&mut agents, &mut sm);
    assert_only_opensm_litter(&fabric);
    eprintln!("scenarios 1-3 took {:?}", started.elapsed());
}

/// A node agent, the SM-host agent and OpenSM are SIGKILLed mid-flow and restarted in an
/// awkward order (the SM-host agent before OpenSM, a release issued while no SM runs): every
/// attachment converges, the SM host still holds every node's set, and each agent's event log
/// is gap-free with continuous per-attachment histories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_opensm_killed_mid_flow_converge_without_losing_events() {
    let Some(mut fabric) = Fabric::start(&FabricSpec::new(2, 4), OPERATOR) else {
        return;
    };
    let started = Instant::now();
    let (port, mut sm, mut agents) = start_agents(&fabric, &["node1", "node2", "node3", "node4"]);
    let pa = || partition("ibpart_a", 0x0a12);
    let pb_ = || partition("ibpart_b", 0x0b21);
    {
        let mut c1 = agents[0].client().await;
        let mut c2 = agents[1].client().await;
        for (c, instance) in [(&mut c1, "i-1"), (&mut c2, "i-2")] {
            let a = attach_now(c, attach(instance, pa(), Some(20_000))).await;
            assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
        }
    }

    // node4's agent crashes (SIGKILL) right after acknowledging an attach; the SM-host agent
    // crashes while node3 asks for a partition; node3 asks again while no SM host runs. (Each
    // node's one port carries one partition at a time; an ibsim fabric takes 9 clients, so
    // node1's agent stays up.)
    let mut c4 = agents[3].client().await;
    attach_now(&mut c4, attach("i-5", partition("ibpart_d", 0x0d44), None)).await;
    agents[3].crash();
    let mut c2 = agents[1].client().await;
    let mut c3 = agents[2].client().await;
    attach_now(&mut c3, attach("i-3", pb_(), None)).await;
    sm.crash();
    let a = attach_now(&mut c3, attach("i-4", pb_(), Some(1500))).await;
    assert_ne!(state(&a), pb::AttachmentState::Active, "no SM host: {a:?}");
    // The node reports why it is stuck.
    wait_attachment(&mut c3, "i-4", "a reason", CONVERGE, |a| {
        !a.reason.is_empty()
    })
    .await;

    // OpenSM crashes too (SIGKILL); the SM-host agent comes back first (it cannot signal
    // OpenSM yet).
    fabric.stop_opensm(true);
    sm.spawn(&fabric);
    // node1's instance is terminated while no SM runs: the key stays on the port, so the
    // attachment must stay RELEASING.
    let mut c1 = agents[0].client().await;
    assert_eq!(
        state(&get(&mut c1, "i-1").await),
        pb::AttachmentState::Active
    );
    let r = release(&mut c1, "i-1", Some(2000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Releasing, "{r:?}");
    assert!(fabric.pkeys("node1").contains(&0x8a12));
    agents[3].spawn(&fabric);
    let mut c4 = agents[3].client().await;
    // The control plane resyncs on node4's new epoch (an unclean stop) and sends again the
    // attach of every instance it wants that is not ACTIVE: i-5's attach was committed and
    // perhaps not yet sent when the agent died, and the node withholds such an attach until
    // then (a copy of the running node looks the same: docs/TRUTH-RULES.md, the start check).
    attach_now(&mut c4, attach("i-5", partition("ibpart_d", 0x0d44), None)).await;
    // (i-3 and i-5 may have reached OpenSM before the crashes; i-4 cannot have.)
    assert_ne!(
        state(&get(&mut c3, "i-4").await),
        pb::AttachmentState::Active
    );

    // OpenSM restarts: everything converges.
    fabric.restart_opensm();
    wait_state(&mut c1, "i-1", pb::AttachmentState::Released, CONVERGE).await;
    wait_state(&mut c4, "i-5", pb::AttachmentState::Active, CONVERGE).await;
    assert!(fabric.pkeys("node4").contains(&0x8d44));
    assert!(!has_base(&fabric.pkeys("node1"), 0x0a12));
    wait_state(&mut c3, "i-3", pb::AttachmentState::Active, CONVERGE).await;
    wait_state(&mut c3, "i-4", pb::AttachmentState::Active, CONVERGE).await;
    assert_eq!(
        state(&get(&mut c2, "i-2").await),
        pb::AttachmentState::Active
    );
    let t2 = fabric.pkeys("node2");
    assert!(t2.contains(&0x8a12) && !has_base(&t2, 0x0b21), "{t2:x?}");
    assert!(fabric.pkeys("node3").contains(&0x8b21));
    let lid = |n: &str| fabric.port_info(n).lid;
    let (l1, l2, l3) = (lid("node1"), lid("node2"), lid("node3"));
    assert_eq!(fabric.path_pkey("node2", l2, l3), None);
    assert_eq!(fabric.path_pkey("node2", l2, l1), None);
    // The SM-host agent restarted with the nodes' sets intact: node3's status is healthy.
    let n3 = node(&mut c3).await;
    let smst = n3.subnet_manager.expect("sm status");
    assert!(smst.reachable && smst.last_error.is_empty(), "{smst:?}");
    // The SM host holds every node's current set: node1 none, node2 a, node3 b, node4 d.
    let mut partitions = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the SM-host agent");
    for (n, expected) in [
        ("node1", vec![]),
        ("node2", vec![0x0a12]),
        ("node3", vec![0x0b21]),
        ("node4", vec![0x0d44]),
    ] {
        let held = partitions
            .get_node_memberships(smpb::GetNodeMembershipsRequest { node_id: n.into() })
            .await
            .unwrap_or_else(|e| panic!("{n}: {e:?}"))
            .into_inner();
        let mut keys: Vec<u32> = held.keys.iter().map(|k| k.pkey).collect();
        keys.sort_unstable();
        assert_eq!(keys, expected, "{n}: {held:?}");
        assert!(held.keys.iter().all(|k| k.full), "{held:?}");
    }

    let node1_log = check_history(&agents[0]).await;
    assert_released_after_drop(&node1_log, "i-1", 0x8a12);
    for agent in agents[1..].iter().chain([&sm]) {
        check_history(agent).await;
    }
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert_eq!(operator_parts(&text).0, OPERATOR, "{text}");
    assert_opensm_never_rejected(&fabric);
    stop_all(&mut agents, &mut sm);
    // Litter: the running OpenSM's, the crashed OpenSM's and the two crashed agents'.
    let litter = fabric.shim_litter();
    assert!(
        litter.contains(&format!("sys-{}", fabric.opensm_pid())),
        "{litter:?}"
    );
    assert_eq!(litter.len(), 4, "{litter:?}");
    eprintln!("scenario 4 took {:?}", started.elapsed());
}

/// A sampler of the partitions file while agents edit it: every version it sees must parse,
/// hold a partition entry and keep the operator's parts byte for byte.
struct FileSampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl FileSampler {
    fn start(path: std::path::PathBuf, head: String, tail: String) -> FileSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut samples, mut bad) = (0, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                samples += 1;
                if parse(text.as_bytes())
                    .map(|c| c.entries.is_empty())
                    .unwrap_or(true)
                {
                    bad.push(format!("unloadable or entry-less file:\n{text}"));
                } else if operator_parts(&text) != (head.clone(), tail.clone()) {
                    bad.push(format!("operator's part changed:\n{text}"));
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            (samples, bad)
        });
        FileSampler { stop, handle }
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("sampler")
    }
}

/// The operator's parts around the region stay byte for byte through 200 Partitions edits and
/// attach/release cycles (sampled continuously), OpenSM never rejects a file, the file keeps
/// loading when everything is released; a broken operator file is refused (nothing written,
/// the node reports the offending line) until the operator fixes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_part_survives_hundreds_of_edits_and_a_broken_file_is_refused() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(2, 4), OPERATOR) else {
        return;
    };
    let started = Instant::now();
    let (port, mut sm, mut agents) = start_agents(&fabric, &["node1"]);
    let mut c1 = agents[0].client().await;
    let a = attach_now(
        &mut c1,
        attach("i-0", partition("ibpart_a", 0x0a12), Some(20_000)),
    )
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");

    // The operator adds a part after the agent's region too (temp file + rename, SIGHUP).
    const TAIL: &str = "# operator's trailing part\nbackup=0x0101 : SELF=full ;\n";
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert_eq!(
        operator_parts(&text),
        (OPERATOR.to_owned(), String::new()),
        "{text}"
    );
    fabric.set_partitions(&format!("{text}{TAIL}"));
    let sampler = FileSampler::start(fabric.partitions_path(), OPERATOR.into(), TAIL.into());

    // 5. Hundreds of edits: node4's set replaced 200 times through the Partitions service
    // (every tenth generation empty), plus attach/release cycles through node1's agent.
    let node4 = format!("0x{:016x}", fabric.node_info("node4").port_guid);
    let mut partitions = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the SM-host agent");
    let keys_of = |g: u64| -> Vec<smpb::KeyMembership> {
        if g % 10 == 0 {
            return Vec::new();
        }
        vec![
            smpb::KeyMembership {
                pkey: 0x0c00 + (g % 5) as u32,
                full: true,
                name: format!("bulk{}", g % 5),
                port_guids: Vec::new(),
            },
            smpb::KeyMembership {
                pkey: 0x0d00 + (g % 3) as u32,
                full: false,
                name: String::new(),
                port_guids: Vec::new(),
            },
        ]
    };
    let edits = Instant::now();
    let mut sweeps = 0;
    for g in 1..=200u64 {
        let r = partitions
            .set_node_memberships(smpb::SetNodeMembershipsRequest {
                memberships: Some(smpb::NodeMemberships {
                    node_id: "node4".into(),
                    port_guids: vec![node4.clone()],
                    keys: keys_of(g),
                    generation: g,
                    grants: Vec::new(),
                }),
            })
            .await
            .unwrap_or_else(|e| panic!("generation {g}: {e:?}"))
            .into_inner();
        // One request at a time: each one is its own write and sweep.
        assert!(
            r.sweeps > sweeps,
            "generation {g}: {} sweeps after {sweeps}",
            r.sweeps
        );
        sweeps = r.sweeps;
        if g == 199 {
            let t4 = fabric.pkeys("node4");
            // Generation 199: 0x0c04 full, 0x0d01 limited.
            let deadline = Instant::now() + CONVERGE;
            let mut t4 = t4;
            while !(t4.contains(&0x8c04) && t4.contains(&0x0d01)) {
                assert!(Instant::now() < deadline, "node4: {t4:x?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                t4 = fabric.pkeys("node4");
            }
        }
    }
    let edit_time = edits.elapsed();
    // node1's port carries one partition at a time: i-0 leaves before the attach/release
    // cycles.
    let r = release(&mut c1, "i-0", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    for k in 0..10u32 {
        let instance = format!("i-c{k}");
        let a = attach_now(
            &mut c1,
            attach(
                &instance,
                partition(&format!("ibpart_c{k}"), 0x0a20 + k),
                Some(20_000),
            ),
        )
        .await;
        assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
        let r = release(&mut c1, &instance, Some(20_000)).await;
        assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    }
    // Every partition released: the file still loads (it keeps the Default entry).
    let (samples, bad) = sampler.finish();
    assert!(
        bad.is_empty(),
        "{} bad samples of {samples}; first: {}",
        bad.len(),
        bad[0]
    );
    assert!(samples > 100, "only {samples} samples");
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert_eq!(
        operator_parts(&text),
        (OPERATOR.to_owned(), TAIL.to_owned()),
        "{text}"
    );
    assert!(
        !parse(text.as_bytes()).unwrap().entries.is_empty(),
        "{text}"
    );
    let deadline = Instant::now() + CONVERGE;
    loop {
        let t4 = fabric.pkeys("node4");
        if ![
            0x0c00u16, 0x0c01, 0x0c02, 0x0c03, 0x0c04, 0x0d00, 0x0d01, 0x0d02,
        ]
        .iter()
        .any(|b| has_base(&t4, *b))
        {
            break;
        }
        assert!(Instant::now() < deadline, "node4 keeps bulk keys: {t4:x?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!has_base(&fabric.pkeys("node1"), 0x0a12));
    assert_opensm_never_rejected(&fabric);

    // 6. The operator breaks the file (without signalling OpenSM): the agent refuses to write,
    // and node1 reports why.
    let good = text;
    let broken = good.replacen(
        "storage=0x0100",
        "broken=0x0c0c : 0xzz ;\nstorage=0x0100",
        1,
    );
    assert!(
        parse(broken.as_bytes()).is_err(),
        "the broken file must not load"
    );
    let tmp = fabric.dir().join("operator-edit.tmp");
    std::fs::write(&tmp, &broken).unwrap();
    std::fs::rename(&tmp, fabric.partitions_path()).unwrap();
    let a = attach_now(
        &mut c1,
        attach("i-b", partition("ibpart_b", 0x0b33), Some(2000)),
    )
    .await;
    assert_ne!(state(&a), pb::AttachmentState::Active, "{a:?}");
    let a = wait_attachment(&mut c1, "i-b", "a reason", CONVERGE, |a| {
        !a.reason.is_empty()
    })
    .await;
    eprintln!("reason while the file is broken: {}", a.reason);
    assert!(
        a.reason.contains("0xzz") || a.reason.to_lowercase().contains("guid"),
        "{a:?}"
    );
    let smst = node(&mut c1).await.subnet_manager.expect("sm status");
    assert!(smst.last_error.contains("0xzz"), "{smst:?}");
    // Retries keep failing without touching the file.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let later = node(&mut c1).await.subnet_manager.expect("sm status");
    assert!(
        later.applies >= smst.applies + 2 && later.last_error.contains("0xzz"),
        "the node retries and is refused each time: {smst:?} then {later:?}"
    );
    assert_eq!(
        std::fs::read_to_string(fabric.partitions_path()).unwrap(),
        broken
    );
    assert_ne!(
        state(&get(&mut c1, "i-b").await),
        pb::AttachmentState::Active
    );
    assert!(!has_base(&fabric.pkeys("node1"), 0x0b33));

    // The operator fixes it: the agent converges.
    std::fs::write(&tmp, &good).unwrap();
    std::fs::rename(&tmp, fabric.partitions_path()).unwrap();
    wait_state(&mut c1, "i-b", pb::AttachmentState::Active, CONVERGE).await;
    assert!(fabric.pkeys("node1").contains(&0x8b33));
    let smst = node(&mut c1).await.subnet_manager.expect("sm status");
    assert!(smst.reachable && smst.last_error.is_empty(), "{smst:?}");
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert_eq!(
        operator_parts(&text),
        (OPERATOR.to_owned(), TAIL.to_owned()),
        "{text}"
    );
    assert_opensm_never_rejected(&fabric);

    // The operator's part shrinks to comments (no signal to OpenSM): once every partition is
    // released the file still loads, the region now carrying the Default entry itself.
    const BARE: &str = "# operator's part: comments only
";
    let (head, tail) = operator_parts(&text);
    let region = &text[head.len()..text.len() - tail.len()];
    std::fs::write(&tmp, format!("{BARE}{region}")).unwrap();
    std::fs::rename(&tmp, fabric.partitions_path()).unwrap();
    let r = release(&mut c1, "i-b", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert_eq!(
        operator_parts(&text),
        (BARE.to_owned(), String::new()),
        "{text}"
    );
    assert!(
        parse(text.as_bytes()).unwrap().has_explicit_default(),
        "{text}"
    );
    let t1 = fabric.pkeys("node1");
    assert!(!has_base(&t1, 0x0b33) && t1.contains(&0x7fff), "{t1:x?}");
    assert_opensm_never_rejected(&fabric);

    for agent in agents.iter().chain([&sm]) {
        check_history(agent).await;
    }
    stop_all(&mut agents, &mut sm);
    assert_only_opensm_litter(&fabric);
    eprintln!(
        "scenarios 5-6 took {:?} (200 Partitions edits: {edit_time:?})",
        started.elapsed()
    );
}

/// Stops every node agent and then the SM host's, each of which must exit cleanly.
fn stop_all(agents: &mut [Agent], sm: &mut Agent) {
    for agent in agents.iter_mut().chain([sm]) {
        let status = agent.stop();
        assert!(status.success(), "{} exited with {status}", agent.node);
    }
}

/// After every agent stopped cleanly, only the running OpenSM's shim directory is left.
fn assert_only_opensm_litter(fabric: &Fabric) {
    let litter = fabric.shim_litter();
    assert_eq!(litter.len(), 1, "only OpenSM's: {litter:?}");
}
