//! WatchEvents: replay from the durable log, then follow live events, without gaps or
//! duplicates. Subscribing to live events happens before the replay starts, and anything missed
//! while lagging is re-read from the log.

use super::{Agent, AgentError};
use crate::domain::Event;
use tokio::sync::{broadcast::error::RecvError, mpsc};

const PAGE: usize = 512;

pub(super) fn start(
    agent: Agent,
    after: u64,
    follow: bool,
) -> Result<mpsc::Receiver<Result<Event, AgentError>>, AgentError> {
    let (first, last) = agent.store().event_bounds()?;
    if first > 0 && after + 1 < first {
        return Err(AgentError::OutOfRange(format!(
            "events up to {} were pruned (oldest retained is {first}, newest {last}); resynchronise with \
             ListAttachments and watch from {last}",
            first - 1
        )));
    }
    let mut live = agent.shared.events.subscribe();
    let mut stopping = agent.shared.stopping.subscribe();
    let (tx, rx) = mpsc::channel(PAGE);
    tokio::spawn(async move {
        let mut sent = after;
        loop {
            // Replay (or catch up after lagging) from the log.
            loop {
                let page = match agent.store().events_after(sent, PAGE) {
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
                if n < PAGE {
                    break;
                }
            }
            if !follow {
                return;
            }
            loop {
                let stop_now = *stopping.borrow();
                let received = if stop_now {
                    None
                } else {
                    tokio::select! {
                        r = live.recv() => Some(r),
                        _ = stopping.changed() => continue,
                    }
                };
                let Some(received) = received else {
                    let _ = tx
                        .send(Err(AgentError::Unavailable(format!(
                            "agent is shutting down; resume with after_seq = {sent}"
                        ))))
                        .await;
                    return;
                };
                match received {
                    Ok(e) if e.seq <= sent => continue,
                    Ok(e) if e.seq == sent + 1 => {
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
