//! The agent's event log as a test reads it.

use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use tonic::transport::Channel;

/// The events after `after`: the log so far, then live ones too when `follow`.
pub async fn watch(
    c: &mut FabricAgentClient<Channel>,
    after: u64,
    follow: bool,
) -> tonic::Streaming<pb::Event> {
    c.watch_events(pb::WatchEventsRequest {
        after_seq: after,
        no_follow: !follow,
        ..Default::default()
    })
    .await
    .expect("watch")
    .into_inner()
}

/// Every event after `after`, without following.
pub async fn events(c: &mut FabricAgentClient<Channel>, after: u64) -> Vec<pb::Event> {
    use tokio_stream::StreamExt;
    let mut s = watch(c, after, false).await;
    let mut out = Vec::new();
    while let Some(e) = s.next().await {
        out.push(e.expect("event"));
    }
    out
}

/// The node (GetNode) and every event of its current log (its epoch, from its first seq),
/// without following.
pub async fn current_log(
    c: &mut FabricAgentClient<Channel>,
) -> (pb::GetNodeResponse, Vec<pb::Event>) {
    use tokio_stream::StreamExt;
    let n = super::calls::node(c).await;
    let stream = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: n.first_event_seq.saturating_sub(1),
            no_follow: true,
            log_epoch: Some(n.log_epoch.clone()),
        })
        .await
        .expect("watch the current log")
        .into_inner();
    let events: Vec<pb::Event> = stream.filter_map(Result::ok).collect().await;
    (n, events)
}

/// Asserts the sequence numbers are 1..=n without gaps or duplicates.
pub fn assert_gap_free(events: &[pb::Event]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.seq,
            i as u64 + 1,
            "event sequence has a gap or duplicate at index {i}"
        );
    }
}
