//! Faults on an ibsim fabric with a real OpenSM, through the public APIs only (the node agent's
//! `fabric.agent.v1`, the SM-host agent's `fabric.sm.v1.Partitions` with a stock tonic client),
//! cross-checked with `smpquery`/`saquery`: a stale generation is ABORTED with the stored one;
//! OpenSM killed mid-release gives a clear reason and RELEASED only once the key is gone; an
//! operator's edit OpenSM rejects is undone; a tenant named like an operator's keyless entry
//! changes no operator membership; a reply lost after OpenSM programmed the key never leads to
//! RELEASED while the key is on the port; a restored SM-host store never puts a released key
//! back on a port. Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::sm_requests::set_memberships;
use common::{
    attach, attach_now, free_port, get, has_base, node, partition, release, state, wait_until,
    CONVERGE,
};
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::region::{BEGIN_MARKER, END_MARKER};
use prost::Message;
use rig::agents::{node_config, sm_config, Agent};
use rig::proxy::ReplyDropper;
use rig::{Fabric, FabricSpec};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

/// Tenant ports are limited members of the default partition: no path between two of them but
/// through a tenant key.
const OPERATOR: &str = "# operator's partitions\n\
Default=0x7fff : ALL=limited, SELF=full ;\n\
storage=0x0100, ipoib : ALL_SWITCHES=full, SELF=full ;\n";

/// The SM-host agent on a free loopback port, and a Partitions client to it.
async fn start_sm(fabric: &Fabric) -> (Agent, PartitionsClient<Channel>) {
    let port = free_port();
    let sm = Agent::start(fabric, rig::SM_HOST, &sm_config(fabric, port));
    let client = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect");
    (sm, client)
}

/// Sets `node`'s port `guid` to hold `key` (a full member) at `generation` through the SM
/// host, and waits until smpquery shows the key on the port.
async fn set_and_wait(
    fabric: &Fabric,
    client: &mut PartitionsClient<Channel>,
    node: &str,
    guid: u64,
    key: u32,
    generation: u64,
) {
    client
        .set_node_memberships(set_memberships(node, &[guid], &[key], generation))
        .await
        .unwrap_or_else(|e| panic!("generation {generation}: {e:?}"));
    let full = u16::try_from(0x8000 | key).expect("a P_Key");
    wait_until(&format!("{full:#06x} on {node}"), CONVERGE, || async {
        fabric.pkeys(node).contains(&full)
    })
    .await;
}

/// The kinds of the standing conditions an agent's GetNode shows.
async fn condition_kinds(agent: &Agent) -> Vec<String> {
    let mut c = agent.client().await;
    node(&mut c)
        .await
        .conditions
        .into_iter()
        .map(|c| c.kind)
        .collect()
}

/// Waits until the agent's GetNode shows condition `kind` (`shown`), or no longer shows it.
async fn wait_condition(agent: &Agent, kind: &str, shown: bool) {
    let what = format!(
        "{kind} {} on {}",
        if shown { "shown" } else { "cleared" },
        agent.node
    );
    wait_until(&what, CONVERGE, || async {
        condition_kinds(agent).await.iter().any(|k| k == kind) == shown
    })
    .await;
}

/// Polls `instance` until RELEASED, checking on every poll that RELEASED is never reported while
/// `smpquery` (read after the state) shows `base` on `node`'s port. Returns the polls made.
async fn released_only_without_key(
    fabric: &Fabric,
    c: &mut FabricAgentClient<Channel>,
    node: &str,
    instance: &str,
    base: u16,
    within: Duration,
) -> Result<usize, pb::Attachment> {
    let deadline = Instant::now() + within;
    let mut polls = 0;
    loop {
        let a = get(c, instance).await;
        let keys = fabric.pkeys(node);
        polls += 1;
        if state(&a) == pb::AttachmentState::Released {
            assert!(
                !has_base(&keys, base),
                "{instance} RELEASED while smpquery shows {base:#06x} on {node}: {keys:x?} ({a:?})"
            );
            return Ok(polls);
        }
        if Instant::now() >= deadline {
            return Err(a);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The stored generation an ABORTED carries, read the way any client can: the status details
/// (`google.rpc.Status`-shaped `ErrorStatus` with a `StaleGeneration`) and the trailer.
fn stored_generation_of(status: &tonic::Status) -> (u64, u64, u64) {
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    let details = smpb::ErrorStatus::decode(status.details()).expect("status details");
    let any = details
        .details
        .iter()
        .find(|a| a.type_url == "type.googleapis.com/fabric.sm.v1.StaleGeneration")
        .expect("a StaleGeneration detail");
    let stale = smpb::StaleGeneration::decode(&any.value[..]).expect("StaleGeneration");
    let trailer: u64 = status
        .metadata()
        .get("fabric-stored-generation")
        .expect("trailer")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    (stale.stored, stale.sent, trailer)
}

/// (a) A stale generation sent by a stock tonic client is ABORTED with the stored generation,
/// and the stored set (and the port) are unchanged; the same generation with another set too; the
/// same generation with the same set is a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_generation_is_aborted_with_the_stored_one() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let (mut sm, mut client) = start_sm(&fabric).await;
    let guid = fabric.node_info("node2").port_guid;
    set_and_wait(&fabric, &mut client, "node2", guid, 0x0a31, 5).await;

    let err = client
        .set_node_memberships(set_memberships("node2", &[guid], &[], 3))
        .await
        .expect_err("generation 3 is older");
    assert_eq!(stored_generation_of(&err), (5, 3, 5), "{err:?}");
    let err = client
        .set_node_memberships(set_memberships("node2", &[guid], &[0x0a32], 5))
        .await
        .expect_err("generation 5 with another set");
    assert_eq!(stored_generation_of(&err), (5, 5, 5), "{err:?}");
    let held = client
        .get_node_memberships(smpb::GetNodeMembershipsRequest {
            node_id: "node2".into(),
        })
        .await
        .expect("held")
        .into_inner();
    assert_eq!(held.generation, 5);
    assert_eq!(
        held.keys.iter().map(|k| k.pkey).collect::<Vec<_>>(),
        vec![0x0a31]
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = fabric.pkeys("node2");
    assert!(
        keys.contains(&0x8a31) && !has_base(&keys, 0x0a32),
        "{keys:x?}"
    );
    // A retry of generation 5 is served; generation 6 moves on.
    client
        .set_node_memberships(set_memberships("node2", &[guid], &[0x0a31], 5))
        .await
        .expect("retry of generation 5");
    client
        .set_node_memberships(set_memberships("node2", &[guid], &[], 6))
        .await
        .expect("generation 6");
    wait_until("0x0a31 gone from node2", CONVERGE, || async {
        !has_base(&fabric.pkeys("node2"), 0x0a31)
    })
    .await;
    assert!(sm.stop().success());
}

/// (b) OpenSM is SIGKILLed (and left a zombie, so signals to its pid still "succeed") before a
/// release: the attachment stays RELEASING with a clear reason, GetNode shows the subnet manager
/// unreachable with that reason, and RELEASED comes only after OpenSM is back and the key left
/// the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opensm_killed_mid_release_gives_a_reason_and_releases_only_once_the_key_is_gone() {
    let Some(mut fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let port = free_port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let mut n1 = Agent::start(&fabric, "node1", &node_config(&fabric, "node1", port));
    let mut c1 = n1.client().await;
    let a = attach_now(
        &mut c1,
        attach("i-1", partition("ibpart_k", 0x0a61), Some(20_000)),
    )
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");

    fabric.kill_opensm_unreaped();
    let r = release(&mut c1, "i-1", Some(3000)).await;
    assert_ne!(state(&r), pb::AttachmentState::Released, "{r:?}");
    let deadline = Instant::now() + CONVERGE;
    let reason = loop {
        let a = get(&mut c1, "i-1").await;
        assert_ne!(state(&a), pb::AttachmentState::Released, "{a:?}");
        if !a.reason.is_empty() {
            break a.reason;
        }
        assert!(Instant::now() < deadline, "no reason: {a:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("reason while OpenSM is dead: {reason}");
    assert!(reason.contains("OpenSM"), "{reason}");
    let smst = node(&mut c1).await.subnet_manager.expect("sm status");
    assert!(!smst.reachable, "{smst:?}");
    assert!(smst.last_error.contains("OpenSM"), "{smst:?}");
    assert!(fabric.pkeys("node1").contains(&0x8a61));
    wait_condition(&sm, "PARTITIONS_FILE_UNCONFIRMED", true).await;

    fabric.restart_opensm();
    let polls = released_only_without_key(&fabric, &mut c1, "node1", "i-1", 0x0a61, CONVERGE)
        .await
        .unwrap_or_else(|a| panic!("not RELEASED after OpenSM came back: {a:?}"));
    eprintln!("RELEASED after {polls} polls");
    assert!(!has_base(&fabric.pkeys("node1"), 0x0a61));
    let smst = node(&mut c1).await.subnet_manager.expect("sm status");
    assert!(smst.reachable && smst.last_error.is_empty(), "{smst:?}");
    wait_condition(&sm, "PARTITIONS_FILE_UNCONFIRMED", false).await;
    assert!(n1.stop().success());
    assert!(sm.stop().success());
}

/// (c) The operator breaks their part of the file (outside the region) and OpenSM re-reads it on
/// a SIGHUP: OpenSM logs PARSE ERROR and falls back to every port a full member of the default
/// partition. The SM-host agent notices (log watch), keeps the edit as `<file>.rejected`,
/// restores the last accepted file and signals OpenSM: the ports get their keys back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_edit_opensm_rejects_is_replaced_by_the_last_accepted_file() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let (mut sm, mut client) = start_sm(&fabric).await;
    let guid = fabric.node_info("node1").port_guid;
    set_and_wait(&fabric, &mut client, "node1", guid, 0x0a51, 1).await;
    let good = std::fs::read_to_string(fabric.partitions_path()).unwrap();

    let broken = good.replacen(
        "storage=0x0100",
        "broken=0x0c0c : 0xzz ;\nstorage=0x0100",
        1,
    );
    assert!(parse(broken.as_bytes()).is_err());
    let log_at = fabric.opensm_log().len();
    let tmp = fabric.dir().join("operator-edit.tmp");
    std::fs::write(&tmp, &broken).unwrap();
    std::fs::rename(&tmp, fabric.partitions_path()).unwrap();
    fabric.hup_opensm();
    let started = Instant::now();
    wait_until("OpenSM's PARSE ERROR", CONVERGE, || async {
        fabric.opensm_log()[log_at..].contains("PARSE ERROR")
    })
    .await;
    wait_until("the last accepted file restored", CONVERGE, || async {
        std::fs::read_to_string(fabric.partitions_path()).unwrap() == good
    })
    .await;
    eprintln!(
        "restored {:?} after the operator's SIGHUP",
        started.elapsed()
    );
    let kept = fabric.dir().join("partitions.conf.rejected");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), broken);
    // OpenSM re-read the restored file: the default partition is limited again, the tenant key
    // is back on node1, node2 holds no full default key.
    wait_until("ports restored", CONVERGE, || async {
        let k1 = fabric.pkeys("node1");
        let k2 = fabric.pkeys("node2");
        k1.contains(&0x8a51) && !k2.contains(&0xffff) && k2.contains(&0x7fff)
    })
    .await;
    // The SM host shows the standing condition (GetNode), with OpenSM's words.
    wait_condition(&sm, "PARTITIONS_FILE_REJECTED", true).await;
    let mut smc = sm.client().await;
    let shown = node(&mut smc).await.conditions;
    eprintln!("SM host conditions: {shown:?}");
    assert!(
        shown
            .iter()
            .any(|c| c.kind == "PARTITIONS_FILE_REJECTED" && c.detail.contains("PARSE ERROR")),
        "{shown:?}"
    );
    // Nothing new to write: the same set is served (the restored file is the accepted one).
    client
        .set_node_memberships(set_memberships("node1", &[guid], &[0x0a51], 1))
        .await
        .expect("retry of generation 1");
    assert_eq!(
        std::fs::read_to_string(fabric.partitions_path()).unwrap(),
        good
    );
    assert!(sm.stop().success());
}

/// (d) A keyless operator entry after the region (OpenSM looks its key up by name) and a tenant
/// partition with the same name: the tenant's entry is named so the lookup cannot find it, so
/// the operator's partition keeps its key and members and no tenant port joins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_named_like_an_operator_entry_changes_no_operator_membership() {
    let operator = format!("{OPERATOR}{BEGIN_MARKER}\n{END_MARKER}\nbackup : SELF=full ;\n");
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), &operator) else {
        return;
    };
    let backup = parse(operator.as_bytes())
        .unwrap()
        .entries
        .iter()
        .find(|e| e.name.as_deref() == Some("backup"))
        .expect("backup entry")
        .pkey;
    wait_until(
        "the operator's backup key on the SM port",
        CONVERGE,
        || async { fabric.pkeys(rig::SM_HOST).contains(&(0x8000 | backup)) },
    )
    .await;
    let (mut sm, mut client) = start_sm(&fabric).await;
    let guid = fabric.node_info("node1").port_guid;
    let mut request = set_memberships("node1", &[guid], &[0x0a41], 1);
    if let Some(m) = request.memberships.as_mut() {
        m.keys[0].name = "backup".into();
    }
    client
        .set_node_memberships(request)
        .await
        .expect("a tenant named backup");
    wait_until("0x8a41 on node1", CONVERGE, || async {
        fabric.pkeys("node1").contains(&0x8a41)
    })
    .await;
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    let conf = parse(text.as_bytes()).unwrap();
    let eff = conf.effective();
    assert_eq!(eff[&backup].members.len(), 1, "{text}");
    assert_eq!(eff[&0x0a41].members.len(), 1, "{text}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sm_keys = fabric.pkeys(rig::SM_HOST);
    let n1_keys = fabric.pkeys("node1");
    assert!(sm_keys.contains(&(0x8000 | backup)), "{sm_keys:x?}");
    assert!(
        !has_base(&sm_keys, 0x0a41),
        "the SM port joined the tenant: {sm_keys:x?}"
    );
    assert!(
        !has_base(&n1_keys, backup),
        "node1 joined the operator's partition: {n1_keys:x?}"
    );
    let lid = |n: &str| fabric.port_info(n).lid;
    let (l1, lsm) = (lid("node1"), lid(rig::SM_HOST));
    let path = fabric.path_pkey("node1", l1, lsm);
    assert!(
        path.is_some_and(|p| p & 0x7fff != 0x0a41 && p & 0x7fff != backup),
        "node1 -> SM path via {path:x?}"
    );

    assert!(sm.stop().success());
}

/// (e) The SM host's reply to an apply carrying a key is lost after OpenSM programmed it
/// (a proxy closes the node's connection when the answer starts), then the instance is released
/// while replies are still lost: never RELEASED while smpquery shows the key on the port; once
/// replies flow again, RELEASED with the key gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_then_a_release_is_never_released_while_the_key_is_on_the_port() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let port = free_port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let proxy = ReplyDropper::start(port);
    let mut n1 = Agent::start(
        &fabric,
        "node1",
        &node_config(&fabric, "node1", proxy.port()),
    );
    let mut c1 = n1.client().await;
    let a = attach_now(
        &mut c1,
        attach("i-0", partition("ibpart_base", 0x0a70), Some(20_000)),
    )
    .await;
    assert_eq!(state(&a), pb::AttachmentState::Active, "{a:?}");
    // A port carries one partition at a time: the next tenant comes once i-0 is RELEASED.
    let r = release(&mut c1, "i-0", Some(20_000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Released, "{r:?}");

    proxy.arm(true);
    attach_now(
        &mut c1,
        attach("i-1", partition("ibpart_lost", 0x0a71), None),
    )
    .await;
    wait_until(
        "the SM host programmed 0x8a71 and its reply was lost",
        CONVERGE,
        || async { proxy.dropped() >= 1 && fabric.pkeys("node1").contains(&0x8a71) },
    )
    .await;
    let r = release(&mut c1, "i-1", None).await;
    assert_ne!(state(&r), pb::AttachmentState::Released, "{r:?}");
    // Replies still lost for a while: whatever the node claims, never RELEASED with the key on.
    let _ = released_only_without_key(
        &fabric,
        &mut c1,
        "node1",
        "i-1",
        0x0a71,
        Duration::from_secs(5),
    )
    .await;
    proxy.arm(false);
    let polls = released_only_without_key(&fabric, &mut c1, "node1", "i-1", 0x0a71, CONVERGE)
        .await
        .unwrap_or_else(|a| panic!("not RELEASED after replies flow again: {a:?}"));
    eprintln!(
        "RELEASED after {polls} polls; {} replies lost",
        proxy.dropped()
    );
    assert!(!has_base(&fabric.pkeys("node1"), 0x0a71));
    assert!(!has_base(&fabric.pkeys("node1"), 0x0a70));
    assert!(n1.stop().success());
    assert!(sm.stop().success());
}

/// A restored SM-host store (its database put back from a copy taken before a release) never
/// puts the released key back on the node's port: the restored sets stay out of the region
/// until each node sends again, while other nodes' sets are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_sm_host_store_never_puts_a_released_key_back_on_a_port() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let port = free_port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let connect = || async move {
        PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect")
    };
    let mut client = connect().await;
    let (g1, g2) = (
        fabric.node_info("node1").port_guid,
        fabric.node_info("node2").port_guid,
    );
    set_and_wait(&fabric, &mut client, "node1", g1, 0x0a41, 1).await;
    assert!(sm.stop().success());
    let db = fabric.dir().join("smstate/state.redb");
    let copy = fabric.dir().join("smstate-copy.redb");
    std::fs::copy(&db, &copy).unwrap();

    // node1 releases the key.
    sm.spawn(&fabric);
    let mut client = connect().await;
    client
        .set_node_memberships(set_memberships("node1", &[g1], &[], 2))
        .await
        .expect("release");
    wait_until("0x0a41 gone from node1", CONVERGE, || async {
        !has_base(&fabric.pkeys("node1"), 0x0a41)
    })
    .await;
    assert!(sm.stop().success());

    // The database from before the release is put back; its mirror still names the newer one.
    std::fs::copy(&copy, &db).unwrap();
    sm.spawn(&fabric);
    let mut client = connect().await;
    // Another node's set makes the SM host write and OpenSM sweep: node1's key stays off.
    set_and_wait(&fabric, &mut client, "node2", g2, 0x0a42, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = fabric.pkeys("node1");
    assert!(
        !has_base(&keys, 0x0a41),
        "released key back on node1: {keys:x?}"
    );
    let held = client
        .get_node_memberships(smpb::GetNodeMembershipsRequest {
            node_id: "node1".into(),
        })
        .await
        .expect("held")
        .into_inner();
    assert!(held.keys.is_empty(), "{held:?}");
    // Its old generation still fences; node1's next set is served.
    let err = client
        .set_node_memberships(set_memberships("node1", &[g1], &[0x0a41], 1))
        .await
        .expect_err("the restored generation still fences");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    set_and_wait(&fabric, &mut client, "node1", g1, 0x0a43, 3).await;
    // The SM host's own log says what happened.
    let mut c = sm.client().await;
    let n = node(&mut c).await;
    let log = common::events(&mut c, n.first_event_seq.saturating_sub(1)).await;
    assert!(
        log.iter().any(|e| matches!(&e.kind,
            Some(pb::event::Kind::ConditionChanged(cc))
                if cc.active && cc.condition.as_ref().is_some_and(|k| k.kind == "STORE_ROLLED_BACK"))),
        "{log:?}"
    );
    assert!(sm.stop().success());
}
