//! A chaos finding reduced to a script: an SM host with peers whose agent starts while its
//! OpenSM already runs (the usual order, and every agent restart) refuses `RetirePartitionKey`:
//! its store wrapper for that start (`sm::opensm::running_start::KeepRunningKeys`) does not pass
//! the retired keys through (fixed: the trait's retirement and fence methods have no default, so
//! a wrapper cannot drop them again).

use super::ONE_AT_A_TIME;
use fabric_agent::proto::sm as smpb;
use fabric_agent::proto::sm::partitions_client::PartitionsClient;
use testkit::common::{self, free_port, grants::GrantSigner};
use testkit::rig::ha::{ha_sm_config, start_two_sms, SmHostAgent, TwoSmFiles};
use testkit::rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // one campaign or script at a time, across runtimes
async fn an_sm_host_started_beside_a_running_opensm_retires_a_key() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (pa, pb) = (free_port(), free_port());
    let signer = GrantSigner::new("cp-1");
    let grants = format!("[grants]\nrequire = true\n{}", signer.config_entry(""));
    // Both OpenSMs run already: both agents start beside a running OpenSM.
    let a = SmHostAgent::start(
        &fabric,
        "smhost",
        &(ha_sm_config(&fabric, "smhost", pa, &files.sm_a(), &[pb]) + &grants),
    );
    let _b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &(ha_sm_config(&fabric, "smhost2", pb, &files.sm_b(), &[pa]) + &grants),
    );
    let mut c = PartitionsClient::connect(format!("http://127.0.0.1:{pa}"))
        .await
        .expect("connect to the SM-host agent");
    let out = c
        .retire_partition_key(smpb::RetirePartitionKeyRequest {
            pkey: 0x0a71,
            retired_at_unix_ms: common::grants::now_ms(),
            partition_id: "ibpart_a71".into(),
        })
        .await;
    assert!(
        out.is_ok(),
        "RetirePartitionKey refused: {out:?}\n{}",
        a.log_text()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The contrast that locates the cause: the same agent started while its OpenSM is stopped
/// (the store wrapper that passes retirements through) retires the key once its OpenSM runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // one campaign or script at a time, across runtimes
async fn an_sm_host_started_before_its_opensm_retires_a_key() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((mut fabric, standby)) =
        start_two_sms(&FabricSpec::new(1, 2), LIMITED_DEFAULT_PARTITIONS, "node2")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let files = TwoSmFiles::of(&fabric, &standby, (free_port(), free_port()));
    let (pa, pb) = (free_port(), free_port());
    let signer = GrantSigner::new("cp-1");
    let grants = format!("[grants]\nrequire = true\n{}", signer.config_entry(""));
    fabric.stop_opensm(false);
    let a = SmHostAgent::start(
        &fabric,
        "smhost",
        &(ha_sm_config(&fabric, "smhost", pa, &files.sm_a(), &[pb]) + &grants),
    );
    testkit::rig::ha::restart_rig_opensm(&mut fabric);
    let _b = SmHostAgent::start(
        &fabric,
        "smhost2",
        &(ha_sm_config(&fabric, "smhost2", pb, &files.sm_b(), &[pa]) + &grants),
    );
    let mut c = PartitionsClient::connect(format!("http://127.0.0.1:{pa}"))
        .await
        .expect("connect to the SM-host agent");
    let request = smpb::RetirePartitionKeyRequest {
        pkey: 0x0a71,
        retired_at_unix_ms: common::grants::now_ms(),
        partition_id: "ibpart_a71".into(),
    };
    // Its first commit waits for the catch-up with its peer: asked again until answered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let out = loop {
        match c.retire_partition_key(request.clone()).await {
            Err(s)
                if s.code() == tonic::Code::Unavailable && std::time::Instant::now() < deadline =>
            {
                assert!(!s.message().contains("does not keep retired"), "{s:?}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            other => break other,
        }
    };
    assert!(
        out.is_ok(),
        "RetirePartitionKey refused: {out:?}\n{}",
        a.log_text()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
