//! The daemon with the SMP observer on the ibsim fabric: when the operator's partitions change
//! and OpenSM re-sweeps, the agent on an affected node records a P_Key table change event within
//! 500 ms of the change being visible to `smpquery`; an unaffected node records none.

use testkit::common;
use testkit::rig;

use common::{node, watch};
use fabric_agent::proto::agent as pb;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

/// Starts an agent as `node` (embedded backend: nothing to program here; SMP observer polling
/// every 100 ms while idle, so an unexpected change is seen within the 500 ms bound).
fn start_agent(fabric: &rig::Fabric, node: &str) -> rig::agents::Agent {
    let dir = fabric.dir();
    let config = format!(
        "node_id = \"{node}\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n\
         [observer]\nkind = \"smp\"\nfast_poll_ms = 50\nslow_poll_ms = 100\n",
        dir.join(format!("{node}-state")).display(),
        dir.join(format!("{node}.sock")).display()
    );
    rig::agents::Agent::start(fabric, node, &config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_change_is_reported_within_500ms_of_smpquery_seeing_it() {
    let Some(fabric) = rig::Fabric::start(&rig::FabricSpec::new(1, 2), rig::DEFAULT_PARTITIONS)
    else {
        return;
    };
    let mut agent1 = start_agent(&fabric, "node1");
    let mut agent2 = start_agent(&fabric, "node2");
    let port_guid = |node: &str| fabric.node_info(node).port_guid;
    let guid1 = port_guid("node1");

    let mut c1 = agent1.client().await;
    let mut c2 = agent2.client().await;
    let after1 = node(&mut c1).await.last_event_seq;
    let after2 = node(&mut c2).await.last_event_seq;
    let mut stream = watch(&mut c1, after1, true).await;

    // The operator gives node1 (only) a key and OpenSM re-sweeps.
    fabric.set_partitions(&format!(
        "Default=0x7fff : ALL=full ;\nops=0x0042 : 0x{guid1:016x}=full ;\n"
    ));
    let visible = loop {
        if fabric.pkeys("node1").contains(&0x8042) {
            break Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let event = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(e) = stream.next().await {
            let e = e.unwrap();
            if let Some(pb::event::Kind::PkeyTableChanged(t)) = &e.kind {
                return (Instant::now(), t.added.clone());
            }
        }
        panic!("event stream ended");
    })
    .await
    .expect("a P_Key table change event");
    // The event can precede the smpquery poll that saw the change; only lateness counts.
    let late = event.0.saturating_duration_since(visible);
    assert!(event.1.contains(&0x8042), "{:?}", event.1);
    assert!(
        late <= Duration::from_millis(500),
        "event {late:?} after smpquery saw the key"
    );
    eprintln!("event at most {late:?} after smpquery saw the key");

    // node2 was not affected: after a few of its polls, still no table change.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut s2 = watch(&mut c2, after2, false).await;
    while let Some(e) = s2.next().await {
        let e = e.unwrap();
        assert!(
            !matches!(e.kind, Some(pb::event::Kind::PkeyTableChanged(_))),
            "node2's table did not change, yet: {e:?}"
        );
    }
    // `fabric-agent ports` reads the same port directly (no daemon), like ibstat plus the table.
    let out = fabric
        .client_command("node1", rig::agents::BIN)
        .arg("--config")
        .arg(&agent1.config)
        .args(["--json", "ports"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let port = &v["ports"][0];
    assert_eq!(port["port_guid"], format!("{guid1:#018x}"));
    assert_eq!(port["state"], "ACTIVE");
    let keys: Vec<&str> = port["pkeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(keys.contains(&"0x8042"), "{keys:?}");
    assert_eq!(port["lid"], u64::from(fabric.port_info("node1").lid));

    // Agents exit cleanly on SIGTERM (freeing their ibsim slots) and leave no shim litter.
    assert!(agent1.stop().success());
    assert!(agent2.stop().success());
    let litter: Vec<String> = fabric.shim_litter();
    assert!(litter.len() <= 1, "shim litter beyond OpenSM's: {litter:?}");
}
