//! Single-attach latency on the small ibsim fabric, end to end: AttachPartition (with wait) on a
//! node agent -> remote backend -> SM-host agent -> partitions file + heavy sweep by the real
//! OpenSM -> the node's SMP observer sees the key -> ACTIVE; then the same for release ->
//! RELEASED. Prints p50/p99 of both over N cycles (default 100).
//!
//! Run: `cargo bench --bench fabric_attach` (`-- --cycles N` to change the count).

use testkit::rig;
mod support;

use fabric_agent::proto::agent as pb;
use rig::agents::{node_config, sm_config, Agent};
use std::time::Instant;
use support::{ms, percentile};

fn main() {
    let cycles = usize::try_from(support::arg("--cycles", 100)).expect("--cycles");
    let Some(fabric) =
        rig::Fabric::start(&rig::FabricSpec::new(2, 4), rig::LIMITED_DEFAULT_PARTITIONS)
    else {
        eprintln!("ibsim/OpenSM not installed: nothing measured");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sm = Agent::start(&fabric, rig::SM_HOST, &sm_config(&fabric, port));
    let mut node = Agent::start(&fabric, "node1", &node_config(&fabric, "node1", port));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (attach, release) = rt.block_on(async {
        let mut c = node.client().await;
        let (mut attach, mut release) = (Vec::new(), Vec::new());
        for i in 0..cycles {
            let instance = format!("bench-{i}");
            let t = Instant::now();
            let a = c
                .attach_partition(pb::AttachPartitionRequest {
                    partition: Some(pb::Partition {
                        id: format!("ibpart_bench{i}"),
                        name: format!("bench{i}"),
                        workspace: "bench".into(),
                        account: "bench".into(),
                        fabric: "fab1".into(),
                        pkey: 0x200 + i as u32,
                    }),
                    instance_id: instance.clone(),
                    membership: pb::Membership::Full as i32,
                    wait_ms: Some(30_000),
                    grant: None,
                    ports: Vec::new(),
                })
                .await
                .unwrap()
                .into_inner();
            attach.push(t.elapsed());
            assert_eq!(
                a.attachment.unwrap().state,
                pb::AttachmentState::Active as i32
            );
            let t = Instant::now();
            let r = c
                .release_instance(pb::ReleaseInstanceRequest {
                    instance_id: instance,
                    wait_ms: Some(30_000),
                })
                .await
                .unwrap()
                .into_inner();
            release.push(t.elapsed());
            assert_eq!(
                r.attachment.unwrap().state,
                pb::AttachmentState::Released as i32
            );
        }
        (attach, release)
    });
    for (what, v) in [
        ("attach -> ACTIVE", attach),
        ("release -> RELEASED", release),
    ] {
        println!(
            "{what} over {cycles} cycles (ibsim: 2 switches, 5 HCAs; OpenSM heavy sweep per change): p50 {}  p99 {}  max {}",
            percentile(&v, 0.5).map(ms).unwrap_or_default(),
            percentile(&v, 0.99).map(ms).unwrap_or_default(),
            v.iter().max().copied().map(ms).unwrap_or_default()
        );
    }
    node.stop();
    sm.stop();
}
