//! The OpenSM backend's port-ownership path with a fake fabric directory: what is asked, what is
//! stored when a port moves (durably: a backend restarted on the same store agrees), that a
//! refusal or an unreachable SA stores and writes nothing, and that the SM host's own apply is
//! not a claim.

use testkit::common;

use common::sm_host::AcceptingReloader;
use fabric_agent::domain::{Guid, KeySetting, Membership, NodeMemberships, PKey};
use fabric_agent::mad::node_info::node_type;
use fabric_agent::mad::{NodeInfo, NodeInfoRepr, NodeRecordRepr};
use fabric_agent::sm::opensm::ownership::{
    DirectoryError, FabricFacts, OwnershipRefusal, PortDirectory,
};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OpenSmError,
};
use fabric_agent::sm::SubnetManager;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A fabric whose ports and descriptions the test edits; records every question.
#[derive(Default)]
struct FakeFabric {
    ports: Mutex<BTreeMap<u64, (u8, &'static str)>>,
    down: Mutex<bool>,
    asked: Mutex<Vec<Vec<u64>>>,
}

#[async_trait::async_trait]
impl PortDirectory for FakeFabric {
    async fn facts(&self, guids: &[Guid]) -> Result<FabricFacts, DirectoryError> {
        self.asked
            .lock()
            .unwrap()
            .push(guids.iter().map(|g| g.0).collect());
        if *self.down.lock().unwrap() {
            return Err(DirectoryError::Busy {
                device: "/dev/infiniband/umad0".into(),
                deadline: std::time::Duration::from_millis(300),
            });
        }
        let ports = self.ports.lock().unwrap();
        let mut records = BTreeMap::new();
        for (i, g) in guids.iter().enumerate() {
            let record = ports.get(&g.0).map(|(kind, description)| {
                let mut info =
                    NodeInfoRepr::parse(&NodeInfo::new_checked(&[0u8; 40][..]).unwrap()).unwrap();
                info.node_type = *kind;
                info.port_guid = g.0;
                let mut d = [0u8; 64];
                d[..description.len()].copy_from_slice(description.as_bytes());
                NodeRecordRepr {
                    lid: 10 + i as u16,
                    node_info: info,
                    description: d,
                }
            });
            records.insert(*g, record);
        }
        Ok(FabricFacts {
            local_port_guid: 0x1,
            sm_lid: 1,
            records,
        })
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    store: Arc<InMemoryNodeStore>,
    fabric: Arc<FakeFabric>,
    backend: OpenSmBackend,
}

impl Setup {
    /// Stores `node`'s set (ports `guids`, `key` full) at `generation`; panics if refused.
    async fn set_ok(&self, node: &str, guids: &[u64], key: u32, generation: u64) {
        self.backend
            .set_node(set(node, guids, key), generation)
            .await
            .unwrap();
    }

    /// The refusal of that set; panics if it is stored.
    async fn set_err(&self, node: &str, guids: &[u64], key: u32, generation: u64) -> OpenSmError {
        self.backend
            .set_node(set(node, guids, key), generation)
            .await
            .unwrap_err()
    }
}

fn backend(
    path: &std::path::Path,
    store: &Arc<InMemoryNodeStore>,
    fabric: &Arc<FakeFabric>,
) -> OpenSmBackend {
    OpenSmBackend::with_directory(
        OpenSmConfig {
            partitions_file: path.to_owned(),
            pid: Some(12345),
            watch_ms: 0,
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        Arc::clone(store) as Arc<dyn NodeMembershipStore>,
        Arc::new(AcceptingReloader),
        Some(Arc::clone(fabric) as Arc<dyn PortDirectory>),
    )
    .unwrap()
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partitions.conf");
    std::fs::write(&path, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let store = Arc::new(InMemoryNodeStore::default());
    let fabric = Arc::new(FakeFabric::default());
    fabric.ports.lock().unwrap().extend([
        (0x11, (node_type::CHANNEL_ADAPTER, "node1 mlx5_0")),
        (0x21, (node_type::CHANNEL_ADAPTER, "node2 mlx5_0")),
        (0x22, (node_type::CHANNEL_ADAPTER, "node2 mlx5_1")),
        (0x30, (node_type::SWITCH, "sw1")),
    ]);
    let backend = backend(&path, &store, &fabric);
    Setup {
        _dir: dir,
        path,
        store,
        fabric,
        backend,
    }
}

fn set(node: &str, guids: &[u64], key: u32) -> NodeMemberships {
    NodeMemberships {
        node_id: fabric_agent::domain::NodeId::parse(node).unwrap(),
        port_guids: guids.iter().map(|g| Guid(*g)).collect(),
        keys: [(
            PKey::new(key).unwrap(),
            KeySetting {
                membership: Membership::Full,
                name: String::new(),
                ports: None,
            },
        )]
        .into_iter()
        .collect(),
    }
}

#[tokio::test]
async fn only_new_ports_are_asked_about_and_refusals_change_nothing() {
    let s = setup();
    s.set_ok("node1", &[0x11], 0x51, 1).await;
    let file = std::fs::read(&s.path).unwrap();
    for (guid, forbidden) in [(0x30, true), (0x21, false), (0x99, false), (0x1, true)] {
        let err = s.set_err("node1", &[0x11, guid], 0x51, 2).await;
        match err {
            OpenSmError::PortForbidden(_) => assert!(forbidden, "{guid:#x}: {err}"),
            OpenSmError::PortNotShown(_) => assert!(!forbidden, "{guid:#x}: {err}"),
            other => panic!("{guid:#x}: {other:?}"),
        }
        assert_eq!(std::fs::read(&s.path).unwrap(), file);
        assert_eq!(s.backend.node("node1").unwrap().generation, 1);
    }
    // Port 0x11 is node1's already: only the new GUID is asked about.
    let asked = s.fabric.asked.lock().unwrap().clone();
    assert_eq!(asked[0], vec![0x11]);
    assert!(
        asked[1..].iter().all(|q| q.len() == 1 && q[0] != 0x11),
        "{asked:?}"
    );
    // A retry of the stored set asks nothing, nor does a stale generation (answered ABORTED
    // even while the SA is down).
    s.set_ok("node1", &[0x11], 0x51, 1).await;
    *s.fabric.down.lock().unwrap() = true;
    let err = s.set_err("node1", &[0x11, 0x21], 0x51, 0).await;
    assert!(
        matches!(err, OpenSmError::StaleGeneration { .. }),
        "{err:?}"
    );
    assert_eq!(s.fabric.asked.lock().unwrap().len(), asked.len());
}

#[tokio::test]
async fn an_unreachable_sa_refuses_and_stores_nothing() {
    let s = setup();
    *s.fabric.down.lock().unwrap() = true;
    let file = std::fs::read(&s.path).unwrap();
    let err = s.set_err("node1", &[0x11], 0x51, 1).await;
    assert!(matches!(err, OpenSmError::FabricUnreachable(_)), "{err:?}");
    assert!(s.backend.node("node1").is_none());
    assert!(s.store.load_all().unwrap().is_empty());
    assert_eq!(std::fs::read(&s.path).unwrap(), file);
}

#[tokio::test]
async fn a_port_moves_only_when_the_fabric_shows_it_in_the_new_node_and_durably() {
    let s = setup();
    s.set_ok("node2", &[0x21, 0x22], 0x52, 1).await;
    s.set_ok("node1", &[0x11], 0x51, 1).await;
    let err = s.set_err("node1", &[0x11, 0x22], 0x51, 2).await;
    assert!(
        matches!(err, OpenSmError::PortForbidden(OwnershipRefusal::OwnedByOther { ref holder, port: Guid(0x22), .. }) if holder == "node2"),
        "{err:?}"
    );

    s.fabric
        .ports
        .lock()
        .unwrap()
        .insert(0x22, (node_type::CHANNEL_ADAPTER, "node1 mlx5_1"));
    s.set_ok("node1", &[0x11, 0x22], 0x51, 2).await;
    assert_eq!(
        s.backend.node("node2").unwrap().memberships.port_guids,
        vec![Guid(0x21)]
    );
    let text = std::fs::read_to_string(&s.path).unwrap();
    assert!(text.contains("0x0000000000000022=full"), "{text}");
    assert_eq!(text.matches("0x0000000000000022").count(), 1, "{text}");

    // Durable: a backend on the same store agrees, and node2 cannot claim it back.
    let again = backend(&s.path, &s.store, &s.fabric);
    assert_eq!(
        again.node("node2").unwrap().memberships.port_guids,
        vec![Guid(0x21)]
    );
    let err = again
        .set_node(set("node2", &[0x21, 0x22], 0x52), 2)
        .await
        .unwrap_err();
    assert!(matches!(err, OpenSmError::PortForbidden(_)), "{err:?}");
}

#[tokio::test]
async fn the_sm_hosts_own_apply_is_not_a_claim() {
    let s = setup();
    s.backend
        .apply(&set("ignored", &[0x77], 0x51), 1)
        .await
        .unwrap();
    assert!(s.fabric.asked.lock().unwrap().is_empty());
    assert_eq!(
        s.backend.node("smhost").unwrap().memberships.port_guids,
        vec![Guid(0x77)]
    );
}
