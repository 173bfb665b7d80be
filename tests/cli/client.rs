//! The CLI's typed client (`fabric_agent::api::agent_v1::client::AgentClient`) against the real
//! daemon: answers are the protocol's messages, a refusal keeps its code and its
//! `fabric-error-reason` trailer, listing follows every page, and events stream in order.

use testkit::common;

use common::{attach, attach_on, partition, Daemon};
use fabric_agent::api::agent_v1::client::{AgentClient, StatusCode};
use fabric_agent::proto::agent as pb;
use std::time::Duration;

#[tokio::test]
async fn refusals_keep_their_code_and_reason() {
    let d = Daemon::start("");
    let mut c = AgentClient::unix(&d.socket).await.unwrap();
    assert_eq!(c.node().await.unwrap().fabric, "fab1");
    let a = c
        .attach(attach("i-1", partition("ibpart_a", 0x0a12), Some(10_000)))
        .await
        .unwrap();
    let state = a.attachment.map(|a| a.state);
    assert_eq!(state, Some(pb::AttachmentState::Active as i32));

    let mut elsewhere = partition("ibpart_x", 0x0b00);
    elsewhere.fabric = "fab2".into();
    let e = c.attach(attach("i-2", elsewhere, None)).await.unwrap_err();
    assert_eq!(e.code, StatusCode::FailedPrecondition, "{e}");
    assert_eq!(e.reason.as_deref(), Some("WRONG_FABRIC"), "{e}");
    assert!(!e.is_unreachable());

    let e = c
        .attach(attach("i-1", partition("ibpart_c", 0x0c00), None))
        .await
        .unwrap_err();
    assert_eq!(e.code, StatusCode::FailedPrecondition, "{e}");
    assert_eq!(e.reason.as_deref(), Some("INSTANCE_IN_OTHER_PARTITION"));

    let e = c
        .attach(attach("i 2", partition("ibpart_c", 0x0c00), None))
        .await;
    let e = e.unwrap_err();
    assert_eq!(e.code, StatusCode::InvalidArgument, "{e}");
    assert_eq!(e.reason.as_deref(), Some("INVALID"));
    assert!(e.message.contains("instance_id"), "{e}");
    assert!(e.to_string().starts_with("INVALID_ARGUMENT: "), "{e}");
}

#[tokio::test]
async fn listing_follows_every_page_and_events_stream_in_order() {
    // Five ports, one partition on each (a port carries one partition at a time).
    let d = Daemon::start(
        "[limits]\nlist_default_page_size = 2\nlist_max_page_size = 50\n\
         [subnet_manager.embedded]\nports = 5\n",
    );
    let mut c = AgentClient::unix(&d.socket).await.unwrap();
    for i in 0..5u32 {
        c.attach(attach_on(
            &format!("i-{i}"),
            partition(&format!("ibpart_{i}"), 0x0100 + i),
            &[&format!("sim0/{}", i + 1)],
            None,
        ))
        .await
        .unwrap();
    }
    let all = c.list(pb::ListAttachmentsRequest::default()).await.unwrap();
    let mut ids: Vec<&str> = all.iter().map(|a| a.instance_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["i-0", "i-1", "i-2", "i-3", "i-4"]);

    let mut stream = c
        .events(pb::WatchEventsRequest {
            no_follow: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seqs = Vec::new();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the replay ends")
    {
        seqs.push(ev.unwrap().seq);
    }
    assert!(seqs.len() >= 5, "{seqs:?}");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
}

#[tokio::test]
async fn a_cursor_beyond_the_log_is_out_of_range() {
    let d = Daemon::start("");
    let mut c = AgentClient::unix(&d.socket).await.unwrap();
    let last = c.node().await.unwrap().last_event_seq;
    let answer = c
        .events(pb::WatchEventsRequest {
            after_seq: last + 1000,
            no_follow: true,
            ..Default::default()
        })
        .await;
    let e = match answer {
        Err(e) => e,
        Ok(mut stream) => stream
            .next()
            .await
            .expect("an error, not a clean end")
            .unwrap_err(),
    };
    assert_eq!(e.code, StatusCode::OutOfRange, "{e}");
    assert_eq!(e.reason.as_deref(), Some("LOG_BEYOND_NEWEST"), "{e}");
}

#[tokio::test]
async fn a_missing_socket_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = AgentClient::unix(&dir.path().join("absent.sock"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("absent.sock"), "{e}");
}
