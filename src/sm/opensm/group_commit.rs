//! Group commit: requests that arrive while a commit is in flight join the next one, so a burst
//! of hundreds costs a handful of commits while a lone request goes out at once. A queue of
//! waiters and a linger; it knows nothing of what a commit does.
//!
//! A caller first takes [`GroupCommit::arriving`] (counted until its request is ready to
//! join), then [`GroupCommit::join`]s with a tag and waits for its answer; the one that finds no
//! commit running starts the loop, which takes groups with [`GroupCommit::next_group`] until the
//! queue is empty. A group is taken only after its requests' changes were made, so the commit
//! that answers a waiter always carries that waiter's change.
//!
//! [`NodePace`] bounds how often one node's changes may go in: a node whose set changes faster
//! than its interval has its requests held before admission until its next slot, and every
//! request that arrives meanwhile waits for that same slot, so they enter one commit together.
//! Nothing is lost (each request is still admitted and answered by the commit that carries it,
//! never before) and other nodes never wait for it.

use std::collections::HashMap;
use std::hash::Hash;
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

/// Per-node slots for admission, at most one per `interval` (see the module doc).
pub struct NodePace<K> {
    interval: Duration,
    /// Each node's last granted slot (possibly still ahead).
    slots: Mutex<HashMap<K, tokio::time::Instant>>,
}

/// Slots kept before the past ones are pruned.
const PRUNE_ABOVE: usize = 4096;

impl<K: Hash + Eq + Clone> NodePace<K> {
    /// One slot per node per `interval` (zero: no pacing).
    pub fn new(interval: Duration) -> Self {
        NodePace {
            interval,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// When `node`'s request may be admitted: at once when its last slot is an interval ago,
    /// else the pending slot (joined) or the next one.
    fn slot(&self, node: &K) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() > PRUNE_ABOVE {
            let interval = self.interval;
            slots.retain(|_, last| *last + interval > now);
        }
        let at = match slots.get(node) {
            Some(&last) if last > now => return last,
            Some(&last) if last + self.interval > now => last + self.interval,
            _ => now,
        };
        slots.insert(node.clone(), at);
        at
    }

    /// Waits for `node`'s slot.
    pub async fn wait(&self, node: &K) {
        if self.interval.is_zero() {
            return;
        }
        let at = self.slot(node);
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fast_node_waits_for_its_slot_and_its_burst_shares_one_while_others_go_at_once() {
        let pace: NodePace<&str> = NodePace::new(Duration::from_secs(1));
        let t0 = tokio::time::Instant::now();
        pace.wait(&"a").await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // a's next three arrive within the interval: all wait for the same next slot.
        let burst = futures::future::join_all((0..3).map(|_| async {
            pace.wait(&"a").await;
            t0.elapsed()
        }));
        let other = async {
            pace.wait(&"b").await;
            t0.elapsed()
        };
        let (burst, other) = tokio::join!(burst, other);
        assert_eq!(burst, vec![Duration::from_secs(1); 3]);
        assert_eq!(other, Duration::ZERO, "another node is not held");
        // Once an interval has passed since a's slot, a goes at once again.
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = tokio::time::Instant::now();
        pace.wait(&"a").await;
        assert_eq!(t1.elapsed(), Duration::ZERO);
    }

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
