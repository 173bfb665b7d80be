//! Group commit: requests that arrive while a commit is in flight join the next one, so a burst
//! of hundreds costs a handful of commits while a lone request goes out at once. A queue of
//! waiters and a linger; it knows nothing of what a commit does.
//!
//! A caller first takes [`GroupCommit::arriving`] (counted until its request is ready to
//! join), then [`GroupCommit::join`]s with a tag and waits for its answer; the one that finds no
//! commit running starts the loop, which takes groups with [`GroupCommit::next_group`] until the
//! queue is empty. A group is taken only after its requests' changes were made, so the commit
//! that answers a waiter always carries that waiter's change.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// One waiter: its tag and where its answer goes.
pub type Waiter<T, R> = (T, oneshot::Sender<R>);

/// The queue of waiters for the next commit and the linger that lets a burst share it.
pub struct GroupCommit<T, R> {
    linger: Duration,
    linger_max: Duration,
    queue: Mutex<Queue<T, R>>,
    /// Requests arrived since start: the linger watches it for a burst.
    arrivals: AtomicU64,
    /// Requests between their arrival and their place in the queue (or their refusal).
    admitting: AtomicUsize,
}

struct Queue<T, R> {
    pending: Vec<Waiter<T, R>>,
    running: bool,
}

/// Counts one request as arriving until dropped.
pub struct Arriving<'a>(&'a AtomicUsize);

impl Drop for Arriving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T, R> GroupCommit<T, R> {
    /// A group waits for the next request of a burst up to `linger` after the last one, at most
    /// `linger_max` in all (zero: taken at once).
    pub fn new(linger: Duration, linger_max: Duration) -> Self {
        GroupCommit {
            linger,
            linger_max,
            queue: Mutex::new(Queue {
                pending: Vec::new(),
                running: false,
            }),
            arrivals: AtomicU64::new(0),
            admitting: AtomicUsize::new(0),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<T, R>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request as arrived, and as being admitted until the guard is dropped.
    pub fn arriving(&self) -> Arriving<'_> {
        self.admitting.fetch_add(1, Ordering::SeqCst);
        self.arrivals.fetch_add(1, Ordering::SeqCst);
        Arriving(&self.admitting)
    }

    /// Queues a waiter for the next commit. Returns where its answer comes, and whether no
    /// commit loop was running (the caller starts one).
    pub fn join(&self, tag: T) -> (oneshot::Receiver<R>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut q = self.queue();
        q.pending.push((tag, tx));
        let start = !std::mem::replace(&mut q.running, true);
        (rx, start)
    }

    /// Takes every queued waiter and marks no loop running (the backend was shut down and its
    /// loop aborted): dropping them answers their callers with an error.
    pub fn abandon(&self) -> Vec<Waiter<T, R>> {
        let mut q = self.queue();
        q.running = false;
        std::mem::take(&mut q.pending)
    }

    /// The loop's next group, after the linger; `None` when the queue is empty (the loop ends,
    /// and the next [`GroupCommit::join`] starts another).
    pub async fn next_group(&self) -> Option<Vec<Waiter<T, R>>> {
        self.wait_for_burst().await;
        let mut q = self.queue();
        if q.pending.is_empty() {
            q.running = false;
            return None;
        }
        Some(std::mem::take(&mut q.pending))
    }

    /// While requests keep arriving (one within every `linger`) or are still being admitted,
    /// waits for them, up to `linger_max`, so a burst shares one commit instead of its first
    /// request going out alone. A lone request waits one `linger`.
    async fn wait_for_burst(&self) {
        if self.linger.is_zero() {
            return;
        }
        let until = tokio::time::Instant::now() + self.linger_max;
        let mut seen = self.arrivals.load(Ordering::SeqCst);
        loop {
            let wake = (tokio::time::Instant::now() + self.linger).min(until);
            tokio::time::sleep_until(wake).await;
            let now = self.arrivals.load(Ordering::SeqCst);
            let quiet = now == seen && self.admitting.load(Ordering::SeqCst) == 0;
            if quiet || wake >= until {
                return;
            }
            seen = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_joins_one_group_and_the_loop_ends_when_empty() {
        let g: GroupCommit<u32, u32> =
            GroupCommit::new(Duration::from_millis(5), Duration::from_millis(200));
        let (_a, start_a) = g.join(1);
        let (_b, start_b) = g.join(2);
        assert!(start_a && !start_b);
        let group = g.next_group().await.unwrap();
        assert_eq!(group.iter().map(|w| w.0).collect::<Vec<_>>(), [1, 2]);
        for (tag, tx) in group {
            tx.send(tag * 10).unwrap();
        }
        assert!(g.next_group().await.is_none());
        let (rx, start) = g.join(3);
        assert!(start);
        let group = g.next_group().await.unwrap();
        group.into_iter().for_each(|(t, tx)| tx.send(t).unwrap());
        assert_eq!(rx.await.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_linger_waits_for_a_request_still_arriving_up_to_its_maximum() {
        let g: GroupCommit<u32, ()> =
            GroupCommit::new(Duration::from_millis(5), Duration::from_millis(200));
        let _held = g.arriving();
        let _ = g.join(1);
        let t0 = tokio::time::Instant::now();
        let _ = g.next_group().await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
    }
}
