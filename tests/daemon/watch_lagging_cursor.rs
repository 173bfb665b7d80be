//! WatchEvents over gRPC with a follower that stops reading while more than `retain` events are
//! written (retention prunes the log behind it). When it reads again it gets events in order,
//! one seq after the other, and either every one of them (what the daemon had sent ahead: the
//! client's HTTP/2 window, tonic's encode buffer and hyper's send buffer of up to 400 KiB per
//! stream, enough for this test's log) or, where its next event was pruned first,
//! OUT_OF_RANGE (`LOG_PRUNED`): never a skip ahead, never a duplicate.

use testkit::common;

use common::*;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Code;

/// A client whose HTTP/2 windows stay at the protocol's initial 64 KiB (tonic's default
/// client asks for megabytes, enough to take the whole test's log before pruning).
async fn small_window_client(socket: &std::path::Path) -> FabricAgentClient<Channel> {
    let socket = socket.to_owned();
    let channel = Endpoint::from_static("http://localhost")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .http2_adaptive_window(false)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = socket.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .expect("connect");
    FabricAgentClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_follower_gets_every_event_in_order_or_out_of_range_never_a_skip() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::prepare(
        tmp.path(),
        "[subnet_manager.embedded]\nports = 1\n[events]\nretain = 1000\n",
    );
    d.spawn(&[]);
    let mut c = d.client().await;
    let p = partition("ibpart_p0", 0x12);
    attach_now(&mut c, attach("i-0", p.clone(), None)).await;
    // A follower reads its first event, then stops reading.
    let mut follower = small_window_client(&d.socket).await;
    let mut s = watch(&mut follower, 0, true).await;
    let first = s.next().await.expect("an event").expect("event");
    assert_eq!(first.seq, 1);
    // More than `retain` events while it does not read: the oldest are pruned.
    let mut id = 0;
    while node(&mut c).await.last_event_seq < 1_200 {
        id += 1;
        let name = format!("i-{id}");
        attach_now(&mut c, attach(&name, p.clone(), None)).await;
        release(&mut c, &format!("i-{}", id - 1), None).await;
    }
    let newest = node(&mut c).await.last_event_seq;
    // It reads again: consecutive seqs from 2, up to the newest or OUT_OF_RANGE.
    let mut next = 2;
    let end = loop {
        match tokio::time::timeout(std::time::Duration::from_secs(3), s.next()).await {
            Ok(Some(Ok(e))) => {
                assert_eq!(e.seq, next, "an event skipped ahead of the cursor");
                next += 1;
            }
            Ok(Some(Err(status))) => break Some(status),
            Ok(None) => panic!("the stream ended without an error after seq {}", next - 1),
            // Caught up and following.
            Err(_) => break None,
        }
    };
    match end {
        None => assert!(next > newest, "stalled after seq {} of {newest}", next - 1),
        Some(status) => {
            assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
            assert_eq!(
                status
                    .metadata()
                    .get("fabric-error-reason")
                    .and_then(|v| v.to_str().ok()),
                Some("LOG_PRUNED"),
                "{status:?}"
            );
        }
    }
    eprintln!(
        "lagging follower: read seqs 1..={} of {newest} in order",
        next - 1
    );
    assert!(d.stop().success());
}
