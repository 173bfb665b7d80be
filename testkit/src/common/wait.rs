//! Polling with a deadline: every wait of the tests ends, with the last thing it saw in the
//! panic message when it times out.

use super::calls::{get, node};
use super::state;
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// How long a fabric test waits for agents and OpenSM to converge.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// Polls `instance` every 20 ms until `done` holds or `limit` has passed; returns the last
/// attachment seen either way (the caller asserts on it).
pub async fn poll_attachment(
    c: &mut FabricAgentClient<Channel>,
    instance: &str,
    limit: Duration,
    done: impl Fn(&pb::Attachment) -> bool,
) -> pb::Attachment {
    let deadline = Instant::now() + limit;
    loop {
        let a = get(c, instance).await;
        if done(&a) || Instant::now() > deadline {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `instance` (as [`poll_attachment`]) until `done` holds, panicking with its last state
/// after `limit`.
pub async fn wait_attachment(
    c: &mut FabricAgentClient<Channel>,
    instance: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&pb::Attachment) -> bool,
) -> pb::Attachment {
    let a = poll_attachment(c, instance, limit, &done).await;
    assert!(done(&a), "{instance}: timed out waiting for {what}: {a:?}");
    a
}

/// Waits up to `limit` for `instance` to be in state `s`.
pub async fn wait_state(
    c: &mut FabricAgentClient<Channel>,
    instance: &str,
    s: pb::AttachmentState,
    limit: Duration,
) {
    wait_attachment(c, instance, &format!("{s:?}"), limit, |a| state(a) == s).await;
}

/// Polls GetNode every 50 ms until `done` holds for the node view, panicking with the last view
/// after `limit`.
pub async fn until_node(
    c: &mut FabricAgentClient<Channel>,
    limit: Duration,
    what: &str,
    done: impl Fn(&pb::GetNodeResponse) -> bool,
) -> pb::GetNodeResponse {
    let end = Instant::now() + limit;
    loop {
        let n = node(c).await;
        if done(&n) {
            return n;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {n:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Awaits `check()` every 100 ms until it is true, panicking after `limit`.
pub async fn wait_until<F: Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Calls `done()` every 50 ms (blocking the thread) until it is true, panicking after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `cond()` becomes true within `limit` (checked every 50 ms, and once more at the end).
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}
