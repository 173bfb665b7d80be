//! Which SM hosts acknowledged, as the node's API shows it, on ibsim with two real OpenSMs
//! (priorities 15 and 10) and an SM-host agent beside each (fencing on SMInfo), and a node agent
//! sending every apply to both:
//! 1. an attach: ACTIVE, its evidence (GetAttachment, the ACTIVE event) names smhost and
//!    smhost2; GetNode's SM-host set knows both, both acknowledged, nothing fenced; the CLI's
//!    `node --json` and `get` show the same;
//! 2. the standby SM host killed whole (its OpenSM and its agent): smhost fences smhost2, and a
//!    release is RELEASED with evidence naming smhost alone; GetNode shows smhost2 fenced by
//!    smhost and excused. Skipped when ibsim/OpenSM are not installed.

use testkit::common;
use testkit::rig;

use common::{attach, attach_now, cli, events, get, partition, release, state, stdout, wait_until};
use fabric_agent::proto::agent as pb;
use rig::agents::Agent;
use rig::ha::{conditions_of, ha_node_config, ha_sm_config, start_two_sms, with_fencing};
use rig::ha::{SmHostAgent, TwoSmFiles};
use rig::{FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);
/// Three pulls of 500 ms.
const FENCE_AFTER_MS: u64 = 1500;

fn sm_hosts(n: &pb::GetNodeResponse) -> pb::SmHostSetStatus {
    n.subnet_manager
        .as_ref()
        .and_then(|s| s.sm_hosts.clone())
        .unwrap_or_default()
}

/// The evidence of the event that took `instance` to `to`.
async fn event_evidence(
    c: &mut fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient<
        tonic::transport::Channel,
    >,
    instance: &str,
    to: pb::AttachmentState,
) -> Option<pb::Evidence> {
    events(c, 0).await.into_iter().find_map(|e| match e.kind {
        Some(pb::event::Kind::AttachmentChanged(a))
            if a.instance_id == instance && a.to == to as i32 =>
        {
            a.evidence
        }
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evidence_and_get_node_name_the_sm_hosts_that_acknowledged_and_the_fenced_one() {
    let Some((fabric, mut standby)) =
        start_two_sms(&FabricSpec::new(1, 3), LIMITED_DEFAULT_PARTITIONS, "node3")
    else {
        common::skip("ibsim/opensm not installed");
        return;
    };
    let (pa, pb_) = (common::free_port(), common::free_port());
    let files = TwoSmFiles::of(
        &fabric,
        &standby,
        (common::free_port(), common::free_port()),
    );
    let (a_files, b_files) = (files.sm_a(), files.sm_b());
    let guid_a = fabric.node_info("smhost").port_guid;
    let guid_b = fabric.node_info("node3").port_guid;
    let sm_a = SmHostAgent::start_as(
        &fabric,
        "smhost",
        "smhost",
        &with_fencing(
            ha_sm_config(&fabric, "smhost", pa, &a_files, &[pb_]),
            "smhost",
            "smhost2",
            guid_b,
            FENCE_AFTER_MS,
        ),
    );
    let mut sm_b = SmHostAgent::start_as(
        &fabric,
        "smhost2",
        "node3",
        &with_fencing(
            ha_sm_config(&fabric, "smhost2", pb_, &b_files, &[pa]),
            "smhost2",
            "smhost",
            guid_a,
            FENCE_AFTER_MS,
        ),
    );
    let n1 = Agent::start(
        &fabric,
        "node1",
        &ha_node_config(&fabric, "node1", &[pa, pb_]),
    );
    let mut c = n1.client().await;

    // 1. Both SM hosts acknowledge.
    let a = attach_now(
        &mut c,
        attach("i-1", partition("ibpart_1", 0x0c21), Some(30_000)),
    )
    .await;
    assert_eq!(
        state(&a),
        pb::AttachmentState::Active,
        "{a:?}\n{}",
        n1.log_text()
    );
    let both = ["smhost".to_owned(), "smhost2".to_owned()];
    let active = get(&mut c, "i-1").await;
    let evidence = active
        .evidence
        .clone()
        .expect("ACTIVE carries its evidence");
    assert_eq!(evidence.acknowledged_by, both, "{active:?}");
    let from_event = event_evidence(&mut c, "i-1", pb::AttachmentState::Active)
        .await
        .expect("the ACTIVE event carries evidence");
    assert_eq!(from_event, evidence);
    let set = sm_hosts(&common::node(&mut c).await);
    eprintln!("GetNode's SM-host set, both up: {set:?}");
    assert_eq!(set.known_hosts, both);
    assert_eq!(set.acknowledged, both);
    assert!(set.fenced_hosts.is_empty() && set.not_acknowledged.is_empty());
    // The CLI, as an operator reads it.
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&cli(&n1.socket, &["node", "--json"]))).unwrap();
    assert_eq!(
        json["subnet_manager"]["sm_hosts"]["known_hosts"],
        serde_json::json!(both)
    );
    let human = stdout(&cli(&n1.socket, &["get", "i-1"]));
    eprintln!("fabric-agent get i-1:\n{human}");
    assert!(human.contains("acknowledged by smhost, smhost2"), "{human}");

    // 2. The standby SM host dies whole: fenced by smhost, a release acknowledged by smhost
    // alone.
    standby.stop(true);
    sm_b.crash();
    wait_until("smhost holds smhost2 fenced", LONG, || async {
        conditions_of(&sm_a.socket)
            .await
            .iter()
            .any(|(k, d)| k == "SM_HOST_FENCED" && d.contains("smhost2"))
    })
    .await;
    release(&mut c, "i-1", None).await;
    wait_until("i-1 RELEASED with smhost2 fenced", LONG, || {
        let mut c = c.clone();
        async move { state(&get(&mut c, "i-1").await) == pb::AttachmentState::Released }
    })
    .await;
    let released = get(&mut c, "i-1").await;
    let evidence = released
        .evidence
        .clone()
        .expect("RELEASED carries evidence");
    eprintln!("RELEASED's evidence: {evidence:?}");
    assert_eq!(evidence.acknowledged_by, ["smhost"]);
    assert_eq!(
        event_evidence(&mut c, "i-1", pb::AttachmentState::Released).await,
        Some(evidence)
    );
    let set = sm_hosts(&common::node(&mut c).await);
    eprintln!("GetNode's SM-host set, smhost2 fenced: {set:?}");
    assert_eq!(set.known_hosts, both);
    assert_eq!(set.acknowledged, ["smhost"]);
    assert_eq!(set.excused, ["smhost2"]);
    assert_eq!(set.fenced_hosts.len(), 1, "{set:?}");
    assert_eq!(set.fenced_hosts[0].host, "smhost2");
    assert_eq!(set.fenced_hosts[0].fenced_by, ["smhost"]);
    assert!(!set.fenced_hosts[0].evidence.is_empty());
    let human = stdout(&cli(&n1.socket, &["node"]));
    eprintln!("fabric-agent node:\n{human}");
    assert!(human.contains("fenced smhost2: by smhost"), "{human}");
}
