//! The UFM broker's port ownership, against the fake UFM: a node may claim only a port UFM
//! shows as a channel-adapter port (`Computer IB Port`) in it, the OpenSM SM host's rule; a
//! switch's, router's or gateway's port named after the node, or one without a description, is
//! refused and nothing reaches UFM; and a node whose claims keep being refused costs at most one
//! full port-inventory read per interval, while another node's claim is still judged by a fresh
//! read.

use testkit::common;

use common::memberships::memberships;
use fabric_agent::domain::{FabricName, GrantPolicy, Membership, NodeId, NodeMemberships};
use fabric_agent::sm::opensm::InMemoryNodeStore;
use fabric_agent::sm::ufm::broker::inventory::NODE_READ_INTERVAL;
use fabric_agent::sm::ufm::broker::{BrokerError, MemoryNodeLedgers, UfmBroker};
use std::sync::Arc;
use testkit::fake_ufm::{FakeAuth, FakePort, FakeUfm};

fn claim(node: &str, guid: u64) -> NodeMemberships {
    memberships(node, [guid], [(0x0a12, Membership::Full)], |_| "t".into())
}

fn port(guid: u64, system: &str, description: &str) -> FakePort {
    FakePort {
        description: description.into(),
        ..FakePort::host(guid, system, "mlx5_0")
    }
}

fn inventory_reads(fake: &FakeUfm) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("resources/ports"))
        .count()
}

async fn broker(fake: &FakeUfm, dir: &std::path::Path) -> UfmBroker {
    let cred = dir.join("ufm.cred");
    std::fs::write(&cred, "admin:secret\n").unwrap();
    UfmBroker::new(
        &fake.test_config(cred, 0),
        NodeId::parse("broker").unwrap(),
        GrantPolicy::off(FabricName::parse("fab1").unwrap()),
        Arc::new(InMemoryNodeStore::default()),
        Arc::new(MemoryNodeLedgers::default()),
    )
    .unwrap()
}

#[tokio::test]
async fn only_channel_adapter_ports_and_refusals_read_the_inventory_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeUfm::start_with(FakeAuth::Basic {
        user: "admin".into(),
        password: "secret".into(),
    })
    .await;
    fake.set_ports(vec![
        FakePort::host(0x11, "node1", "mlx5_0"),
        port(0x21, "node1", "Switch IB Port"),
        port(0x22, "node1", "Router IB Port"),
        port(0x23, "node1", "Gateway IB Port"),
        port(0x24, "node1", ""),
        FakePort::host(0x31, "node2", "mlx5_0"),
    ]);
    let b = broker(&fake, dir.path()).await;

    // Every non-channel-adapter port named after node1 is refused; nothing is written.
    for guid in [0x21, 0x22, 0x23, 0x24] {
        let e = b
            .set_node_checked(claim("node1", guid), &[], 1, true)
            .await
            .expect_err("not a channel adapter's port");
        assert!(matches!(e, BrokerError::PortNotOwned { .. }), "{e}");
    }
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());
    // Those four refusals cost one inventory read, not four.
    assert_eq!(inventory_reads(&fake), 1);
    // node1's own channel-adapter port is proven by its cache: no read.
    b.set_node_checked(claim("node1", 0x11), &[], 2, true)
        .await
        .unwrap();
    assert_eq!(inventory_reads(&fake), 1);
    // A hundred more refused claims within the interval: still one read.
    for g in 0..100 {
        assert!(b
            .set_node_checked(claim("node1", 0x21), &[], 3 + g, true)
            .await
            .is_err());
    }
    assert_eq!(inventory_reads(&fake), 1);
    // Another node's claim has its own budget: judged by a fresh read.
    b.set_node_checked(claim("node2", 0x31), &[], 1, true)
        .await
        .unwrap();
    assert_eq!(inventory_reads(&fake), 2);
    assert_eq!(b.inventory_reads(), 2);

    // After the interval, node1's next claim reads again (a port added to it is found).
    fake.set_ports(vec![
        FakePort::host(0x11, "node1", "mlx5_0"),
        FakePort::host(0x12, "node1", "mlx5_1"),
        FakePort::host(0x31, "node2", "mlx5_0"),
    ]);
    tokio::time::sleep(NODE_READ_INTERVAL).await;
    b.set_node_checked(
        memberships("node1", [0x11, 0x12], [(0x0a12, Membership::Full)], |_| {
            "t".into()
        }),
        &[],
        200,
        true,
    )
    .await
    .unwrap();
    assert_eq!(inventory_reads(&fake), 3);
}
