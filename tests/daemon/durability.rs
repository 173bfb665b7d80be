//! Durability: events replay after a restart, and a `kill -9` in the middle of a burst loses
//! nothing that was acknowledged and leaves a gap-free event sequence.

use testkit::common;

use common::*;
use fabric_agent::proto::agent as pb;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_stream::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_after_restart_then_follows_live() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::prepare(tmp.path(), "");
    d.spawn(&[]);
    let mut c = d.client().await;
    c.attach_partition(attach("i-1", partition("ibpart_a", 0x12), Some(5000)))
        .await
        .unwrap();
    c.release_instance(pb::ReleaseInstanceRequest {
        instance_id: "i-1".into(),
        wait_ms: Some(5000),
    })
    .await
    .unwrap();
    let before = events(&mut c, 0).await;
    assert!(before.len() >= 5);
    assert!(d.stop().success(), "SIGTERM exits 0");

    d.spawn(&[]);
    let mut c = d.client().await;
    let replayed = events(&mut c, 0).await;
    assert_eq!(
        &replayed[..before.len()],
        &before[..],
        "the log survives a restart unchanged"
    );
    assert_gap_free(&replayed);

    // Follow from the newest seq: the next attach's events arrive live, numbered on.
    let last = replayed.last().unwrap().seq;
    let mut stream = watch(&mut c, last, true).await;
    let mut c2 = d.client().await;
    c2.attach_partition(attach("i-2", partition("ibpart_b", 0x13), None))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        let e = e.unwrap();
        let active = matches!(&e.kind, Some(pb::event::Kind::AttachmentChanged(a)) if a.to == pb::AttachmentState::Active as i32);
        seen.push(e.seq);
        if active {
            break;
        }
    }
    assert_eq!(seen.first(), Some(&(last + 1)));
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");
    assert!(
        seen.len() >= 3,
        "PENDING, PROGRAMMING, ACTIVE at least: {seen:?}"
    );

    // SIGTERM with the follower still connected: its stream ends with UNAVAILABLE (resume
    // from the last seq) and the daemon does not wait out its drain timeout for it.
    let t = std::time::Instant::now();
    assert!(d.stop().success());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t.elapsed()
    );
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    match end {
        Some(Err(s)) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        // Events committed just before the stop may still arrive first.
        Some(Ok(e)) => assert!(e.seq > *seen.last().unwrap()),
        None => panic!("the stream must end with a status saying why"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_burst_loses_nothing_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::prepare(
        tmp.path(),
        "[subnet_manager.embedded]\npkey_table_size = 128\nports = 16\n",
    );
    d.spawn(&[]);
    // 100 instances on 16 ports, the instances of one port in that port's partition (a port
    // carries one partition at a time): each attaches, the even ones (every instance of the
    // even ports) are then released.
    let acks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100u32 {
        let mut c = d.client().await;
        let acks = acks.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("i-{i}");
            let port = i % 16 + 1;
            let p = partition(&format!("ibpart_p{port}"), 0x100 + port);
            let on = format!("sim0/{port}");
            let mut acked = Vec::new();
            if c.attach_partition(attach_on(&id, p, &[&on], None))
                .await
                .is_ok()
            {
                acked.push("attached");
                acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i % 2 == 0 {
                    let r = pb::ReleaseInstanceRequest {
                        instance_id: id.clone(),
                        wait_ms: None,
                    };
                    if c.release_instance(r).await.is_ok() {
                        acked.push("released");
                        acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }
            (id, acked)
        }));
    }
    // Crash while the burst is in flight: after 120 of its 150 calls (so some releases too) were acknowledged.
    while acks.load(std::sync::atomic::Ordering::SeqCst) < 120 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    d.crash();
    let mut acked: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for t in tasks {
        let (id, a) = t.await.unwrap();
        acked.insert(id, a);
    }
    let n_attached = acked.values().filter(|a| !a.is_empty()).count();
    let n_released = acked.values().filter(|a| a.len() == 2).count();
    eprintln!("acknowledged before the crash: {n_attached} attaches, {n_released} releases");
    assert!(n_attached > 0, "the crash came too early to test anything");

    d.spawn(&[]);
    let mut c = d.client().await;
    for (id, a) in &acked {
        let got = c
            .get_attachment(pb::GetAttachmentRequest {
                instance_id: id.clone(),
            })
            .await;
        match a.as_slice() {
            [] => {}
            ["attached"] => assert!(got.is_ok(), "acknowledged attach of {id} lost"),
            _ => {
                let s = state(
                    &got.unwrap_or_else(|e| panic!("acknowledged {id} lost: {e}"))
                        .into_inner(),
                );
                assert!(
                    matches!(
                        s,
                        pb::AttachmentState::Releasing | pb::AttachmentState::Released
                    ),
                    "acknowledged release of {id} lost: {s:?}"
                );
            }
        }
    }
    // The control plane sends the even instances' releases again (the crash cut some short,
    // and an attach may have been stored without its answer): an instance of a port's
    // partition stays RELEASING while another instance of it still covers the port.
    for i in (0..100u32).step_by(2) {
        let _ = c
            .release_instance(pb::ReleaseInstanceRequest {
                instance_id: format!("i-{i}"),
                wait_ms: None,
            })
            .await;
    }
    // Everything converges after the restart.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list = c
            .list_attachments(pb::ListAttachmentsRequest::default())
            .await
            .unwrap()
            .into_inner();
        let settled = list.attachments.iter().all(|a| {
            matches!(
                state(a),
                pb::AttachmentState::Active | pb::AttachmentState::Released
            )
        });
        if settled {
            for a in &list.attachments {
                let released = acked
                    .get(&a.instance_id)
                    .is_some_and(|x| x.contains(&"released"));
                if released {
                    assert_eq!(state(a), pb::AttachmentState::Released, "{}", a.instance_id);
                }
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not converged: {:?}",
            list.attachments
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let evs = events(&mut c, 0).await;
    assert_gap_free(&evs);
    // Every attachment's event history is a legal path with no duplicate transitions.
    let mut last: BTreeMap<String, i32> = BTreeMap::new();
    for e in &evs {
        if let Some(pb::event::Kind::AttachmentChanged(a)) = &e.kind {
            let prev = last.insert(a.instance_id.clone(), a.to).unwrap_or(0);
            assert_eq!(
                a.from, prev,
                "event {} of {} does not continue its history",
                e.seq, a.instance_id
            );
        }
    }
}

/// A WatchEvents call that must be refused with OUT_OF_RANGE.
async fn assert_out_of_range(
    c: &mut fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient<
        tonic::transport::Channel,
    >,
    after_seq: u64,
    log_epoch: Option<String>,
) {
    let r = c
        .watch_events(pb::WatchEventsRequest {
            after_seq,
            no_follow: true,
            log_epoch,
        })
        .await;
    match r {
        Err(s) => assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}"),
        Ok(_) => panic!("cursor {after_seq} of the old log was accepted"),
    }
}

fn rolled_back_condition(n: &pb::GetNodeResponse) -> bool {
    n.conditions.iter().any(|c| c.kind == "STORE_ROLLED_BACK")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_store_starts_a_new_epoch_and_never_reuses_a_seq() {
    let tmp = tempfile::tempdir().unwrap();
    let (faults, fault) = fault_config(tmp.path(), None, "");
    let mut d = Daemon::prepare(tmp.path(), &faults);
    let state = tmp.path().join("state");
    d.spawn(&[]);
    let mut c = d.client().await;
    let a = attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;
    assert_eq!(a.state, pb::AttachmentState::Active as i32);
    assert!(d.stop().success());
    // The copy an operator (or a VM snapshot of the data disk) will later put back.
    let copy = tmp.path().join("copy");
    copy_tree(&state, &copy);

    d.spawn(&[]);
    let mut c = d.client().await;
    let r = release(&mut c, "i-1", Some(5000)).await;
    assert_eq!(r.state, pb::AttachmentState::Released as i32);
    let before = node(&mut c).await;
    let old_events = events(&mut c, 0).await;
    let old_last = old_events.last().unwrap().seq;
    assert_eq!(before.last_event_seq, old_last);
    assert!(!rolled_back_condition(&before));
    assert!(d.stop().success());

    // Put the old database back; its mirror beside it still names the newer one.
    std::fs::copy(copy.join("state.redb"), state.join("state.redb")).unwrap();
    // Hold the first apply after the start, so the condition is seen standing.
    std::fs::write(&fault, "unreachable").unwrap();
    d.spawn(&[]);
    let mut c = d.client().await;
    let after = node(&mut c).await;
    assert_ne!(
        after.log_epoch, before.log_epoch,
        "a restored store gets a new epoch"
    );
    assert!(
        rolled_back_condition(&after),
        "STORE_ROLLED_BACK stands: {:?}",
        after.conditions
    );
    assert!(
        after.first_event_seq > old_last + 1,
        "the new log starts above every old seq, one left out: first {} after old last {old_last}",
        after.first_event_seq
    );
    // Every old cursor is out of range, with or without its epoch.
    for seq in [0, 1, old_last / 2, old_last] {
        assert_out_of_range(&mut c, seq, Some(before.log_epoch.clone())).await;
        assert_out_of_range(&mut c, seq, None).await;
    }
    // The new log, read from its start, opens with the condition; no seq is reused.
    let mut s = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: after.first_event_seq - 1,
            no_follow: false,
            log_epoch: Some(after.log_epoch.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    let first = s.next().await.unwrap().unwrap();
    assert!(first.seq > old_last);
    assert_eq!(first.log_epoch, after.log_epoch);
    match &first.kind {
        Some(pb::event::Kind::ConditionChanged(cc)) => {
            let cond = cc.condition.as_ref().unwrap();
            assert!(cc.active);
            assert_eq!(cond.kind, "STORE_ROLLED_BACK");
            assert!(cond.detail.contains("restored"), "{}", cond.detail);
        }
        other => panic!("the new log opens with the rollback: {other:?}"),
    }
    // Once the fabric side answers, the first acknowledged apply goes above every generation
    // the old store may have sent, and the condition clears (an event, numbered on).
    std::fs::write(&fault, "").unwrap();
    let mut cleared = None;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(10), s.next()).await {
        let e = e.unwrap();
        assert!(e.seq > old_last);
        if let Some(pb::event::Kind::ConditionChanged(cc)) = &e.kind {
            if !cc.active && cc.condition.as_ref().unwrap().kind == "STORE_ROLLED_BACK" {
                cleared = Some(e.seq);
                break;
            }
        }
    }
    assert!(
        cleared.is_some(),
        "the condition clears after an acknowledged apply"
    );
    let now = node(&mut c).await;
    assert!(!rolled_back_condition(&now));
    let old_generation = before.subnet_manager.unwrap().generation;
    let new_generation = now.subnet_manager.unwrap().generation;
    assert!(
        new_generation > old_generation,
        "generation {new_generation} must be above the old store's {old_generation}"
    );
    assert!(d.stop().success());

    // A restart neither raises it again nor reports it cleared again.
    let last = now.last_event_seq;
    d.spawn(&[]);
    let mut c = d.client().await;
    let again = node(&mut c).await;
    assert_eq!(
        again.log_epoch, after.log_epoch,
        "a clean restart keeps the epoch"
    );
    let replayed = events(&mut c, last).await;
    assert!(
        replayed
            .iter()
            .all(|e| !matches!(&e.kind, Some(pb::event::Kind::ConditionChanged(_)))),
        "{replayed:?}"
    );
    assert!(d.stop().success());
}

fn condition_events(events: &[pb::Event], kind: &str) -> Vec<bool> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::ConditionChanged(cc))
                if cc.condition.as_ref().is_some_and(|c| c.kind == kind) =>
            {
                Some(cc.active)
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_is_raised_once_across_restarts_and_cleared_after_one_gone_while_down() {
    const KIND: &str = "FULL_DEFAULT_MEMBERSHIP";
    let tmp = tempfile::tempdir().unwrap();
    let full = "[subnet_manager.embedded]\ndefault_membership = \"full\"\n";
    let mut d = Daemon::prepare(tmp.path(), full);
    d.spawn(&[]);
    let mut c = d.client().await;
    until_node(&mut c, Duration::from_secs(10), "the condition", |n| {
        n.conditions.iter().any(|x| x.kind == KIND)
    })
    .await;
    assert!(d.stop().success());

    // Restarted with the same posture: the condition stands, no second raise.
    d.spawn(&[]);
    let mut c = d.client().await;
    assert!(node(&mut c).await.conditions.iter().any(|x| x.kind == KIND));
    // One reconciler pass later the log still holds one raise.
    attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;
    assert_eq!(condition_events(&events(&mut c, 0).await, KIND), vec![true]);
    assert!(d.stop().success());

    // The cause went away while the agent was down: the first pass reports it cleared.
    let mut d = Daemon::prepare(tmp.path(), "");
    d.spawn(&[]);
    let mut c = d.client().await;
    wait_until("the condition cleared", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move { condition_events(&events(&mut c, 0).await, KIND) == vec![true, false] }
    })
    .await;
    assert!(node(&mut c).await.conditions.is_empty());
    assert!(d.stop().success());
}
