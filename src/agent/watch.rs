//! WatchEvents: replay from the durable log, then follow live events, without gaps or
//! duplicates. Subscribing to live events happens before the replay starts, and anything missed
//! while lagging is re-read from the log.
//!
//! A cursor from another log (another epoch) or beyond the newest event is refused with
//! OUT_OF_RANGE, so a control plane whose cursor predates a wiped state directory resynchronises
//! instead of waiting forever. Every read from the log checks that its first event follows the
//! last one handed out: a stream held behind retention pruning ends with OUT_OF_RANGE.
//!
//! Memory per stream is bounded whatever the consumer does: the stream is pulled by its gRPC
//! response only when the client has flow-control room, and holds at most one replay batch
//! (`batch` events) read from the log. No task or channel is kept per stream; a client that
//! goes away drops its stream.

use super::{Agent, AgentError, CursorError, StreamEnd};
use crate::domain::Event;
use futures::Stream;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;

/// A stream of events as `start` returns it. Live events are shared by every open stream.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Arc<Event>, AgentError>> + Send>>;

/// The largest replay batch accepted.
pub const MAX_BATCH: usize = 4096;

/// Where a watcher starts and how it reads.
#[derive(Debug, Clone)]
pub struct WatchFrom {
    /// Replay events with seq > after.
    pub after: u64,
    /// The log epoch `after` belongs to, when the client knows it.
    pub epoch: Option<String>,
    /// Follow live events after the replay.
    pub follow: bool,
    /// Events read from the log at a time (1..=[`MAX_BATCH`]).
    pub batch: usize,
    /// End the stream with UNAVAILABLE (and its resume cursor) after this long.
    pub max_age: Option<std::time::Duration>,
}

pub(super) fn start(agent: Agent, from: WatchFrom) -> Result<EventStream, AgentError> {
    let WatchFrom {
        after,
        epoch: client_epoch,
        follow,
        batch,
        max_age,
    } = from;
    let batch = batch.clamp(1, MAX_BATCH);
    let epoch = agent.store().epoch();
    let last = agent.store().last_seq()?;
    if let Some(e) = &client_epoch {
        if !e.eq_ignore_ascii_case(&epoch.to_string()) {
            return Err(CursorError::OtherEpoch {
                given: e.clone(),
                epoch,
                last,
            }
            .into());
        }
    }
    if after > last {
        return Err(CursorError::BeyondNewest { after, last, epoch }.into());
    }
    let (first, _) = agent.store().event_bounds()?;
    if first > 0 && after.saturating_add(1) < first {
        return Err(CursorError::Pruned { first, last, epoch }.into());
    }
    let cursor = Cursor {
        live: agent.shared.events.subscribe(),
        stopping: agent.shared.stopping.subscribe(),
        agent,
        epoch,
        sent: after,
        follow,
        batch,
        deadline: max_age.map(|d| tokio::time::Instant::now() + d),
        page: VecDeque::new(),
        replaying: true,
        done: false,
    };
    Ok(Box::pin(futures::stream::unfold(cursor, next)))
}

/// One stream's position. The stream is polled only when its client has room for more (HTTP/2
/// flow control), so a consumer that stops reading stops the stream where it is, holding at
/// most one replay batch.
struct Cursor {
    agent: Agent,
    live: tokio::sync::broadcast::Receiver<Arc<Event>>,
    stopping: tokio::sync::watch::Receiver<bool>,
    epoch: crate::store::LogEpoch,
    /// The last seq handed out.
    sent: u64,
    follow: bool,
    batch: usize,
    deadline: Option<tokio::time::Instant>,
    /// Events read from the log, not yet handed out.
    page: VecDeque<Event>,
    /// Reading from the log (at the start, and after lagging or a gap).
    replaying: bool,
    /// An error was handed out: the stream ends.
    done: bool,
}

enum Woken {
    Live(Result<Arc<Event>, RecvError>),
    Stopping,
    Expired,
}

async fn next(mut c: Cursor) -> Option<(Result<Arc<Event>, AgentError>, Cursor)> {
    loop {
        if c.done {
            return None;
        }
        if let Some(e) = c.page.pop_front() {
            c.sent = e.seq;
            return Some((Ok(Arc::new(e)), c));
        }
        if c.replaying {
            // Replay (or catch up after lagging) from the log.
            match c.agent.store().events_after(c.sent, c.batch) {
                // The next event must follow the cursor: one pruned while this stream was held
                // (or lagging) ends it with OUT_OF_RANGE, never a skip ahead.
                Ok(page)
                    if page
                        .first()
                        .is_some_and(|e| Some(e.seq) != c.sent.checked_add(1)) =>
                {
                    c.done = true;
                    let first = page.first().map_or(0, |e| e.seq);
                    let last = c.agent.store().last_seq().unwrap_or(first);
                    let pruned = CursorError::Pruned {
                        first,
                        last,
                        epoch: c.epoch,
                    };
                    return Some((Err(pruned.into()), c));
                }
                Ok(page) => {
                    c.replaying = page.len() == c.batch;
                    c.page = page.into();
                }
                Err(e) => {
                    c.done = true;
                    return Some((Err(e.into()), c));
                }
            }
            continue;
        }
        if !c.follow {
            return None;
        }
        let woken = if *c.stopping.borrow() {
            Woken::Stopping
        } else {
            let deadline = c.deadline;
            let expired = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            // Biased, so a run on paused time replays exactly (an unbiased select draws from
            // the runtime's random seed); a shutdown or the maximum age wins over live events,
            // which stay in the log for the client's next stream.
            tokio::select! {
                biased;
                _ = c.stopping.changed() => continue,
                _ = expired => Woken::Expired,
                r = c.live.recv() => Woken::Live(r),
            }
        };
        let why = match woken {
            Woken::Live(Ok(e)) if e.seq <= c.sent => continue,
            Woken::Live(Ok(e)) if Some(e.seq) == c.sent.checked_add(1) => {
                c.sent = e.seq;
                return Some((Ok(e), c));
            }
            // A gap (published out of order with a concurrent commit) or lag: re-read.
            Woken::Live(Ok(_) | Err(RecvError::Lagged(_))) => {
                c.replaying = true;
                continue;
            }
            Woken::Live(Err(RecvError::Closed)) => return None,
            Woken::Stopping => StreamEnd::Stopping,
            Woken::Expired => StreamEnd::Expired,
        };
        c.done = true;
        let ended = AgentError::StreamEnded {
            why,
            sent: c.sent,
            epoch: c.epoch,
        };
        return Some((Err(ended), c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentParts, AttachRequest, ReconcilerConfig};
    use crate::domain::{
        FabricName, GrantPolicy, InstanceId, Membership, NodeId, PKeyValue, Partition, PortSelector,
    };
    use crate::embedded_fabric::{PersistError, SimFabric, SimPersistence};
    use crate::observe::embedded::EmbeddedObserver;
    use crate::sm::embedded::{EmbeddedConfig, EmbeddedSm};
    use crate::store::Store;
    use futures::StreamExt;
    use std::time::Duration;

    struct Nowhere;
    impl SimPersistence for Nowhere {
        fn load(&self) -> Option<Vec<Vec<u16>>> {
            None
        }
        fn save(&self, _: &[Vec<u16>]) -> Result<(), PersistError> {
            Ok(())
        }
    }

    async fn agent(retain: u64) -> Agent {
        let fabric = Arc::new(SimFabric::new(
            "node1",
            2,
            64,
            PKeyValue::DEFAULT_LIMITED,
            Box::new(Nowhere),
        ));
        let fab = FabricName::parse("fab1").unwrap();
        let agent = Agent::new(AgentParts {
            node_id: NodeId::parse("node1").unwrap(),
            fabric: fab.clone(),
            grants: GrantPolicy::off(fab),
            store: Arc::new(Store::in_memory(retain).unwrap()),
            sm: Arc::new(EmbeddedSm::new(fabric.clone(), &EmbeddedConfig::default())),
            observer: Arc::new(EmbeddedObserver::new(fabric, Duration::from_secs(60))),
            observer_reason: "test".into(),
            selector: PortSelector::default(),
            reconciler: ReconcilerConfig::default(),
            released_retain: Duration::from_secs(3600),
            allow_full_default: false,
            clock: Arc::new(crate::agent::SystemClock),
        })
        .unwrap();
        agent.read_ports().await.unwrap();
        agent
    }

    async fn attach(agent: &Agent, n: u16) {
        let request = AttachRequest {
            instance_id: InstanceId::parse(&format!("i-{n}")).unwrap(),
            // One partition for every instance: a port carries one partition at a time.
            partition: Partition::new("ibpart_1", "p1", "ws", "acct", "fab1", 0x101).unwrap(),
            membership: Membership::Full,
            grant: None,
            ports: Vec::new(),
        };
        agent.attach(request, None).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_maximum_age_wins_over_a_pending_live_event() {
        let agent = agent(1000).await;
        attach(&agent, 1).await;
        let mut stream = agent
            .watch(WatchFrom {
                after: 0,
                epoch: None,
                follow: true,
                batch: 64,
                max_age: Some(Duration::from_secs(1)),
            })
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().seq, 1);
        // Both are ready at the next poll: the age reached and a live event. The end wins,
        // every time (the event stays in the log for the next stream).
        tokio::time::advance(Duration::from_secs(2)).await;
        attach(&agent, 2).await;
        match stream.next().await {
            Some(Err(AgentError::StreamEnded {
                why: StreamEnd::Expired,
                sent: 1,
                ..
            })) => {}
            other => panic!("the stream must end at its maximum age, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_stream_held_behind_pruning_gets_out_of_range_never_a_skip() {
        // Each attach appends one event (no reconciler runs); the log keeps the newest 3.
        let agent = agent(3).await;
        attach(&agent, 1).await;
        let from = WatchFrom {
            after: 0,
            epoch: None,
            follow: true,
            batch: 1,
            max_age: None,
        };
        let mut stream = agent.watch(from.clone()).unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().seq, 1);
        // The consumer stops reading; the log moves on past retention beneath it.
        for n in 2..=8 {
            attach(&agent, n).await;
        }
        assert_eq!(agent.store().event_bounds().unwrap(), (6, 8));
        match stream.next().await {
            Some(Err(AgentError::Cursor(CursorError::Pruned { first, last, .. }))) => {
                assert_eq!((first, last), (6, 8));
            }
            other => panic!("held stream must end OUT_OF_RANGE, got {other:?}"),
        }
        assert!(
            stream.next().await.is_none(),
            "the stream ends after the error"
        );
        // A stream that keeps up is not affected: it reads 6..=8, then follows live.
        let mut caught_up = agent.watch(WatchFrom { after: 5, ..from }).unwrap();
        for seq in 6..=8 {
            assert_eq!(caught_up.next().await.unwrap().unwrap().seq, seq);
        }
        attach(&agent, 9).await;
        assert_eq!(caught_up.next().await.unwrap().unwrap().seq, 9);
    }

    /// `after_seq = 0` ("processed nothing yet") replays from seq 1; once seq 1 is pruned it is
    /// refused like any pruned cursor (the proto's WatchEventsRequest.after_seq), never a
    /// silent start at the oldest retained event; `first_event_seq - 1` replays what is kept.
    #[tokio::test]
    async fn after_seq_zero_is_from_seq_one_and_out_of_range_once_it_was_pruned() {
        let agent = agent(3).await;
        attach(&agent, 1).await;
        let from = WatchFrom {
            after: 0,
            epoch: None,
            follow: false,
            batch: 64,
            max_age: None,
        };
        let mut whole = agent.watch(from.clone()).unwrap();
        assert_eq!(whole.next().await.unwrap().unwrap().seq, 1);
        for n in 2..=5 {
            attach(&agent, n).await;
        }
        let (first, last) = agent.store().event_bounds().unwrap();
        assert_eq!((first, last), (3, 5));
        match agent.watch(from.clone()) {
            Err(AgentError::Cursor(e @ CursorError::Pruned { .. })) => {
                let message = e.to_string();
                assert!(message.contains("events up to 2 were pruned"), "{message}");
                assert!(message.contains("after_seq = 5"), "{message}");
            }
            Err(other) => {
                panic!("after_seq = 0 on a pruned log must be OUT_OF_RANGE, got {other:?}")
            }
            Ok(_) => panic!("after_seq = 0 on a pruned log must be OUT_OF_RANGE, got a stream"),
        }
        let mut kept = agent
            .watch(WatchFrom {
                after: first - 1,
                ..from
            })
            .unwrap();
        let mut seqs = Vec::new();
        while let Some(e) = kept.next().await {
            seqs.push(e.unwrap().seq);
        }
        assert_eq!(seqs, [3, 4, 5]);
    }
}
