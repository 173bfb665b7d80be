//! Checks against a real OpenSM 3.3 on a small ibsim fabric (umad2sim shim): the backend's file
//! is accepted and the keys reach the ports, and the parser's accept/reject verdict matches
//! OpenSM's on tricky files. Skipped (with a message) when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use fabric_agent::domain::{Membership, NodeMemberships};
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::reload::verdict;
use fabric_agent::sm::opensm::OwnershipConfig;
use fabric_agent::sm::opensm::{InMemoryNodeStore, OpenSmBackend, OpenSmConfig, ReloadMethod};
use rig::{Fabric, FabricOptions, FabricSpec, SM_HOST};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn node(id: &str, guid: u64, keys: &[(u32, Membership)]) -> NodeMemberships {
    common::memberships(id, [guid], keys.iter().copied(), |k| format!("tenant{k:x}"))
}

/// Waits up to 10 s for `f`, panicking with `what` after.
fn wait_until(what: &str, f: impl FnMut() -> bool) {
    common::wait_for(what, Duration::from_secs(10), f);
}

const OPERATOR_PART: &str = "# operator's part: kept byte for byte\nstorage=0x0100, ipoib : ALL_SWITCHES=full, SELF=full;\n";

/// The backend's config for the rig's OpenSM.
fn config_for(fabric: &Fabric) -> OpenSmConfig {
    OpenSmConfig {
        partitions_file: fabric.partitions_path(),
        log_file: fabric.opensm_log_path(),
        pid_file: Some(fabric.opensm_pid_path()),
        ownership: OwnershipConfig::disabled(),
        ..OpenSmConfig::default()
    }
}

/// A backend of the SM host on `config`, its store in memory.
fn backend(config: OpenSmConfig) -> OpenSmBackend {
    OpenSmBackend::new(
        config,
        SM_HOST.into(),
        Arc::new(InMemoryNodeStore::default()),
    )
    .unwrap()
}

/// Stores `desired` at `generation` and checks OpenSM was seen re-reading the file.
async fn set_and_see_reread(backend: &OpenSmBackend, desired: NodeMemberships, generation: u64) {
    let out = backend.set_node(desired, generation).await.unwrap();
    assert!(
        out.detail.contains("re-read it without error"),
        "{}",
        out.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_file_is_accepted_and_keys_reach_the_ports() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR_PART) else {
        return;
    };
    let g2 = fabric.node_info("node1").port_guid;
    let g3 = fabric.node_info("node2").port_guid;
    let config = OpenSmConfig {
        reload: ReloadMethod::Sighup,
        reload_check_ms: 2000,
        ..config_for(&fabric)
    };
    let backend = backend(config);

    let started = Instant::now();
    // OpenSM's re-read is seen (file access time) well before the 2 s watch window ends.
    set_and_see_reread(
        &backend,
        node("node1", g2, &[(0x0a12, Membership::Full)]),
        1,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    backend
        .set_node(
            node(
                "node2",
                g3,
                &[(0x0a12, Membership::Limited), (0x0b00, Membership::Full)],
            ),
            1,
        )
        .await
        .unwrap();
    let text = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(text.starts_with(OPERATOR_PART), "{text}");
    let conf = parse(text.as_bytes()).unwrap();
    assert!(conf.has_explicit_default());

    wait_until("node1 to hold 0x8a12", || {
        fabric.pkeys("node1").contains(&0x8a12)
    });
    wait_until("node2 to hold 0x0a12 and 0x8b00", || {
        let t = fabric.pkeys("node2");
        t.contains(&0x0a12) && t.contains(&0x8b00)
    });
    // The region's Default entry gives tenant ports limited default membership.
    assert!(fabric.pkeys("node1").contains(&0x7fff));

    // Releasing every key keeps a loadable file and removes the key from the port.
    backend.set_node(node("node2", g3, &[]), 2).await.unwrap();
    wait_until("node2 to drop 0x0a12", || {
        !fabric.pkeys("node2").contains(&0x0a12)
    });
    let log = fabric.opensm_log();
    assert!(!log.contains("PARSE ERROR"), "{log}");
    assert!(!log.contains("in error"), "{log}");
    assert!(backend.sweeps() >= 3);
}

/// Files whose fate is not obvious: the parser must agree with OpenSM on each one.
fn tricky_files() -> Vec<(&'static str, String)> {
    let long_pad = " ".repeat(4094 - 20);
    vec![
        (
            "plain",
            "Default=0x7fff : ALL=limited, SELF=full;\nt=0x0a12 : ALL_CAS=full;\n".into(),
        ),
        ("crlf", "Default=0x7fff : ALL=full;\r\n".into()),
        ("empty", String::new()),
        ("comment only", "# nothing here\n\n".into()),
        ("bad guid", "Default=0x7fff : ALL=full, 0xzz;\n".into()),
        ("prefix keywords", "Default=0x7fff : A=f, S=f;\n".into()),
        (
            "key above 16 bits",
            "Default=0x7fff : ALL=full;\nt=0x18001 : ALL;\n".into(),
        ),
        (
            "semicolon on its own line",
            "Default=0x7fff :\n   ALL=full\n;\n".into(),
        ),
        (
            "semicolon on its own line, no indent",
            "Default=0x7fff :\nALL=full\n;\n".into(),
        ),
        (
            "uppercase MGID",
            "Default=0x7fff : ALL=full, MGID=ff12:401b::1;\n".into(),
        ),
        (
            "bad mgid with flags before ';'",
            "Default=0x7fff : ALL=full, mgid=fe80::1, sl=1;\n".into(),
        ),
        (
            "include",
            "include /etc/other.conf\nDefault=0x7fff : ALL=full;\n".into(),
        ),
        (
            "long line splitting a GUID",
            format!("Default=0x7fff : ALL=full;\nt=0x0001 :{long_pad}0x0002c90300123456;\n"),
        ),
        (
            "header across lines",
            "Default=0x7fff\n: ALL=full;\n".into(),
        ),
        (
            "two entries on one line",
            "Default=0x7fff : ALL=full; t=0x2 : SELF=full;\n".into(),
        ),
        ("no final semicolon", "Default=0x7fff : ALL=full\n".into()),
    ]
}

#[test]
fn parser_agrees_with_opensm_on_tricky_files() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 1), "Default=0x7fff : ALL=full;\n") else {
        return;
    };
    let mut disagreements = Vec::new();
    for (name, text) in tricky_files() {
        let offset = fabric.opensm_log().len();
        std::fs::write(fabric.partitions_path(), &text).unwrap();
        fabric.hup_opensm();
        std::thread::sleep(Duration::from_millis(400));
        let log = fabric
            .opensm_log()
            .get(offset..)
            .unwrap_or_default()
            .to_owned();
        let lines: Vec<String> = log.lines().map(str::to_owned).collect();
        let opensm_rejects = !verdict(&lines).0.is_empty();
        let parser = parse(text.as_bytes());
        if parser.is_err() != opensm_rejects {
            disagreements.push(format!(
                "{name}: parser {parser:?}, OpenSM {}: {log}",
                if opensm_rejects { "rejects" } else { "accepts" }
            ));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_reload_triggers_a_reread() {
    let port = common::free_port();
    let options = FabricOptions {
        opensm_conf: vec!["console loopback".into(), format!("console_port {port}")],
        ..FabricOptions::default()
    };
    let Some(fabric) = Fabric::start_with(
        &FabricSpec::new(1, 1),
        "Default=0x7fff : ALL=full;\n",
        &options,
    ) else {
        return;
    };
    let g2 = fabric.node_info("node1").port_guid;
    let config = OpenSmConfig {
        pid_file: None,
        reload: ReloadMethod::Console,
        console_port: port,
        reload_check_ms: 3000,
        // The rig's Default grants ALL=full: acknowledged, or tenant keys are refused.
        allow_full_default: true,
        ..config_for(&fabric)
    };
    let backend = backend(config);
    set_and_see_reread(
        &backend,
        node("node1", g2, &[(0x0c01, Membership::Full)]),
        1,
    )
    .await;
    wait_until("node1 to hold 0x8c01", || {
        fabric.pkeys("node1").contains(&0x8c01)
    });
}
