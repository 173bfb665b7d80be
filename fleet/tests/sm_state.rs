//! A node's subnet manager as the fleet shows it: a manager that answers and refuses is
//! REFUSED, one that does not answer is UNREACHABLE, in the view, `status` (text and JSON) and
//! `watch`'s event lines; an agent too old to send the state is read from its `reachable` flag.
//! Against the in-process fake agent, then a real `fabric-agent` whose embedded subnet manager
//! is told to refuse, then to be unreachable.

mod common;

use common::agent::Agent;
use common::fake_agent::{self, FakeAgentState};
use common::{fake_sm, fleet, nodes_file, partition, wait_for};
use fabric_fleet::proto::agent::SubnetManagerState as S;
use fabric_fleet::sm_state::SmState;
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// `fabric-fleet` with `args`, run off the runtime's worker (the fakes serve on it meanwhile).
fn cli(nodes: &Path, store: &Path, args: &[&str]) -> std::process::Output {
    tokio::task::block_in_place(|| common::fleet_cli(nodes, store, args))
}

/// The SM column of `status`'s line for `node`, and the node's `subnet_manager` object of
/// `status -o json`.
fn status_of(nodes: &Path, store: &Path, node: &str) -> (String, serde_json::Value) {
    let out = cli(nodes, store, &["status"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split('\t').collect();
    let col = header
        .iter()
        .position(|h| *h == "SUBNET MANAGER")
        .unwrap_or_else(|| panic!("no SUBNET MANAGER column: {text}"));
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{node}\t")))
        .unwrap_or_else(|| panic!("no line for {node}: {text}"));
    let sm = line.split('\t').nth(col).unwrap().to_owned();
    let out = cli(nodes, store, &["status", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let json = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node)
        .unwrap_or_else(|| panic!("no {node} in {doc}"))["subnet_manager"]
        .clone();
    (sm, json)
}

fn sm_state(f: &fabric_fleet::Fleet, node: &str) -> (SmState, String) {
    f.with_view(|v| {
        v.nodes
            .get(node)
            .map(|n| (n.live.sm_state, n.live.sm_error.clone()))
            .unwrap_or_default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_unreachable_are_told_apart_and_an_old_agent_falls_back_to_its_flag() {
    let node = FakeAgentState::new("sm-1", "0x00000000000000c3");
    // GetNode already says REFUSED when the fleet first connects.
    node.set_sm(S::Refused as i32, false, "table full");
    let url = fake_agent::serve(node.clone(), std::future::pending()).await;
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let text = nodes_file(&[("sm-1", url)], &sm_url);
    let nodes = dir.path().join("nodes.toml");
    std::fs::write(&nodes, &text).unwrap();
    let f = fleet(&text, &dir.path().join("lib.redb"));
    let store = dir.path().join("cli.redb");
    let (col, json) = status_of(&nodes, &store, "sm-1");
    assert_eq!(col, "REFUSED (table full)");
    assert_eq!(json["state"], "REFUSED", "{json}");
    assert_eq!(json["reachable"], false, "{json}");
    assert_eq!(json["error"], "table full", "{json}");

    // Events move it, in the library's view as in the CLI's.
    for (state, reachable, error, want) in [
        (
            S::Unreachable as i32,
            false,
            "no answer within 5s",
            SmState::Unreachable,
        ),
        (S::Reachable as i32, true, "", SmState::Reachable),
        (
            S::Refused as i32,
            false,
            "bad credentials",
            SmState::Refused,
        ),
        // An agent older than the state: "not reachable" cannot be told apart, so unknown...
        (0, false, "connection refused", SmState::Unknown),
        // ... and "reachable" is reachable.
        (0, true, "", SmState::Reachable),
    ] {
        node.set_sm(state, reachable, error);
        wait_for(&format!("{want} in the view"), WAIT, || {
            (sm_state(&f, "sm-1") == (want, error.to_owned())).then_some(())
        })
        .await;
        let (col, json) = status_of(&nodes, &store, "sm-1");
        assert_eq!(json["state"], want.name(), "{json}");
        assert_eq!(json["reachable"], reachable, "{json}");
        let expected = if error.is_empty() {
            want.name().to_owned()
        } else {
            format!("{want} ({error})")
        };
        assert_eq!(col, expected);
    }

    // `watch` names the state of each SubnetManagerChanged. It prints what arrives after it
    // connected: port events until the first one shows, then the subnet manager's changes.
    let watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_fabric-fleet"))
        .arg("--nodes")
        .arg(&nodes)
        .arg("--store")
        .arg(dir.path().join("watch.redb"))
        .arg("watch")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("watch");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.unwrap()));
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        node.port_flap();
        match tokio::time::timeout(Duration::from_millis(200), lines.next_line()).await {
            Ok(line) => {
                assert!(line.unwrap().expect("a line").contains("port "));
                break;
            }
            Err(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "watch printed nothing"
            ),
        }
    }
    let changes = [
        (S::Refused as i32, false, "table full"),
        (S::Unreachable as i32, false, "no answer within 5s"),
        (S::Reachable as i32, true, ""),
        (0, false, "connection refused"),
    ];
    for (state, reachable, error) in changes {
        node.set_sm(state, reachable, error);
    }
    let mut seen = Vec::new();
    while seen.len() < changes.len() {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("watch prints the events")
            .unwrap()
            .expect("a line");
        let what = line.rsplit('\t').next().unwrap().to_owned();
        if what.starts_with("subnet manager") {
            seen.push(what);
        }
    }
    assert_eq!(
        seen,
        [
            "subnet manager fake REFUSED (table full)",
            "subnet manager fake UNREACHABLE (no answer within 5s)",
            "subnet manager fake REACHABLE",
            "subnet manager fake UNKNOWN (connection refused)",
        ]
    );
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_agent_whose_subnet_manager_refuses_is_refused_not_unreachable() {
    let agent = Agent::start("sm-r");
    let (_sm, sm_url) = fake_sm::start().await;
    let dir = tempfile::tempdir().unwrap();
    let text = nodes_file(&[("sm-r", agent.endpoint())], &sm_url);
    let nodes = dir.path().join("nodes.toml");
    std::fs::write(&nodes, &text).unwrap();
    let store = dir.path().join("cli.redb");
    let f = fleet(&text, &dir.path().join("lib.redb"));
    assert!(f.wait_settled(WAIT).await, "the node heard from");

    std::fs::write(agent.fault_file(), "refuse not today\n").unwrap();
    common::attach_no_wait(&f, "sm-r", "vm-r", &partition("ibpart_r", 0x51)).await;
    // The start-up apply was acknowledged; the attach's apply is the first that fails.
    let (state, error) = wait_for("a failed apply in the view", WAIT, || {
        let (s, e) = sm_state(&f, "sm-r");
        matches!(s, SmState::Refused | SmState::Unreachable).then_some((s, e))
    })
    .await;
    assert_eq!(state, SmState::Refused, "{error}");
    assert!(error.contains("not today"), "{error}");
    let (col, json) = status_of(&nodes, &store, "sm-r");
    assert!(
        col.starts_with("REFUSED (") && col.contains("not today"),
        "{col}"
    );
    assert_eq!(json["state"], "REFUSED", "{json}");

    // Now no answer at all: a new request is tried against it and comes back unreachable.
    std::fs::write(agent.fault_file(), "unreachable\n").unwrap();
    f.release("sm-r", "vm-r", None).await.expect("release");
    wait_for("UNREACHABLE in the view", WAIT, || {
        (sm_state(&f, "sm-r").0 == SmState::Unreachable).then_some(())
    })
    .await;
    let (col, json) = status_of(&nodes, &store, "sm-r");
    assert!(col.starts_with("UNREACHABLE"), "{col}");
    assert_eq!(json["state"], "UNREACHABLE", "{json}");
    f.shutdown().await;
}
