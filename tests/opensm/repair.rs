//! Whatever OpenSM rejected is repaired, whenever it happened, on an ibsim fabric with a real
//! OpenSM and the SM-host agent (`fabric-agent serve`): a broken in-place edit of the operator's
//! part raises `PARTITIONS_FILE_REJECTED` in GetNode every time, with the operator's line, until
//! the operator's next edit is accepted; a rejection OpenSM logged while the agent was down is
//! repaired at the agent's start. Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::sm_requests::set_memberships;
use common::{free_port, node, wait_until, CONVERGE};
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use fabric_agent::sm::opensm::parse::parse;
use rig::agents::{sm_config, Agent};
use rig::{Fabric, FabricSpec};
use std::time::Instant;
use tonic::transport::Channel;

/// Tenant ports are limited members of the default partition.
const OPERATOR: &str = "# operator's partitions\n\
Default=0x7fff : ALL=limited, SELF=full ;\n\
storage=0x0100, ipoib : ALL_SWITCHES=full, SELF=full ;\n";

/// The SM-host agent, its log watch every `watch_ms`, and a Partitions client to it.
async fn start_sm(fabric: &Fabric, watch_ms: u64) -> (Agent, PartitionsClient<Channel>) {
    let port = free_port();
    let config = sm_config(fabric, port).replace(
        "[subnet_manager.opensm]\n",
        &format!("[subnet_manager.opensm]\nwatch_ms = {watch_ms}\n"),
    );
    let sm = Agent::start(fabric, rig::SM_HOST, &config);
    let client = PartitionsClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect");
    (sm, client)
}

/// The detail of the SM host's PARTITIONS_FILE_REJECTED condition, if GetNode shows it.
async fn rejected_condition(agent: &Agent) -> Option<String> {
    let mut c = agent.client().await;
    node(&mut c)
        .await
        .conditions
        .into_iter()
        .find(|c| c.kind == "PARTITIONS_FILE_REJECTED")
        .map(|c| c.detail)
}

/// Puts `text` in place as an operator's editor would (temp file + rename) and SIGHUPs OpenSM.
fn operator_edit(fabric: &Fabric, text: &str) {
    let tmp = fabric.dir().join("operator-edit.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, fabric.partitions_path()).unwrap();
    fabric.hup_opensm();
}

/// node1 holds 0x8a51 through the SM host: the file then has an accepted copy.
async fn first_key(fabric: &Fabric, client: &mut PartitionsClient<Channel>) {
    let guid = fabric.node_info("node1").port_guid;
    client
        .set_node_memberships(set_memberships("node1", &[guid], &[0x0a51], 1))
        .await
        .expect("set node1");
    wait_until("0x8a51 on node1", CONVERGE, || async {
        fabric.pkeys("node1").contains(&0x8a51)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_in_place_edit_raises_partitions_file_rejected_every_time() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let (mut sm, mut client) = start_sm(&fabric, 200).await;
    first_key(&fabric, &mut client).await;
    let mut good = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    for round in 0..3 {
        let line = format!("broken{round}=0x0c0c : 0xzz{round} ;");
        let broken = good.replacen("storage=0x0100", &format!("{line}\nstorage=0x0100"), 1);
        assert!(parse(broken.as_bytes()).is_err());
        let started = Instant::now();
        operator_edit(&fabric, &broken);
        wait_until(
            &format!("round {round}: PARTITIONS_FILE_REJECTED naming the line"),
            CONVERGE,
            || async {
                rejected_condition(&sm)
                    .await
                    .is_some_and(|d| d.contains("PARSE ERROR") && d.contains(&line))
            },
        )
        .await;
        eprintln!(
            "round {round}: condition shown after {:?}",
            started.elapsed()
        );
        wait_until("the last accepted file restored", CONVERGE, || async {
            std::fs::read_to_string(fabric.partitions_path()).unwrap() == good
        })
        .await;
        // Still shown after the restore, on every later look, until the operator's next edit.
        for _ in 0..5 {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let d = rejected_condition(&sm).await;
            assert!(d.as_deref().is_some_and(|d| d.contains(&line)), "{d:?}");
        }
        // The operator's fixed edit (a valid change of their part) is accepted and clears it.
        let fixed = good.replacen(
            "storage=0x0100",
            &format!("# fixed in round {round}\nstorage=0x0100"),
            1,
        );
        operator_edit(&fabric, &fixed);
        wait_until(
            &format!("round {round}: condition cleared"),
            CONVERGE,
            || async { rejected_condition(&sm).await.is_none() },
        )
        .await;
        good = std::fs::read_to_string(fabric.partitions_path()).unwrap();
        assert!(
            good.contains(&format!("# fixed in round {round}")),
            "{good}"
        );
        assert!(fabric.pkeys("node1").contains(&0x8a51));
    }
    assert!(sm.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_logged_while_the_agent_was_down_is_repaired_at_its_start() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 2), OPERATOR) else {
        return;
    };
    let (mut sm, mut client) = start_sm(&fabric, 2000).await;
    first_key(&fabric, &mut client).await;
    let good = std::fs::read_to_string(fabric.partitions_path()).unwrap();
    assert!(sm.stop().success());

    // With the agent down, the operator breaks the file and OpenSM falls back to ALL=full.
    let broken = good.replacen(
        "storage=0x0100",
        "while_down=0x0c0d : 0xzz ;\nstorage=0x0100",
        1,
    );
    let log_at = fabric.opensm_log().len();
    operator_edit(&fabric, &broken);
    wait_until("OpenSM's PARSE ERROR", CONVERGE, || async {
        fabric.opensm_log()[log_at..].contains("PARSE ERROR")
    })
    .await;
    wait_until(
        "node2 a full default member (fail-open)",
        CONVERGE,
        || async { fabric.pkeys("node2").contains(&0xffff) },
    )
    .await;

    // At its start the agent finds the rejection after its persisted log mark and repairs it.
    let started = Instant::now();
    sm.spawn(&fabric);
    wait_until("the last accepted file restored", CONVERGE, || async {
        std::fs::read_to_string(fabric.partitions_path()).unwrap() == good
    })
    .await;
    wait_until("ports restored", CONVERGE, || async {
        let k1 = fabric.pkeys("node1");
        let k2 = fabric.pkeys("node2");
        k1.contains(&0x8a51) && !k2.contains(&0xffff) && k2.contains(&0x7fff)
    })
    .await;
    eprintln!("repaired {:?} after the agent's start", started.elapsed());
    assert_eq!(
        std::fs::read_to_string(fabric.dir().join("partitions.conf.rejected")).unwrap(),
        broken
    );
    wait_until("PARTITIONS_FILE_REJECTED shown", CONVERGE, || async {
        rejected_condition(&sm)
            .await
            .is_some_and(|d| d.contains("while_down=0x0c0d"))
    })
    .await;
    assert!(sm.stop().success());
}
