//! The log epoch across the daemon's stops: a SIGTERM restart keeps it (cursors resume), a
//! SIGKILL restart opens a new one (the event raising `UNCLEAN_STOP` says why), and a copy of
//! the running agent's state directory put back opens a new one too, so no (epoch, seq) ever
//! names two different events (chaos finding F3).

use testkit::common;

use common::*;
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use nix::sys::signal::{kill, Signal};
use std::collections::BTreeMap;
use tonic::transport::Channel;

/// Releases `id`, waiting for RELEASED (a port carries one tenant partition at a time).
async fn release(c: &mut FabricAgentClient<Channel>, id: &str) {
    c.release_instance(pb::ReleaseInstanceRequest {
        instance_id: id.into(),
        wait_ms: Some(5000),
    })
    .await
    .unwrap();
}

/// Every event of the log with the epoch it was handed out under, from seq 1.
async fn log(c: &mut FabricAgentClient<Channel>) -> Vec<pb::Event> {
    events(c, 0).await
}

/// Records what each (epoch, seq) named; panics when one names two different events.
fn record(seen: &mut BTreeMap<(String, u64), String>, events: &[pb::Event]) {
    for e in events {
        let what = format!("{:?}", e.kind);
        if let Some(before) = seen.insert((e.log_epoch.clone(), e.seq), what.clone()) {
            assert_eq!(
                before, what,
                "(epoch {}, seq {}) handed out twice with different events",
                e.log_epoch, e.seq
            );
        }
    }
}

/// Whether resuming from (`after`, `epoch`) is refused with OUT_OF_RANGE.
async fn refused(c: &mut FabricAgentClient<Channel>, after: u64, epoch: &str) -> bool {
    let r = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: after,
            no_follow: true,
            log_epoch: Some(epoch.to_owned()),
        })
        .await;
    match r {
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
            true
        }
        Ok(_) => false,
    }
}

fn unclean_stop_raised(events: &[pb::Event]) -> Option<&pb::Event> {
    events.iter().find(|e| {
        matches!(&e.kind, Some(pb::event::Kind::ConditionChanged(c))
            if c.active && c.condition.as_ref().is_some_and(|k| k.kind == "UNCLEAN_STOP"
                && k.detail.contains("unclean stop: new epoch")))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_the_epoch_and_sigkill_starts_a_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::prepare(tmp.path(), "");
    let mut seen = BTreeMap::new();
    d.spawn(&[]);
    let mut c = d.client().await;
    c.attach_partition(attach("i-1", partition("ibpart_a", 0x12), Some(5000)))
        .await
        .unwrap();
    release(&mut c, "i-1").await;
    let first = node(&mut c).await;
    record(&mut seen, &log(&mut c).await);

    // SIGTERM: a clean stop. The epoch stays and the old cursor resumes.
    assert!(d.stop().success(), "SIGTERM exits 0");
    d.spawn(&[]);
    let mut c = d.client().await;
    let n = node(&mut c).await;
    assert_eq!(
        n.log_epoch, first.log_epoch,
        "a clean restart keeps the epoch"
    );
    assert!(!refused(&mut c, first.last_event_seq, &first.log_epoch).await);
    let events = log(&mut c).await;
    assert!(unclean_stop_raised(&events).is_none(), "{events:?}");
    record(&mut seen, &events);

    // SIGKILL: a new epoch, the log continuing; the old cursor is refused.
    c.attach_partition(attach("i-2", partition("ibpart_b", 0x13), Some(5000)))
        .await
        .unwrap();
    release(&mut c, "i-2").await;
    let before_kill = node(&mut c).await;
    record(&mut seen, &log(&mut c).await);
    d.crash();
    d.spawn(&[]);
    let mut c = d.client().await;
    let killed = node(&mut c).await;
    assert_ne!(
        killed.log_epoch, first.log_epoch,
        "an unclean stop opens a new epoch"
    );
    assert!(refused(&mut c, before_kill.last_event_seq, &before_kill.log_epoch).await);
    let events = log(&mut c).await;
    let raised = unclean_stop_raised(&events).expect("the new epoch says why");
    assert_eq!(raised.seq, before_kill.last_event_seq + 1);
    assert_gap_free(&events);
    record(&mut seen, &events);
    assert!(d.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_agents_state_dir_put_back_reuses_no_epoch_and_seq() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::prepare(tmp.path(), "");
    let mut seen = BTreeMap::new();
    d.spawn(&[]);
    let mut c = d.client().await;
    c.attach_partition(attach("i-1", partition("ibpart_a", 0x12), Some(5000)))
        .await
        .unwrap();
    release(&mut c, "i-1").await;
    record(&mut seen, &log(&mut c).await);

    // The state directory copied while the agent serves (SIGSTOP, copy, SIGCONT: what a VM
    // snapshot sees), then more events, then the agent killed and the copy put back.
    let state = tmp.path().join("state");
    let copy = tmp.path().join("state-copy");
    kill(d.pid(), Signal::SIGSTOP).unwrap();
    copy_tree(&state, &copy);
    kill(d.pid(), Signal::SIGCONT).unwrap();
    let copied = node(&mut c).await;
    c.attach_partition(attach("i-3", partition("ibpart_c", 0x14), Some(5000)))
        .await
        .unwrap();
    release(&mut c, "i-3").await;
    let consumed = node(&mut c).await;
    assert!(consumed.last_event_seq > copied.last_event_seq);
    record(&mut seen, &log(&mut c).await);
    d.crash();
    copy_tree(&copy, &state);
    d.spawn(&[]);
    let mut c = d.client().await;
    let restored = node(&mut c).await;
    // New events past the seqs the lost life handed out: none names an (epoch, seq) seen.
    for (id, name, key) in [("i-4", "ibpart_d", 0x15), ("i-5", "ibpart_e", 0x16)] {
        c.attach_partition(attach(id, partition(name, key), Some(5000)))
            .await
            .unwrap();
        release(&mut c, id).await;
    }
    let events = log(&mut c).await;
    assert!(events.last().unwrap().seq > consumed.last_event_seq);
    record(&mut seen, &events);
    assert_ne!(
        restored.log_epoch, consumed.log_epoch,
        "a running agent's copy put back opens a new epoch"
    );
    assert!(refused(&mut c, consumed.last_event_seq, &consumed.log_epoch).await);
    assert!(unclean_stop_raised(&events).is_some());
    assert!(d.stop().success());
}
