//! A flood of one grant against the SM host's admission (in process: the OpenSM backend with
//! grants required, reloads accepted, so the figures are admission's alone). One node sends its
//! set carrying `--copies` (default 20000) copies of one signed grant, `--floods` times (default
//! 20) in a row at increasing generations, while `--attaches` (default 200) other nodes each
//! attach one key with their own fresh grant, one after the other. Prints the flood set's reply
//! time, and the other nodes' attach latency (p50, p99, max) without the flood and during it.
//! Copies are dropped before any signature is checked and signatures are verified outside the
//! admission lock, so the flood costs one verification and the others do not wait for it.
//!
//! Run: `cargo bench --bench grant_flood` (`-- --copies N --attaches M --floods F`).

mod support;

use fabric_agent::api::grant_v1::signed_grant_from_proto;
use fabric_agent::domain::{FabricName, GrantKeys, GrantPolicy, Membership, SignedGrant};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OwnershipConfig,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{arg_usize, ms, percentile};
use testkit::common::grants::{grant, GrantSigner};
use testkit::common::memberships::memberships;
use testkit::common::sm_host::AcceptingReloader;

fn backend(dir: &std::path::Path, cp: &GrantSigner) -> OpenSmBackend {
    let file = dir.join("partitions.conf");
    std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let key = fabric_agent::config::decode_public_key(&cp.id, &cp.public_b64()).unwrap();
    OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: file,
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            grants: Some(GrantPolicy {
                require: true,
                fabric: FabricName::parse("fab1").unwrap(),
                keys: GrantKeys::new([key]).unwrap(),
            }),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::new(InMemoryNodeStore::default()) as Arc<dyn NodeMembershipStore>,
        Arc::new(AcceptingReloader),
    )
    .unwrap()
}

fn signed(cp: &GrantSigner, id: &str, node: &str, pkey: u32) -> SignedGrant {
    signed_grant_from_proto(&cp.sign(&grant(id, "fab1", node, id, pkey, Membership::Full))).unwrap()
}

/// `count` nodes (from `first`) each attach one key with a fresh grant, one after the other:
/// each reply's latency.
async fn attaches(
    sm: &OpenSmBackend,
    cp: &GrantSigner,
    first: usize,
    count: usize,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(count);
    for i in first..first + count {
        let node = format!("n{i}");
        let pkey = 0x1000 + (i % 0x4000) as u32;
        let g = signed(cp, &format!("g-{i}"), &node, pkey);
        let set = memberships(
            &node,
            [0x10_0000 + i as u64],
            [(pkey, Membership::Full)],
            |k| format!("t{k:x}"),
        );
        let t = Instant::now();
        sm.set_node_granted(set, &[g], 1).await.unwrap();
        out.push(t.elapsed());
    }
    out
}

fn line(what: &str, s: &[Duration]) {
    println!(
        "{what}: n={} p50={} p99={} max={}",
        s.len(),
        ms(percentile(s, 0.5).unwrap()),
        ms(percentile(s, 0.99).unwrap()),
        ms(*s.iter().max().unwrap())
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let copies = arg_usize("--copies", 20_000);
    let count = arg_usize("--attaches", 200);
    let floods = arg_usize("--floods", 20);
    let dir = tempfile::tempdir().unwrap();
    let cp = GrantSigner::new("cp");
    let sm = backend(dir.path(), &cp);

    let alone = attaches(&sm, &cp, 0, count).await;
    line("attach, no flood", &alone);

    let flood_grant = signed(&cp, "g-flood", "flooder", 0x0f0f);
    let flood: Vec<SignedGrant> = std::iter::repeat_n(flood_grant, copies).collect();
    let wire = flood.len() * 200;
    println!(
        "flood set: {copies} copies of one grant (about {} KiB on the wire)",
        wire / 1024
    );
    let flooder = {
        let sm = sm.clone();
        tokio::spawn(async move {
            let mut replies = Vec::new();
            for generation in 1..=floods as u64 {
                let set = memberships("flooder", [0x20_0000], [(0x0f0f, Membership::Full)], |k| {
                    format!("t{k:x}")
                });
                let t = Instant::now();
                sm.set_node_granted(set, &flood, generation).await.unwrap();
                replies.push(t.elapsed());
            }
            replies
        })
    };
    let during = attaches(&sm, &cp, count, count).await;
    let replies = flooder.await.unwrap();
    line("flood set reply", &replies);
    line("attach, during the flood", &during);
}
