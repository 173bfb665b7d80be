//! The sysfs observer against the checked-in fixture trees (tests/fixtures/sysfs): exact
//! inventories, a DOWN port, the default port selection, key changes in a copied tree, and
//! clear errors for garbled files.

use testkit::common;

use common::copy_tree;
use fabric_agent::config::ObserverConfig;
use fabric_agent::domain::{
    Guid, Inventory, LinkLayer, PKeyValue, PortInfo, PortSelector, PortState,
};
use fabric_agent::observe::sysfs::{AttrError, SysfsObserver};
use fabric_agent::observe::{NoDevices, ObserveError, PortObserver, ReadError};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn config(fast_ms: u64, slow_ms: u64) -> ObserverConfig {
    ObserverConfig {
        fast_poll_ms: fast_ms,
        slow_poll_ms: slow_ms,
        ..ObserverConfig::default()
    }
}

/// Copies a fixture tree into a fresh temp dir (tests that change files never touch the
/// checked-in tree).
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(name);
    copy_tree(&fixture(name), &root);
    (dir, root)
}

/// A P_Key table of `len` entries holding `keys` at their indexes, the rest empty.
fn table(len: usize, keys: &[(usize, u16)]) -> Vec<PKeyValue> {
    let mut pkeys = vec![PKeyValue(0); len];
    for (index, value) in keys {
        pkeys[*index] = PKeyValue(*value);
    }
    pkeys
}

/// A port 1 as the fixture's description says it is (independent of the files); LIDs zero.
fn port(
    device: &str,
    node_guid: u64,
    port_guid: u64,
    state: PortState,
    link_layer: LinkLayer,
    pkeys: Vec<PKeyValue>,
) -> PortInfo {
    PortInfo {
        device: device.to_owned(),
        port_number: 1,
        port_guid: Guid(port_guid),
        node_guid: Guid(node_guid),
        state,
        link_layer,
        pkeys,
        ..PortInfo::default()
    }
}

/// The mlx5-8x node: eight ConnectX-7 IB ports and a RoCE bond.
fn expected_mlx5_8x() -> Inventory {
    let tables: [&[(usize, u16)]; 8] = [
        &[(0, 0xffff), (1, 0x8a12)],
        &[(0, 0xffff), (1, 0x8a12), (2, 0x0c01)],
        &[(0, 0xffff), (1, 0x8a12)],
        &[(0, 0xffff), (1, 0x8a12)],
        &[(0, 0xffff), (1, 0x8a12), (2, 0x8b07)],
        &[(0, 0xffff), (1, 0x8a12), (40, 0x8b07)],
        &[(0, 0x7fff), (1, 0x8a12)],
        &[(0, 0xffff), (1, 0x8a12), (127, 0x8b07)],
    ];
    let mut ports: Vec<PortInfo> = (0..8u16)
        .map(|i| {
            let guid = 0xa088_c203_00f1_2e40 + u64::from(i);
            let (lid, sm_lid, state) = if i == 3 {
                (0xffff, 0, PortState::Down)
            } else {
                (0x11 + i, 1, PortState::Active)
            };
            PortInfo {
                lid,
                sm_lid,
                ..port(
                    &format!("mlx5_{i}"),
                    guid,
                    guid,
                    state,
                    LinkLayer::Infiniband,
                    table(128, tables[usize::from(i)]),
                )
            }
        })
        .collect();
    ports.push(port(
        "mlx5_bond_0",
        0xa088_c203_00c4_5d10,
        // EUI-64 of MAC a0:88:c2:c4:5d:10.
        0xa288_c2ff_fec4_5d10,
        PortState::Active,
        LinkLayer::Ethernet,
        table(1, &[(0, 0xffff)]),
    ));
    Inventory { ports }
}

#[tokio::test]
async fn mlx5_inventory_matches_the_tree_exactly() {
    let observer = SysfsObserver::new(fixture("mlx5-8x"), &config(50, 5000));
    assert_eq!(observer.kind(), "sysfs");
    let inventory = observer.inventory().await.unwrap();
    assert_eq!(inventory, expected_mlx5_8x());
}

#[tokio::test]
async fn rxe_inventory_matches_the_tree_exactly() {
    let observer = SysfsObserver::new(fixture("rxe"), &config(50, 5000));
    let inventory = observer.inventory().await.unwrap();
    // node GUID and GID 0 both derive from MAC 52:54:00:ab:cd:ef.
    let expected = port(
        "rxe0",
        0x5054_00ff_feab_cdef,
        0x5054_00ff_feab_cdef,
        PortState::Active,
        LinkLayer::Ethernet,
        table(1, &[(0, 0xffff)]),
    );
    assert_eq!(inventory.ports, vec![expected]);
}

#[tokio::test]
async fn down_port_is_reported_down_and_its_stale_table_does_not_count() {
    let inventory = SysfsObserver::new(fixture("mlx5-8x"), &config(50, 5000))
        .inventory()
        .await
        .unwrap();
    let down: Vec<&PortInfo> = inventory
        .ports
        .iter()
        .filter(|p| p.state == PortState::Down)
        .collect();
    assert_eq!(down.len(), 1);
    assert_eq!(down[0].device, "mlx5_3");
    // The file still lists the key the port held before the cable was pulled...
    assert!(down[0].holds(PKeyValue(0x8a12)));
    // ...but a DOWN port's table does not count.
    assert!(!down[0].state.table_counts());
}

#[tokio::test]
async fn default_selector_takes_the_eight_ib_ports_not_the_roce_bond() {
    let mut inventory = SysfsObserver::new(fixture("mlx5-8x"), &config(50, 5000))
        .inventory()
        .await
        .unwrap();
    PortSelector::default().apply(&mut inventory);
    let selected: Vec<&str> = inventory
        .fabric_ports()
        .map(|p| p.device.as_str())
        .collect();
    assert_eq!(
        selected,
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
    );
    assert_eq!(inventory.tenant_key_capacity(), 127);

    // On an rxe rig the default selects nothing: the operator names the device.
    let mut rxe = SysfsObserver::new(fixture("rxe"), &config(50, 5000))
        .inventory()
        .await
        .unwrap();
    PortSelector::default().apply(&mut rxe);
    assert_eq!(rxe.fabric_ports().count(), 0);
    let named = PortSelector {
        devices: vec!["rxe*".to_owned()],
        guids: vec![],
    };
    named.apply(&mut rxe);
    assert_eq!(rxe.fabric_ports().count(), 1);
}

#[tokio::test]
async fn key_appearing_and_vanishing_is_seen_after_changed() {
    let (_dir, root) = copy_fixture("mlx5-8x");
    let observer = SysfsObserver::new(&root, &config(20, 60_000));
    let key = PKeyValue(0x8c33);
    let before = observer.inventory().await.unwrap();
    assert!(before.ports.iter().all(|p| !p.holds(key)));

    // The SM writes the key into block 1 of mlx5_6 (index 33).
    let slot = root.join("mlx5_6/ports/1/pkeys/33");
    std::fs::write(&slot, "0x8c33\n").unwrap();
    // A pending transition polls fast: changed() returns within the fast interval.
    tokio::time::timeout(Duration::from_secs(5), observer.changed(true))
        .await
        .expect("fast poll while pending");
    let after = observer.inventory().await.unwrap();
    let holders: Vec<&str> = after
        .ports
        .iter()
        .filter(|p| p.holds(key))
        .map(|p| p.device.as_str())
        .collect();
    assert_eq!(holders, ["mlx5_6"]);
    assert_eq!(after.ports[6].pkeys[33], key);
    assert_eq!(after.ports[6].pkeys.len(), 128);

    std::fs::write(&slot, "0x0000\n").unwrap();
    observer.changed(true).await;
    let gone = observer.inventory().await.unwrap();
    assert!(gone.ports.iter().all(|p| !p.holds(key)));
    assert_eq!(gone, before);
}

#[tokio::test]
async fn idle_polls_slowly_and_pending_polls_fast() {
    let observer = SysfsObserver::new(fixture("rxe"), &config(20, 600));
    let start = std::time::Instant::now();
    observer.changed(true).await;
    let fast = start.elapsed();
    assert!(fast >= Duration::from_millis(20), "{fast:?}");
    assert!(fast < Duration::from_millis(600), "{fast:?}");
    // Idle: nothing for at least the slow interval (a timer, no busy loop).
    assert!(
        tokio::time::timeout(Duration::from_millis(300), observer.changed(false))
            .await
            .is_err()
    );
    let start = std::time::Instant::now();
    observer.changed(false).await;
    assert!(start.elapsed() >= Duration::from_millis(600));
}

#[tokio::test]
async fn garbled_and_missing_files_are_named_in_the_error() {
    let (_dir, root) = copy_fixture("rxe");
    let observer = SysfsObserver::new(&root, &config(50, 5000));

    let state = root.join("rxe0/ports/1/state");
    std::fs::write(&state, "ACTIVE\n").unwrap();
    let err = observer.inventory().await.unwrap_err();
    assert!(
        matches!(&err, ObserveError::Read(ReadError::Attr { path, source: AttrError::NotAState(text) })
            if *path == state && text == "ACTIVE"),
        "{err:?}"
    );
    std::fs::write(&state, "4: ACTIVE\n").unwrap();

    let pkey = root.join("rxe0/ports/1/pkeys/0");
    std::fs::write(&pkey, "ffff\n").unwrap();
    let err = observer.inventory().await.unwrap_err();
    assert!(
        matches!(&err, ObserveError::Read(ReadError::Attr { path, source: AttrError::NotHex16(_) })
            if *path == pkey),
        "{err:?}"
    );
    std::fs::write(&pkey, "0xffff\n").unwrap();

    let guid = root.join("rxe0/node_guid");
    std::fs::remove_file(&guid).unwrap();
    let err = observer.inventory().await.unwrap_err();
    assert!(
        matches!(&err, ObserveError::Read(ReadError::File { path, source })
            if *path == guid && source.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    std::fs::write(&guid, "5054:00ff:feab:cdef\n").unwrap();

    // A port without a `pkeys` directory (iWARP) has an empty table, not an error.
    let saved = dir_path_copy(&root.join("rxe0/ports/1/pkeys"));
    std::fs::remove_dir_all(root.join("rxe0/ports/1/pkeys")).unwrap();
    let inventory = observer.inventory().await.unwrap();
    assert!(inventory.ports[0].pkeys.is_empty());
    restore(&root.join("rxe0/ports/1/pkeys"), &saved);

    // A hole in the table (entry 0 gone, 1 present) is refused, not compacted.
    std::fs::write(root.join("rxe0/ports/1/pkeys/1"), "0x0000\n").unwrap();
    std::fs::remove_file(&pkey).unwrap();
    let err = observer.inventory().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ObserveError::Read(ReadError::PKeyGap {
                position: 0,
                index: 1,
                ..
            })
        ),
        "{err:?}"
    );
}

/// The files of a flat directory, by name.
fn dir_path_copy(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

fn restore(dir: &Path, files: &[(std::ffi::OsString, Vec<u8>)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[tokio::test]
async fn missing_root_means_no_devices() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("infiniband");
    let err = SysfsObserver::new(&root, &config(50, 5000))
        .inventory()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ObserveError::NoDevices(NoDevices::NoSysfsRoot(r)) if *r == root),
        "{err:?}"
    );

    // An empty class directory (RDMA loaded, no device) is an empty inventory.
    std::fs::create_dir(&root).unwrap();
    let inventory = SysfsObserver::new(&root, &config(50, 5000))
        .inventory()
        .await
        .unwrap();
    assert!(inventory.ports.is_empty());
}
