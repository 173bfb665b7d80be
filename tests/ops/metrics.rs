//! The Prometheus endpoint, scraped during an attach and a release: counters and histograms
//! move, state gauges follow, names follow Prometheus conventions.

use testkit::common;

use common::*;
use std::io::{Read, Write};

/// One scrape over plain HTTP/1.0: (content type, body).
fn scrape(port: u16) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (ctype, body.to_owned())
}

/// The value of the sample line that starts with `series` (name plus labels).
fn value(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_an_attach_and_a_release() {
    let port = free_port();
    let d = Daemon::start(&format!(
        "[metrics]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let (ctype, before) = scrape(port);
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(before.contains("fabric_agent_build_info{"), "{before}");
    assert!(before.trim_end().ends_with("# EOF"));
    // The start-up apply may not have happened yet: a counter with no sample yet is 0.
    let applies_before = before
        .lines()
        .find_map(|l| l.strip_prefix("fabric_agent_sm_applies_total{outcome=\"ok\"}"))
        .map_or(0.0, |v| v.trim().parse().unwrap());

    let mut c = d.client().await;
    attach_waiting(&mut c, "i-1", "ibpart_a", 0x12).await;
    let (_, mid) = scrape(port);
    assert_eq!(
        value(&mid, "fabric_agent_attachments{state=\"ACTIVE\"}"),
        1.0
    );
    assert_eq!(
        value(
            &mid,
            "fabric_agent_transition_seconds_count{transition=\"attach_to_active\"}"
        ),
        1.0
    );
    assert!(value(&mid, "fabric_agent_sm_applies_total{outcome=\"ok\"}") > applies_before);
    assert!(value(&mid, "fabric_agent_observer_reads_total{outcome=\"ok\"}") >= 1.0);
    assert_eq!(value(&mid, "fabric_agent_sm_reachable"), 1.0);
    assert_eq!(value(&mid, "fabric_agent_in_doubt_keys"), 0.0);
    assert_eq!(
        value(
            &mid,
            "fabric_agent_port_pkey_entries{device=\"sim0\",port=\"1\"}"
        ),
        2.0,
        "the default partition and the key"
    );

    release(&mut c, "i-1", Some(5000)).await;
    let (_, after) = scrape(port);
    assert_eq!(
        value(&after, "fabric_agent_attachments{state=\"RELEASED\"}"),
        1.0
    );
    assert_eq!(
        value(&after, "fabric_agent_attachments{state=\"ACTIVE\"}"),
        0.0
    );
    assert_eq!(
        value(
            &after,
            "fabric_agent_transition_seconds_count{transition=\"release_to_released\"}"
        ),
        1.0
    );
    let sum = value(
        &after,
        "fabric_agent_transition_seconds_sum{transition=\"release_to_released\"}",
    );
    assert!(sum > 0.0 && sum < 5.0, "{sum}");
    assert_eq!(value(&after, "fabric_agent_oldest_releasing_seconds"), 0.0);
    assert!(value(&after, "fabric_agent_event_log_last_seq") >= 4.0);
}
