//! The truth rules at the daemon level, on the embedded fabric with injected faults: a key
//! carried by an apply whose reply was lost stays in doubt (across a crash, too) and is never
//! reported RELEASED while it may still reach the ports; RELEASED carries its evidence; a port
//! that is a full member of the default partition is a standing condition that blocks ACTIVE
//! until the operator accepts it.

use testkit::common;

use common::*;
use fabric_agent::proto::agent as pb;
use std::time::Duration;

fn in_doubt(n: &pb::GetNodeResponse) -> Vec<u32> {
    n.subnet_manager.clone().unwrap_or_default().in_doubt_pkeys
}

fn holds(n: &pb::GetNodeResponse, value: u32) -> bool {
    n.ports.iter().any(|p| p.pkeys.contains(&value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_keeps_the_key_in_doubt_until_a_set_without_it_is_acknowledged() {
    // The SM takes every set but its replies are lost, and it programs the ports 1.5 s later.
    let mut d = Daemon::start_with_fault(
        Some("lose-reply"),
        "apply_delay_ms = 1500\n",
        "[reconciler]\nbackoff_initial_ms = 100\nbackoff_max_ms = 300\n",
    );
    let fault = d.fault_file();
    let mut c = d.client().await;
    c.attach_partition(attach("i-1", partition("ibpart_a", 0x12), None))
        .await
        .unwrap();
    let n = until_node(&mut c, Duration::from_secs(5), "0x0012 in doubt", |n| {
        in_doubt(n).contains(&0x12)
    })
    .await;
    assert!(!n.subnet_manager.unwrap().reachable);

    // The instance is terminated before any apply was acknowledged. The desired set is now
    // empty, as it was at start; RELEASED must still wait: the set with the key may be (and
    // here is) on its way to the ports. The SM now takes nothing more, so the empty set (sent
    // at once: it differs from the set that failed) cannot overtake the delayed one and the
    // key stays on the ports until the SM answers again.
    std::fs::write(&fault, "unreachable\n").unwrap();
    let r = release(&mut c, "i-1", Some(1000)).await;
    assert_eq!(state(&r), pb::AttachmentState::Releasing);
    let n = until_node(
        &mut c,
        Duration::from_secs(5),
        "the key on the ports",
        |n| holds(n, 0x8012),
    )
    .await;
    assert!(in_doubt(&n).contains(&0x12), "{n:?}");
    let a = get(&mut c, "i-1").await;
    assert_eq!(state(&a), pb::AttachmentState::Releasing);
    assert!(!a.reason.is_empty(), "a waiting release says why");

    // A crash does not forget what may have reached the SM.
    d.crash();
    d.spawn(&[]);
    let mut c = d.client().await;
    until_node(
        &mut c,
        Duration::from_secs(5),
        "in doubt after restart",
        |n| in_doubt(n).contains(&0x12),
    )
    .await;
    assert_eq!(
        state(&get(&mut c, "i-1").await),
        pb::AttachmentState::Releasing
    );

    // The SM answers again: the set without the key is acknowledged, the ports drop it.
    std::fs::write(&fault, "").unwrap();
    let a = release(&mut c, "i-1", Some(10_000)).await;
    assert_eq!(state(&a), pb::AttachmentState::Released, "{a:?}");
    let n = node(&mut c).await;
    assert!(!holds(&n, 0x8012) && !holds(&n, 0x0012), "{:?}", n.ports);
    assert!(in_doubt(&n).is_empty());

    let evs = events(&mut c, 0).await;
    assert_gap_free(&evs);
    let released = evs
        .iter()
        .find_map(|e| match &e.kind {
            Some(pb::event::Kind::AttachmentChanged(a))
                if a.to == pb::AttachmentState::Released as i32 =>
            {
                Some(a.clone())
            }
            _ => None,
        })
        .expect("a RELEASED event");
    let ev = released.evidence.expect("RELEASED carries its evidence");
    assert!(ev.sm_generation > 0);
    let ack = ev.sm_acknowledged.unwrap();
    let read = ev.read_started.unwrap();
    assert!(
        (read.seconds, read.nanos) >= (ack.seconds, ack.nanos),
        "the read started after the acknowledgement: {ev:?}"
    );
    assert_eq!(ev.ports.len(), 2, "both simulated ports were read");
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_default_membership_blocks_active_until_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let embedded = "[subnet_manager.embedded]\ndefault_membership = \"full\"\n";
    let mut d = Daemon::prepare(tmp.path(), embedded);
    d.spawn(&[]);
    let mut c = d.client().await;
    let r = attach_now(
        &mut c,
        attach("i-1", partition("ibpart_a", 0x12), Some(1500)),
    )
    .await;
    assert_eq!(state(&r), pb::AttachmentState::Programming);
    let a = get(&mut c, "i-1").await;
    assert!(a.reason.contains("allow_full_default"), "{:?}", a.reason);
    let n = node(&mut c).await;
    assert!(holds(&n, 0x8012), "the key itself is programmed");
    let cond: Vec<&str> = n.conditions.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(cond, vec!["FULL_DEFAULT_MEMBERSHIP"]);
    let raised = events(&mut c, 0).await.into_iter().any(|e| {
        matches!(&e.kind, Some(pb::event::Kind::ConditionChanged(c))
            if c.active && c.condition.as_ref().is_some_and(|k| k.kind == "FULL_DEFAULT_MEMBERSHIP"))
    });
    assert!(raised, "the condition is an event too");
    d.stop();

    // The operator accepts the posture: the same attachment goes ACTIVE, the condition stays.
    let config = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(&d.config, format!("allow_full_default = true\n{config}")).unwrap();
    d.spawn(&[]);
    let mut c = d.client().await;
    let r = attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;
    assert_eq!(state(&r), pb::AttachmentState::Active);
    let n = node(&mut c).await;
    assert_eq!(n.conditions.len(), 1);
    assert!(
        n.conditions[0].detail.contains("accepted"),
        "{:?}",
        n.conditions
    );
    d.stop();
}
