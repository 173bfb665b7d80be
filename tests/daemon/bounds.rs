//! Event-log identity and resource bounds, with the real daemon as a child process: a cursor
//! from a wiped state directory gets OUT_OF_RANGE, ListAttachments pages stay consistent while
//! attachments are created, and streams beyond the limit get RESOURCE_EXHAUSTED.

use testkit::common;

use common::*;
use fabric_agent::proto::agent as pb;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tonic::Code;

fn watch_from(after_seq: u64, log_epoch: Option<&str>) -> pb::WatchEventsRequest {
    pb::WatchEventsRequest {
        after_seq,
        no_follow: true,
        log_epoch: log_epoch.map(str::to_owned),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_a_wiped_state_directory_gets_out_of_range() {
    let tmp = tempfile::tempdir().unwrap();
    // Three ports, one partition on each (a port carries one partition at a time).
    let mut d = Daemon::prepare(tmp.path(), "[subnet_manager.embedded]\nports = 3\n");
    d.spawn(&[]);
    let mut c = d.client().await;
    for (i, pkey) in [(1, 0x12), (2, 0x13), (3, 0x14)] {
        c.attach_partition(attach_on(
            &format!("i-{i}"),
            partition(&format!("ibpart_p{i}"), pkey),
            &[&format!("sim0/{i}")],
            Some(5000),
        ))
        .await
        .unwrap();
    }
    let old = node(&mut c).await;
    assert_eq!(old.log_epoch.len(), 32, "epoch is 32 hex digits");
    let old_events = events(&mut c, 0).await;
    assert!(old_events.len() >= 6);
    assert!(old_events.iter().all(|e| e.log_epoch == old.log_epoch));
    assert_eq!(old_events.last().unwrap().seq, old.last_event_seq);
    // The old cursor works against the old log, with and without its epoch.
    c.watch_events(watch_from(old.last_event_seq, Some(&old.log_epoch)))
        .await
        .expect("same epoch, newest seq");
    assert!(d.stop().success());

    // The state directory is wiped (a reinstalled node); the daemon starts a new log.
    std::fs::remove_dir_all(tmp.path().join("state")).unwrap();
    d.spawn(&[]);
    let mut c = d.client().await;
    let new = node(&mut c).await;
    assert_ne!(new.log_epoch, old.log_epoch, "a new store has a new epoch");
    assert!(new.last_event_seq < old.last_event_seq);

    // The control plane's old cursor, with its epoch: refused, with what to do instead.
    let e = c
        .watch_events(watch_from(old.last_event_seq, Some(&old.log_epoch)))
        .await
        .expect_err("old epoch");
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert_eq!(reason(&e), Some("LOG_OTHER_EPOCH"), "{e:?}");
    // The message carries the epoch to watch from.
    assert!(e.message().contains(&new.log_epoch), "{}", e.message());
    // Even an old epoch with a seq the new log has is another log's seq.
    let e = c
        .watch_events(watch_from(0, Some(&old.log_epoch)))
        .await
        .expect_err("old epoch, seq 0");
    assert_eq!(e.code(), Code::OutOfRange);

    // Without an epoch, a seq beyond the newest event is refused, and the message names the
    // newest seq and the epoch to watch from.
    let e = c
        .watch_events(watch_from(old.last_event_seq, None))
        .await
        .expect_err("beyond the newest");
    assert_eq!(e.code(), Code::OutOfRange);
    assert_eq!(reason(&e), Some("LOG_BEYOND_NEWEST"), "{e:?}");
    assert!(
        e.message()
            .contains(&format!("after_seq = {}", new.last_event_seq)),
        "{}",
        e.message()
    );
    // The top of the range never overflows, followed or not.
    for no_follow in [true, false] {
        let e = c
            .watch_events(pb::WatchEventsRequest {
                after_seq: u64::MAX,
                no_follow,
                log_epoch: None,
            })
            .await
            .expect_err("u64::MAX");
        assert_eq!(e.code(), Code::OutOfRange);
    }

    // Resynchronised: the new epoch and newest seq watch normally, and events carry the epoch.
    c.attach_partition(attach("i-9", partition("ibpart_p9", 0x19), Some(5000)))
        .await
        .unwrap();
    let mut s = c
        .watch_events(watch_from(new.last_event_seq, Some(&new.log_epoch)))
        .await
        .unwrap()
        .into_inner();
    let mut fresh = Vec::new();
    while let Some(e) = tokio_stream::StreamExt::next(&mut s).await {
        fresh.push(e.unwrap());
    }
    assert!(!fresh.is_empty());
    assert!(fresh.iter().all(|e| e.log_epoch == new.log_epoch));
    assert_eq!(fresh[0].seq, new.last_event_seq + 1);
    assert!(
        d.stop().success(),
        "the daemon survived every refused cursor"
    );
}

/// Attaches instances `i-000`.. (`count` of them) to `p` without waiting; returns their ids.
async fn attach_numbered(
    c: &mut fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient<
        tonic::transport::Channel,
    >,
    count: usize,
    p: &pb::Partition,
) -> BTreeSet<String> {
    let ids: BTreeSet<String> = (0..count).map(|i| format!("i-{i:03}")).collect();
    for id in &ids {
        attach_now(c, attach(id, p.clone(), None)).await;
    }
    ids
}

/// Every page of ListAttachments with `page_size` (0: the daemon's default, 4 here), following
/// tokens.
async fn all_pages(
    c: &mut fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient<
        tonic::transport::Channel,
    >,
    page_size: u32,
) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = c
            .list_attachments(pb::ListAttachmentsRequest {
                page_size,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        let limit = if page_size == 0 { 4 } else { page_size };
        assert!(r.attachments.len() <= limit as usize);
        ids.extend(r.attachments.into_iter().map(|a| a.instance_id));
        if r.next_page_token.is_empty() {
            return (ids, pages);
        }
        token = r.next_page_token;
        // Slow the reader down so the writer interleaves.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_stay_consistent_while_attachments_are_created() {
    let d = Daemon::start("[limits]\nlist_default_page_size = 4\nlist_max_page_size = 50\n");
    let mut c = d.client().await;
    let p = partition("ibpart_shared", 0x21);
    let before = attach_numbered(&mut c, 40, &p).await;
    // A writer creates attachments sorting before, between and after the existing ones while
    // a reader pages through.
    let mut w = d.client().await;
    let writer = tokio::spawn(async move {
        for i in 0..30 {
            for id in [
                format!("a-{i:03}"),
                format!("i-{i:03}x"),
                format!("z-{i:03}"),
            ] {
                w.attach_partition(attach(&id, partition("ibpart_shared", 0x21), None))
                    .await
                    .unwrap();
            }
        }
    });
    let (ids, pages) = all_pages(&mut c, 7).await;
    writer.await.unwrap();
    assert!(pages >= 6, "{pages} pages");
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "no attachment is listed twice");
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "pages are in instance-id order"
    );
    let missing: Vec<&String> = before.iter().filter(|id| !unique.contains(id)).collect();
    assert!(missing.is_empty(), "skipped: {missing:?}");

    // After the writer: every attachment, across pages of the default size.
    let (all, pages) = all_pages(&mut c, 0).await;
    assert_eq!(all.len(), 40 + 90);
    assert_eq!(pages, 130usize.div_ceil(4));

    // Bad paging input is INVALID_ARGUMENT.
    for (size, token) in [(51, ""), (0, "not-a-token"), (0, "p1.41.0000000000000000")] {
        let e = c
            .list_attachments(pb::ListAttachmentsRequest {
                page_size: size,
                page_token: token.into(),
                ..Default::default()
            })
            .await
            .expect_err("bad page request");
        assert_eq!(e.code(), Code::InvalidArgument, "{size} {token:?}: {e:?}");
    }

    // The CLI still lists everything (it pages through).
    let out = cli(&d.socket, &["attachments", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().expect("a JSON array").len(), 130);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_limit_get_resource_exhausted() {
    let d = Daemon::start("[limits]\nmax_watch_streams = 3\n");
    let mut c = d.client().await;
    let follow = pb::WatchEventsRequest {
        after_seq: 0,
        no_follow: false,
        log_epoch: None,
    };
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(c.watch_events(follow.clone()).await.unwrap().into_inner());
    }
    let e = c
        .watch_events(follow.clone())
        .await
        .expect_err("a fourth stream");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_watch_streams"), "{}", e.message());
    // Unary calls are not streams: still answered.
    node(&mut c).await;

    // A client that goes away frees its slot.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.watch_events(follow.clone()).await {
            Ok(s) => {
                open.push(s.into_inner());
                break;
            }
            Err(e) if e.code() == Code::ResourceExhausted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the freed slot never came back: {e:?}"),
        }
    }
    assert_eq!(
        c.watch_events(follow).await.expect_err("full again").code(),
        Code::ResourceExhausted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_in_flight_limit_get_resource_exhausted() {
    let d = Daemon::start_with_fault(
        Some("unreachable"),
        "",
        "[limits]\nmax_in_flight_requests = 1\n",
    );
    // The subnet manager is unreachable: an attach waits its full 6 s in the handler. With one
    // slot, the attach itself may be the one refused if it arrives while a GetNode is being
    // served; it is idempotent, so it is sent again until it holds the slot.
    let send_attach = |socket: std::path::PathBuf| async move {
        let mut waiting = process::client(&socket).await;
        let started = Instant::now();
        let answer = waiting
            .attach_partition(attach("i-1", partition("ibpart_a", 0x12), Some(6000)))
            .await;
        (started, answer)
    };
    let mut held = tokio::spawn(send_attach(d.socket.clone()));
    let mut c = d.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        assert!(
            Instant::now() < deadline,
            "no request was refused while an attach was in progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        if held.is_finished() {
            let (_, answer) = held.await.unwrap();
            let e = answer.expect_err("the attach cannot finish before its 6 s wait");
            assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
            held = tokio::spawn(send_attach(d.socket.clone()));
            continue;
        }
        match c.get_node(pb::GetNodeRequest {}).await {
            Err(e) => break e,
            Ok(_) => continue,
        }
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_in_flight_requests"),
        "{}",
        refused.message()
    );
    let (started, a) = held.await.unwrap();
    let a = a.expect("the waiting attach is answered");
    assert!(started.elapsed() >= Duration::from_secs(6));
    assert_eq!(
        state(&a.into_inner().attachment.unwrap()),
        pb::AttachmentState::Pending
    );
    // The slot is free again.
    node(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_maximum_age_ends_with_its_resume_cursor() {
    let d = Daemon::start("[limits]\nwatch_max_age_secs = 1\n");
    let mut c = d.client().await;
    let n = node(&mut c).await;
    let mut s = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: n.last_event_seq,
            no_follow: false,
            log_epoch: Some(n.log_epoch.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    let end = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_stream::StreamExt::next(&mut s),
    )
    .await
    .expect("the stream ends within its age")
    .expect("an item");
    let e = end.expect_err("ends with a status");
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(reason(&e), Some("STREAM_ENDED"), "{e:?}");
    assert!(
        e.message().contains(&format!(
            "after_seq = {} and log_epoch = {}",
            n.last_event_seq, n.log_epoch
        )),
        "{}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_created_between_pages_appear_exactly_when_they_sort_after_the_cursor() {
    let d = Daemon::start("");
    let mut c = d.client().await;
    let p = partition("ibpart_shared", 0x21);
    let before = attach_numbered(&mut c, 20, &p).await;
    let first = c
        .list_attachments(pb::ListAttachmentsRequest {
            page_size: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let cursor = first.attachments.last().unwrap().instance_id.clone();
    assert_eq!(cursor, "i-004");
    // Created after the first page: before the cursor, between listed ones, after everything.
    let created: Vec<String> = (0..10)
        .flat_map(|i| {
            [
                format!("a-{i:03}"),
                format!("i-{i:03}x"),
                format!("z-{i:03}"),
            ]
        })
        .collect();
    for id in &created {
        c.attach_partition(attach(id, p.clone(), None))
            .await
            .unwrap();
    }
    let mut listed: Vec<String> = first
        .attachments
        .into_iter()
        .map(|a| a.instance_id)
        .collect();
    let mut token = first.next_page_token;
    while !token.is_empty() {
        let r = c
            .list_attachments(pb::ListAttachmentsRequest {
                page_size: 5,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        listed.extend(r.attachments.into_iter().map(|a| a.instance_id));
        token = r.next_page_token;
    }
    let expected: Vec<String> = before
        .iter()
        .cloned()
        .chain(created.into_iter().filter(|id| *id > cursor))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(listed, expected);
}

/// The agent's stable name for the refusal a status carries.
fn reason(e: &tonic::Status) -> Option<&str> {
    e.metadata()
        .get("fabric-error-reason")
        .and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_before_it_answers_is_audited_as_admitted_then_abandoned() {
    // The SM never answers, so the attach waits; the client gives up after 300 ms.
    let d = Daemon::start_with_fault(Some("unreachable"), "", "");
    let mut c = d.client().await;
    let mut request = tonic::Request::new(attach(
        "vm-abandoned",
        partition("ibpart_ab", 0x0a31),
        Some(10_000),
    ));
    request.set_timeout(Duration::from_millis(300));
    let e = c
        .attach_partition(request)
        .await
        .expect_err("client deadline");
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{e:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = d.log();
        let lines: Vec<_> = log
            .lines()
            .filter(|l| l.contains("fabric_agent::audit") && l.contains("vm-abandoned"))
            .collect();
        let admitted = lines.iter().any(|l| l.contains("phase=\"admitted\""));
        let abandoned = lines.iter().any(|l| l.contains("Abandoned"));
        if admitted && abandoned {
            break;
        }
        assert!(Instant::now() < deadline, "{lines:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The attach itself was stored before the client gave up: the admitted line is what says so.
    let a = get(&mut c, "vm-abandoned").await;
    assert_eq!(a.instance_id, "vm-abandoned");
}
