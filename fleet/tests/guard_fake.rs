//! The delete guard against in-process fakes (`tests/common/fake_agent.rs`,
//! `tests/common/fake_sm.rs`): a node that lies RELEASED while the fabric still holds its port,
//! and a node that goes away while its instance is ACTIVE. No real agent runs here.

mod common;

use common::fake_agent::{self, FakeAgentState};
use common::{attach, fake_sm, fleet, nodes_file, partition, state_of, wait_for};
use fabric_fleet::{Blocker, Decision};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_node_lying_released_is_caught_by_the_fabrics_view() {
    let liar = FakeAgentState::new("liar", "0x00000000000000a1");
    let url = fake_agent::serve(liar.clone(), std::future::pending()).await;
    let (sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let f = fleet(
        &nodes_file(&[("liar", url)], &sm_url),
        &dir.path().join("s.redb"),
    );
    let p = partition("ibpart_lie", 0x31);
    attach(&f, "liar", "i-l", &p).await;
    sm.hold(0x31, &["0x00000000000000A1"]);
    f.release("liar", "i-l", None).await.unwrap();
    wait_for("the liar's RELEASED", WAIT, || {
        (state_of(&f, "liar", "i-l").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    let Decision::No(b) = f.may_delete("ibpart_lie").await.unwrap() else {
        panic!("yes while the fabric holds the liar's port");
    };
    assert_eq!(b.len(), 1, "{b:#?}");
    assert_eq!(
        b[0].to_string(),
        "fabric fab1 still holds port 0x00000000000000a1 (node liar) in 0x0031 (SM host view, \
         source fake)"
    );
    sm.hold(0x31, &[]);
    assert_eq!(f.may_delete("ibpart_lie").await.unwrap(), Decision::Yes);
    assert!(*sm.calls.lock().unwrap() >= 2);
}

#[tokio::test]
async fn an_unreachable_node_blocks_with_since_when_and_no_fabric_view_means_no_answer() {
    let node = FakeAgentState::new("gone", "0x00000000000000b2");
    let url = fake_agent::serve(node.clone(), std::future::pending()).await;
    let dir = tempfile::tempdir().unwrap();
    // The SM host's URL points at nothing: the fabric's view cannot be read.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let f = fleet(
        &nodes_file(&[("gone", url)], &dead_url),
        &dir.path().join("s.redb"),
    );
    let p = partition("ibpart_gone", 0x32);
    attach(&f, "gone", "i-g", &p).await;
    wait_for("ACTIVE", WAIT, || {
        (state_of(&f, "gone", "i-g").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    node.set_down(true);
    wait_for("unreachable", WAIT, || {
        f.with_view(|v| v.nodes["gone"].live.unreachable_since_ms)
    })
    .await;
    let Decision::No(b) = f.may_delete("ibpart_gone").await.unwrap() else {
        panic!("yes for an ACTIVE instance");
    };
    assert!(
        matches!(&b[..], [Blocker::Instance { state, unreachable_since_ms: Some(_), .. }] if state == "ACTIVE"),
        "{b:#?}"
    );
    assert!(
        b[0].to_string().contains("node unreachable since"),
        "{}",
        b[0]
    );

    // Back, and RELEASED: still no answer while the fabric's own view cannot be read.
    node.set_down(false);
    node.transition(
        "i-g",
        &p,
        fabric_fleet::proto::agent::AttachmentState::Released,
    );
    wait_for("RELEASED", WAIT, || {
        (state_of(&f, "gone", "i-g").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    assert!(f.with_view(|v| v.nodes["gone"].live.unreachable_since_ms.is_none()));
    let err = f.may_delete("ibpart_gone").await.unwrap_err();
    assert!(
        matches!(err, fabric_fleet::GuardError::Fabric { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_re_attach_after_a_wipe_is_not_covered_by_the_old_released() {
    let node = FakeAgentState::new("again", "0x00000000000000c3");
    let url = fake_agent::serve(node.clone(), std::future::pending()).await;
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let f = fleet(
        &nodes_file(&[("again", url)], &sm_url),
        &dir.path().join("s.redb"),
    );
    let p = partition("ibpart_again", 0x33);
    attach(&f, "again", "i-a", &p).await;
    f.release("again", "i-a", None).await.unwrap();
    wait_for("RELEASED", WAIT, || {
        (state_of(&f, "again", "i-a").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    assert_eq!(f.may_delete("ibpart_again").await.unwrap(), Decision::Yes);
    // The node's state directory is wiped (new epoch): the follower resyncs and keeps the
    // final RELEASED.
    let old = node.epoch();
    node.set_down(true);
    wait_for("unreachable", WAIT, || {
        f.with_view(|v| v.nodes["again"].live.unreachable_since_ms)
    })
    .await;
    node.wipe();
    node.set_down(false);
    wait_for("resync into the new epoch", WAIT, || {
        f.with_view(|v| (v.nodes["again"].durable.epoch != old).then_some(()))
    })
    .await;
    assert_eq!(state_of(&f, "again", "i-a").as_deref(), Some("RELEASED"));
    // The control plane attaches the instance there again while the follower cannot see it.
    node.set_down(true);
    wait_for("unreachable", WAIT, || {
        f.with_view(|v| v.nodes["again"].live.unreachable_since_ms)
    })
    .await;
    attach(&f, "again", "i-a", &p).await;
    let Decision::No(b) = f.may_delete("ibpart_again").await.unwrap() else {
        panic!("yes on a RELEASED older than the attach");
    };
    assert!(
        matches!(&b[..], [Blocker::Instance { state, .. }] if state.starts_with("RE-ATTACHED")),
        "{b:#?}"
    );
    node.set_down(false);
    wait_for("ACTIVE seen", WAIT, || {
        (state_of(&f, "again", "i-a").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    f.release("again", "i-a", None).await.unwrap();
    wait_for("RELEASED again", WAIT, || {
        (state_of(&f, "again", "i-a").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    assert_eq!(f.may_delete("ibpart_again").await.unwrap(), Decision::Yes);
}

#[tokio::test]
async fn a_pruned_cursor_is_refused_and_resynced_once() {
    let node = FakeAgentState::new("pruned", "0x00000000000000d4");
    let url = fake_agent::serve(node.clone(), std::future::pending()).await;
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let f = fleet(
        &nodes_file(&[("pruned", url)], &sm_url),
        &dir.path().join("s.redb"),
    );
    let p = partition("ibpart_pruned", 0x34);
    attach(&f, "pruned", "i-p", &p).await;
    wait_for("ACTIVE", WAIT, || {
        (state_of(&f, "pruned", "i-p").as_deref() == Some("ACTIVE")).then_some(())
    })
    .await;
    let resyncs = || f.with_view(|v| v.nodes["pruned"].live.resyncs);
    assert_eq!(resyncs(), 1, "the first sync");
    // While the follower is away, the instance is released and the log pruned past its cursor.
    node.set_down(true);
    wait_for("unreachable", WAIT, || {
        f.with_view(|v| v.nodes["pruned"].live.unreachable_since_ms)
    })
    .await;
    node.transition(
        "i-p",
        &p,
        fabric_fleet::proto::agent::AttachmentState::Released,
    );
    node.prune_all();
    node.set_down(false);
    wait_for("RELEASED through a resync", WAIT, || {
        (state_of(&f, "pruned", "i-p").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    assert_eq!(resyncs(), 2, "OUT_OF_RANGE made one full resync");
    assert_eq!(f.with_view(|v| v.nodes["pruned"].durable.seq), node.head());
    // A later reconnect resumes from the fresh cursor: no further resync.
    node.set_down(true);
    wait_for("unreachable again", WAIT, || {
        f.with_view(|v| v.nodes["pruned"].live.unreachable_since_ms)
    })
    .await;
    node.set_down(false);
    node.port_flap();
    wait_for("the next event", WAIT, || {
        f.with_view(|v| (v.nodes["pruned"].durable.seq == node.head()).then_some(()))
    })
    .await;
    assert_eq!(resyncs(), 2);
    assert_eq!(f.may_delete("ibpart_pruned").await.unwrap(), Decision::Yes);
}

#[tokio::test]
async fn release_revokes_on_the_sm_host_and_delete_retires_the_key_only_after_the_guard() {
    let node = FakeAgentState::new("rk", "0x00000000000000c3");
    let url = fake_agent::serve(node.clone(), std::future::pending()).await;
    let (sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let f = fleet(
        &nodes_file(&[("rk", url)], &sm_url),
        &dir.path().join("s.redb"),
    );
    let p = partition("ibpart_rk", 0x33);
    attach(&f, "rk", "i-rk", &p).await;
    sm.hold(0x33, &["0x00000000000000C3"]);
    // The guard says no while the fabric holds the port: nothing is retired.
    let d = f.delete_partition(&p).await.unwrap();
    assert!(matches!(d, fabric_fleet::Deleted::Blocked(_)), "{d:?}");
    assert!(sm.retired.lock().unwrap().is_empty());
    // The release revokes the instance on the SM host too.
    f.release("rk", "i-rk", None).await.unwrap();
    assert_eq!(
        *sm.revoked.lock().unwrap(),
        vec![("rk".to_owned(), "i-rk".to_owned())]
    );
    wait_for("RELEASED", WAIT, || {
        (state_of(&f, "rk", "i-rk").as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    sm.hold(0x33, &[]);
    let before = fabric_fleet::view::now_ms();
    let d = f.delete_partition(&p).await.unwrap();
    let fabric_fleet::Deleted::Retired { retired_at_unix_ms } = d else {
        panic!("{d:?}");
    };
    assert!(retired_at_unix_ms >= before);
    assert_eq!(
        *sm.retired.lock().unwrap(),
        vec![(0x33, retired_at_unix_ms)]
    );
}
