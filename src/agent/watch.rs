//! WatchEvents: replay from the durable log, then follow live events, without gaps or
//! duplicates. Subscribing to live events happens before the replay starts, and anything missed
//! while lagging is re-read from the log.
//!
//! A cursor from another log (another epoch) or beyond the newest event is refused with
//! OUT_OF_RANGE, so a control plane whose cursor predates a wiped state directory resynchronises
//! instead of waiting forever.
//!
//! Memory per stream is bounded whatever the consumer does: the replay reads at most `batch`
//! events at a time and hands them over a channel of [`CHANNEL`] slots; a consumer that stops
//! reading stops the producer at the channel (and HTTP/2 flow control stops the channel).

use super::{Agent, AgentError};
use crate::domain::Event;
use tokio::sync::{broadcast::error::RecvError, mpsc};

/// Events queued between a stream's producer and its gRPC response.
pub const CHANNEL: usize = 16;

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

pub(super) fn start(
    agent: Agent,
    from: WatchFrom,
) -> Result<mpsc::Receiver<Result<Event, AgentError>>, AgentError> {
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
    let resync = format!(
        "resynchronise with ListAttachments, then watch with after_seq = {last} and log_epoch = {epoch}"
    );
    if let Some(e) = &client_epoch {
        if !e.eq_ignore_ascii_case(&epoch.to_string()) {
            return Err(AgentError::OutOfRange(format!(
                "log_epoch {e:?} is not this agent's event log {epoch} (its state directory was \
                 wiped or replaced, and sequence numbers restarted); {resync}"
            )));
        }
    }
    if after > last {
        return Err(AgentError::OutOfRange(format!(
            "after_seq {after} is beyond the newest event {last} of log {epoch} (the log restarted, \
             e.g. a wiped state directory); {resync}"
        )));
    }
    let (first, _) = agent.store().event_bounds()?;
    if first > 0 && after.saturating_add(1) < first {
        return Err(AgentError::OutOfRange(format!(
            "events up to {} were pruned (oldest retained is {first}, newest {last}); {resync}",
            first - 1
        )));
    }
    let mut live = agent.shared.events.subscribe();
    let mut stopping = agent.shared.stopping.subscribe();
    let (tx, rx) = mpsc::channel(CHANNEL);
    let deadline = max_age.map(|d| tokio::time::Instant::now() + d);
    tokio::spawn(async move {
        let expired = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        let mut sent = after;
        loop {
            // Replay (or catch up after lagging) from the log.
            loop {
                let page = match agent.store().events_after(sent, batch) {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
                let n = page.len();
                for e in page {
                    sent = e.seq;
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                if n < batch {
                    break;
                }
            }
            if !follow {
                return;
            }
            loop {
                let stop_now = *stopping.borrow();
                let received = if stop_now {
                    Err("agent is shutting down")
                } else {
                    tokio::select! {
                        r = live.recv() => Ok(r),
                        _ = stopping.changed() => continue,
                        // The client went away: end now rather than at the next event.
                        _ = tx.closed() => return,
                        _ = &mut expired => Err("stream reached its maximum age ([limits] watch_max_age_secs)"),
                    }
                };
                let received = match received {
                    Ok(r) => r,
                    Err(why) => {
                        let _ = tx
                            .send(Err(AgentError::Unavailable(format!(
                                "{why}; resume with after_seq = {sent} and log_epoch = {epoch}"
                            ))))
                            .await;
                        return;
                    }
                };
                match received {
                    Ok(e) if e.seq <= sent => continue,
                    Ok(e) if Some(e.seq) == sent.checked_add(1) => {
                        sent = e.seq;
                        if tx.send(Ok(e)).await.is_err() {
                            return;
                        }
                    }
                    // A gap (published out of order with a concurrent commit) or lag: re-read.
                    Ok(_) | Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    });
    Ok(rx)
}
