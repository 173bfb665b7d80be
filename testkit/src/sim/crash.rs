//! Crashes at await points: the agent dies exactly at the `n`-th poll of an apply (whatever
//! backend is behind it: the model SM, the SM host's link, the real UFM backend with its ledger
//! writes and requests) or of a command. Over many seeds every await point of those paths is
//! hit: the backend's future is frozen there and the agent is dropped around it.

use super::world::Shared;
use async_trait::async_trait;
use fabric_agent::domain::{Condition, NodeId, NodeMemberships};
use fabric_agent::sm::{ApplyOutcome, HostStoredSet, SmError, SubnetManager};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

/// The agent's backend with the armed crash (`World::apply_crash`) in front of it.
pub struct Crashable {
    /// The world the crash is armed in.
    pub world: Shared,
    /// The backend.
    pub inner: Arc<dyn SubnetManager>,
}

/// Polls `fut` at most `n - 1` times: `None` when it was not done by then (the `n`-th poll is
/// where the crash lands), else its output.
pub async fn poll_limited<F: Future>(fut: F, n: u32) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut polls = 0;
    std::future::poll_fn(|cx| {
        polls += 1;
        if polls >= n {
            return Poll::Ready(None);
        }
        fut.as_mut().poll(cx).map(Some)
    })
    .await
}

#[async_trait]
impl SubnetManager for Crashable {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let armed = self.world.lock().expect("world lock").apply_crash.take();
        let Some((n, crash)) = armed else {
            return self.inner.apply(desired, generation).await;
        };
        // Done before the n-th poll or not: the agent dies here, before it sees the answer.
        let _ = poll_limited(self.inner.apply(desired, generation), n).await;
        crash.notify_one();
        std::future::pending().await
    }

    async fn stored_sets(&self, node: &NodeId) -> Option<Vec<HostStoredSet>> {
        self.inner.stored_sets(node).await
    }

    fn conditions(&self) -> Vec<Condition> {
        self.inner.conditions()
    }
}
