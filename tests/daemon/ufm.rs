//! The daemon with the UFM backend, end to end through its gRPC API: the real binary talks to
//! the fake UFM server, and the node's ports are a copied sysfs tree whose P_Key tables the
//! fake's change hook rewrites (a little after each accepted change, like a subnet manager
//! sweeping) from the keys UFM holds for each port GUID. So ACTIVE means "UFM holds the GUIDs
//! and the ports hold the key", RELEASED means "UFM dropped them and the ports lost the key".

use testkit::common;
use testkit::fake_ufm;

use common::*;
use fabric_agent::domain::Membership;
use fabric_agent::proto::agent as pb;
use fabric_agent::proto::agent::fabric_agent_client::FabricAgentClient;
use fake_ufm::{FakeAuth, FakeUfm, LoggedRequest, MembershipChange, Quirks};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The fixture's InfiniBand devices; port GUIDs `GUID0 + i`.
const IB: [&str; 8] = [
    "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
];
const GUID0: u64 = 0xa088_c203_00f1_2e40;
const FIXTURE: &str = "tests/fixtures/sysfs/mlx5-8x";
/// How long after accepting a change the "SM" programs the ports.
const SWEEP_DELAY: Duration = Duration::from_millis(100);
const USER: &str = "admin";
const PASSWORD: &str = "Zq7-canary-pw-41d";

type Client = FabricAgentClient<Channel>;

// ------------------------------------------------------------------ the node's port tree

/// A copy of the fixture tree whose P_Key tables play the part of the ports' hardware.
struct PortTree {
    root: PathBuf,
    /// Device of every InfiniBand port GUID in the tree.
    devices: BTreeMap<u64, String>,
}

impl PortTree {
    /// Copies the fixture to `root`, brings the DOWN port up and empties every table but the
    /// default partition at index 0, a limited member (a freshly swept node with no tenant keys).
    fn copy(root: &Path) -> PortTree {
        copy_dir(Path::new(FIXTURE), root);
        std::fs::write(root.join("mlx5_3/ports/1/state"), "4: ACTIVE\n").unwrap();
        std::fs::write(root.join("mlx5_3/ports/1/phys_state"), "5: LinkUp\n").unwrap();
        let mut devices = BTreeMap::new();
        for entry in std::fs::read_dir(root).unwrap() {
            let dev = entry.unwrap().file_name().to_string_lossy().into_owned();
            let port = root.join(&dev).join("ports/1");
            for index in 1..table_size(&port) {
                write_entry(&port, index, 0);
            }
            let link = std::fs::read_to_string(port.join("link_layer")).unwrap();
            if link.trim() == "InfiniBand" {
                // A well-run fabric: tenant ports are limited members of the default partition.
                write_entry(&port, 0, 0x7fff);
                devices.insert(port_guid(&port), dev);
            }
        }
        assert_eq!(devices.len(), 8, "the fixture has eight InfiniBand ports");
        PortTree {
            root: root.to_owned(),
            devices,
        }
    }

    fn port(&self, dev: &str) -> PathBuf {
        self.root.join(dev).join("ports/1")
    }

    /// What a subnet manager does after UFM accepted `change`: every touched port of this
    /// node ends up holding exactly the keys UFM now lists for its GUID (plus the default
    /// partition). Kept entries stay in their slots; new ones take the first free slot.
    fn apply(&self, change: &MembershipChange) {
        for (guid, keys) in &change.guid_keys {
            let Some(dev) = self.devices.get(guid) else {
                continue;
            };
            let port = self.port(dev);
            let want: BTreeSet<u16> = keys
                .iter()
                .map(|(k, m)| match m {
                    Membership::Full => k | 0x8000,
                    Membership::Limited => *k,
                })
                .collect();
            let size = table_size(&port);
            let mut table: Vec<u16> = (0..size).map(|i| read_entry(&port, i)).collect();
            for (index, value) in table.iter_mut().enumerate().skip(1) {
                if *value != 0 && !want.contains(value) {
                    *value = 0;
                    write_entry(&port, index, 0);
                }
            }
            for key in &want {
                if table.contains(key) {
                    continue;
                }
                let free = (1..size)
                    .find(|i| table[*i] == 0)
                    .expect("a free P_Key slot");
                table[free] = *key;
                write_entry(&port, free, *key);
            }
        }
    }

    /// Removes `value` from every port's table, behind UFM's back.
    fn clear(&self, value: u16) {
        for dev in self.devices.values() {
            let port = self.port(dev);
            for index in 1..table_size(&port) {
                if read_entry(&port, index) == value {
                    write_entry(&port, index, 0);
                }
            }
        }
    }

    /// Non-empty entries of a port's table (default partition excluded).
    fn keys(&self, dev: &str) -> Vec<u16> {
        let port = self.port(dev);
        (1..table_size(&port))
            .map(|i| read_entry(&port, i))
            .filter(|v| *v != 0)
            .collect()
    }

    /// Asserts every InfiniBand port holds exactly `keys` besides the default partition.
    fn assert_all_hold(&self, keys: &[u16]) {
        for dev in IB {
            assert_eq!(self.keys(dev), keys, "P_Key table of {dev}");
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

fn table_size(port: &Path) -> usize {
    std::fs::read_dir(port.join("pkeys")).unwrap().count()
}

fn read_entry(port: &Path, index: usize) -> u16 {
    let text = std::fs::read_to_string(port.join(format!("pkeys/{index}"))).unwrap();
    u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).unwrap()
}

/// Replaces one table entry atomically (temp file beside `pkeys/`, then rename), so neither
/// the agent's observer nor a test ever reads a half-written entry.
fn write_entry(port: &Path, index: usize, value: u16) {
    let tmp = port.join(format!(".pkey-{index}.tmp"));
    std::fs::write(&tmp, format!("{value:#06x}\n")).unwrap();
    std::fs::rename(&tmp, port.join(format!("pkeys/{index}"))).unwrap();
}

/// The port GUID from the low half of GID 0 (`fe80:…:a088:c203:00f1:2e40`).
fn port_guid(port: &Path) -> u64 {
    let gid = std::fs::read_to_string(port.join("gids/0")).unwrap();
    let low: String = gid.trim().split(':').skip(4).collect();
    u64::from_str_radix(&low, 16).unwrap()
}

fn all_guids() -> BTreeMap<u64, Membership> {
    (0..8).map(|i| (GUID0 + i, Membership::Full)).collect()
}

fn guid_list() -> String {
    (0..8)
        .map(|i| format!("{:016x}", GUID0 + i))
        .collect::<Vec<_>>()
        .join(",")
}

// ------------------------------------------------------------------ the node

/// A daemon on the copied tree, talking to `fake`, plus the files it uses.
struct Node {
    daemon: Daemon,
    tree: Arc<PortTree>,
    credentials: PathBuf,
    _tmp: tempfile::TempDir,
}

/// Starts a daemon with the UFM backend (credentials `user:password` in a file) and hooks
/// the fake's changes up to the port tree.
fn start_node(fake: &FakeUfm, credentials: &str) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let tree = Arc::new(PortTree::copy(&tmp.path().join("sys")));
    let hook = tree.clone();
    fake.on_change(SWEEP_DELAY, move |change| hook.apply(change));
    let cred = tmp.path().join("ufm.cred");
    std::fs::write(&cred, format!("{credentials}\n")).unwrap();
    std::fs::set_permissions(
        &cred,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
    let devices: Vec<String> = IB.iter().map(|d| format!("\"{d}\"")).collect();
    // max_skipped_rechecks = 0: these tests pin each apply's partition reads (no stamp read
    // first); tests/ufm/fleet.rs covers the stamp.
    let extra = format!(
        "[subnet_manager]\nbackend = \"ufm\"\n\
         [subnet_manager.ufm]\nurl = \"{}\"\ncredentials_file = \"{}\"\n\
         connect_timeout_ms = 500\nrequest_timeout_ms = 2000\nretries = 1\n\
         backoff_initial_ms = 50\nbackoff_max_ms = 100\nmax_skipped_rechecks = 0\n\
         [observer]\nkind = \"sysfs\"\nsysfs_root = \"{}\"\nfast_poll_ms = 20\nslow_poll_ms = 200\n\
         [ports]\ndevices = [{}]\n\
         [reconciler]\nbackoff_initial_ms = 100\nbackoff_max_ms = 1000\n",
        fake.url(),
        cred.display(),
        tree.root.display(),
        devices.join(", ")
    );
    let mut daemon = Daemon::prepare(tmp.path(), &extra);
    daemon.spawn(&[]);
    Node {
        daemon,
        tree,
        credentials: cred,
        _tmp: tmp,
    }
}

async fn node_status(c: &mut Client) -> pb::GetNodeResponse {
    c.get_node(pb::GetNodeRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Waits until the start-up apply went through (so later request logs hold only what a test
/// caused), then forgets the requests seen so far.
async fn settle(c: &mut Client, fake: &FakeUfm) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let sm = node_status(c).await.subnet_manager.unwrap();
        if sm.applies >= 1 && sm.reachable {
            break;
        }
        assert!(Instant::now() < deadline, "start-up apply: {sm:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(node_status(c).await.observer, "sysfs");
    fake.clear_requests();
}

async fn get(c: &mut Client, instance: &str) -> pb::Attachment {
    c.get_attachment(pb::GetAttachmentRequest {
        instance_id: instance.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Polls until `instance` is in `want`; panics with its last state and reason otherwise.
async fn wait_state(
    c: &mut Client,
    instance: &str,
    want: pb::AttachmentState,
    limit: Duration,
) -> pb::Attachment {
    let deadline = Instant::now() + limit;
    loop {
        let a = get(c, instance).await;
        if state(&a) == want {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "{instance} did not reach {want:?} within {limit:?}: {:?} ({})",
            state(&a),
            a.reason
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn attach_to(c: &mut Client, instance: &str, id: &str, pkey: u32) -> pb::Attachment {
    c.attach_partition(attach(instance, partition(id, pkey), Some(5000)))
        .await
        .unwrap()
        .into_inner()
        .attachment
        .unwrap()
}

async fn release(c: &mut Client, instance: &str, wait_ms: Option<u32>) -> pb::Attachment {
    c.release_instance(pb::ReleaseInstanceRequest {
        instance_id: instance.into(),
        wait_ms,
    })
    .await
    .unwrap()
    .into_inner()
    .attachment
    .unwrap()
}

/// `METHOD path` of every request, in order.
fn lines(requests: &[LoggedRequest]) -> Vec<String> {
    requests
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// The states `instance` went through, from its AttachmentChanged events (the first is the
/// state it was created in).
async fn history(c: &mut Client, instance: &str) -> Vec<pb::AttachmentState> {
    let evs = events(c, 0).await;
    assert_gap_free(&evs);
    let mut out = Vec::new();
    for e in evs {
        if let Some(pb::event::Kind::AttachmentChanged(a)) = e.kind {
            if a.instance_id == instance {
                out.push(pb::AttachmentState::try_from(a.to).unwrap());
            }
        }
    }
    out
}

// ------------------------------------------------------------------ tests

/// Runs a test's steps with a time limit, so a stuck call fails the test instead of hanging
/// the suite (the daemon and the fake stop when the dropped steps drop them).
async fn within(secs: u64, steps: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(Duration::from_secs(secs), steps)
        .await
        .is_err()
    {
        panic!("the test did not finish within {secs} s");
    }
}

use pb::AttachmentState::{Active, Drifted, Pending, Programming, Released, Releasing};

/// Attach then release one instance; `delete_form` makes the fake drop the deprecated
/// removal action so the backend must fall back to `DELETE …/guids/…`.
async fn round_trip(delete_form: bool) {
    let fake = FakeUfm::start().await;
    fake.set_quirks(Quirks {
        remove_action_gone: delete_form,
        ..Quirks::default()
    });
    let node = start_node(&fake, &format!("{USER}:123456"));
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;

    let a = attach_to(&mut c, "gpu-1", "ibpart_train", 0x0c33).await;
    assert_eq!(state(&a), Active, "{}", a.reason);
    assert_eq!(fake.members(0x0c33), all_guids());
    node.tree.assert_all_hold(&[0x8c33]);
    let read = "GET /ufmRest/resources/pkeys/0x0c33?guids_data=true";
    assert_eq!(
        lines(&fake.requests()),
        [read, "POST /ufmRest/resources/pkeys", read],
        "attach"
    );
    let add = &fake.requests()[1];
    let body = add.body.as_ref().unwrap();
    assert_eq!(body["pkey"], "0x0c33");
    assert_eq!(body["membership"], "full");
    assert_eq!(body["guids"].as_array().unwrap().len(), 8);

    fake.clear_requests();
    let r = release(&mut c, "gpu-1", Some(5000)).await;
    assert_eq!(state(&r), Released, "{}", r.reason);
    assert!(fake.members(0x0c33).is_empty());
    assert!(
        fake.partition(0x0c33).is_some(),
        "no quirk: UFM keeps the emptied partition"
    );
    node.tree.assert_all_hold(&[]);
    let delete = format!(
        "DELETE /ufmRest/resources/pkeys/0x0c33/guids/{}",
        guid_list()
    );
    let action = "POST /ufmRest/actions/remove_guids_from_pkey";
    let want: Vec<String> = if delete_form {
        vec![read.into(), action.into(), delete, read.into()]
    } else {
        vec![read.into(), action.into(), read.into()]
    };
    let seen = fake.requests();
    assert_eq!(lines(&seen), want, "release");
    assert_eq!(seen[1].status, if delete_form { 404 } else { 200 });

    // Once the action is known to be gone, the next removal goes straight to DELETE.
    if delete_form {
        let a = attach_to(&mut c, "gpu-2", "ibpart_train", 0x0c33).await;
        assert_eq!(state(&a), Active, "{}", a.reason);
        fake.clear_requests();
        let r = release(&mut c, "gpu-2", Some(5000)).await;
        assert_eq!(state(&r), Released, "{}", r.reason);
        let delete = format!(
            "DELETE /ufmRest/resources/pkeys/0x0c33/guids/{}",
            guid_list()
        );
        assert_eq!(
            lines(&fake.requests()),
            [read.to_string(), delete, read.to_string()]
        );
    }
    assert_eq!(
        history(&mut c, "gpu-1").await,
        [Pending, Programming, Active, Releasing, Released]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_release_with_the_remove_action() {
    within(30, round_trip(false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_release_with_the_delete_form_when_the_action_is_gone() {
    within(30, round_trip(true)).await;
}

/// UFM versions that answer `200 {}` for a key they do not have: the backend creates it.
async fn missing_key_answered_with_an_empty_object_is_created_steps() {
    let fake = FakeUfm::start().await;
    fake.set_quirks(Quirks {
        missing_key_empty_object: true,
        ..Quirks::default()
    });
    let node = start_node(&fake, &format!("{USER}:123456"));
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;

    let a = attach_to(&mut c, "gpu-1", "ibpart_train", 0x0c33).await;
    assert_eq!(state(&a), Active, "{}", a.reason);
    node.tree.assert_all_hold(&[0x8c33]);
    let seen = fake.requests();
    let read = "GET /ufmRest/resources/pkeys/0x0c33?guids_data=true";
    assert_eq!(
        lines(&seen),
        [read, "POST /ufmRest/resources/pkeys", read],
        "the empty object counted as a missing key"
    );
    assert_eq!(seen[0].status, 200);

    // The key vanishes from UFM (an operator) while releasing: `{}` again, nothing to
    // remove, and the release completes once the ports lost the key.
    fake.set_delay(Duration::from_millis(300));
    let r = release(&mut c, "gpu-1", None).await;
    assert_eq!(state(&r), Releasing);
    fake.drop_partition(0x0c33);
    fake.set_delay(Duration::ZERO);
    let r = wait_state(&mut c, "gpu-1", Released, Duration::from_secs(5)).await;
    assert!(r.reason.is_empty(), "{}", r.reason);
    node.tree.assert_all_hold(&[]);
    assert!(fake.partition(0x0c33).is_none());
}

/// UFM deletes a partition whose last GUID left; a partition still desired is re-created,
/// both when another instance leaves it empty and when it disappears while ACTIVE.
async fn deleted_partitions_are_recreated_while_desired_steps() {
    let fake = FakeUfm::start().await;
    fake.set_quirks(Quirks {
        delete_emptied_partitions: true,
        ..Quirks::default()
    });
    let node = start_node(&fake, &format!("{USER}:123456"));
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;

    // Two instances, two partitions, each on its own four ports (a port carries one
    // partition at a time).
    let on = |instance: &str, id: &str, pkey: u32, devs: &[&str]| {
        let ports: Vec<String> = devs.iter().map(|d| format!("{d}/1")).collect();
        let ports: Vec<&str> = ports.iter().map(String::as_str).collect();
        attach_on(instance, partition(id, pkey), &ports, Some(5000))
    };
    let half = |from: u64| -> BTreeMap<u64, Membership> {
        (from..from + 4)
            .map(|i| (GUID0 + i, Membership::Full))
            .collect()
    };
    let holds = |devs: &[&str], keys: &[u16]| {
        for d in devs {
            assert_eq!(node.tree.keys(d), keys, "P_Key table of {d}");
        }
    };
    assert_eq!(
        state(&attach_now(&mut c, on("gpu-1", "ibpart_train", 0x0c33, &IB[..4])).await),
        Active
    );
    assert_eq!(
        state(&attach_now(&mut c, on("gpu-2", "ibpart_eval", 0x0d44, &IB[4..])).await),
        Active
    );
    holds(&IB[..4], &[0x8c33]);
    holds(&IB[4..], &[0x8d44]);
    assert_eq!(fake.members(0x0c33), half(0));
    assert_eq!(fake.members(0x0d44), half(4));

    // Releasing gpu-1 empties 0x0c33: UFM deletes it; 0x0d44 is untouched.
    let r = release(&mut c, "gpu-1", Some(5000)).await;
    assert_eq!(state(&r), Released, "{}", r.reason);
    assert!(fake.partition(0x0c33).is_none(), "UFM deleted it");
    assert_eq!(fake.members(0x0d44), half(4));
    holds(&IB[..4], &[]);
    holds(&IB[4..], &[0x8d44]);
    assert_eq!(state(&get(&mut c, "gpu-2").await), Active);

    // Now UFM drops 0x0d44 while gpu-2 is ACTIVE: the ports lose the key (DRIFTED), the
    // agent re-creates the partition, the ports get the key back (ACTIVE).
    fake.clear_requests();
    fake.drop_partition(0x0d44);
    // DRIFTED may last only a sweep delay (the event history below proves it happened):
    // wait for the partition to be back in UFM and on the ports, and ACTIVE again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let back = fake.members(0x0d44) == half(4)
            && IB[4..].iter().all(|d| node.tree.keys(d) == [0x8d44])
            && state(&get(&mut c, "gpu-2").await) == Active;
        if back {
            break;
        }
        assert!(Instant::now() < deadline, "0x0d44 not re-created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(get(&mut c, "gpu-2").await.reason.is_empty());
    assert!(
        lines(&fake.requests()).contains(&"POST /ufmRest/resources/pkeys".to_string()),
        "re-created: {:?}",
        lines(&fake.requests())
    );
    assert_eq!(
        history(&mut c, "gpu-2").await,
        [Pending, Programming, Active, Drifted, Active]
    );
}

/// UFM goes away in the middle of a release for a full minute: the attachment stays
/// RELEASING the whole time (UFM still lists the GUIDs, even after the ports drop the key on
/// their own), the reason says why, the agent backs off instead of hammering, and RELEASED
/// follows within seconds of UFM's return.
async fn ufm_outage_during_release_holds_releasing_then_converges_steps() {
    const OUTAGE: Duration = Duration::from_secs(60);
    let fake = FakeUfm::start().await;
    let node = start_node(&fake, &format!("{USER}:123456"));
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;
    let a = attach_to(&mut c, "gpu-1", "ibpart_train", 0x0c33).await;
    assert_eq!(state(&a), Active, "{}", a.reason);
    fake.clear_requests();

    // Slow answers so the release's first read is still in flight when UFM goes down: the
    // read succeeds, the removal that follows meets the outage.
    fake.set_delay(Duration::from_millis(400));
    let r = release(&mut c, "gpu-1", None).await;
    assert_eq!(state(&r), Releasing);
    tokio::time::sleep(Duration::from_millis(150)).await;
    fake.outage_503(OUTAGE);
    let outage_end = Instant::now() + OUTAGE;
    fake.set_delay(Duration::ZERO);

    let mut saw_reason = false;
    let mut reset = false;
    while Instant::now() + Duration::from_millis(300) < outage_end {
        if !reset && Instant::now() + OUTAGE / 2 > outage_end {
            // Halfway, the ports drop the key on their own (a port reset): UFM still lists
            // the GUIDs, so the release is still not done.
            node.tree.clear(0x8c33);
            reset = true;
        }
        let a = get(&mut c, "gpu-1").await;
        assert_eq!(
            state(&a),
            Releasing,
            "no RELEASED while UFM is down: {}",
            a.reason
        );
        saw_reason |= a.reason.contains("unavailable");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(saw_reason, "the attachment told why it waits");
    let sm = node_status(&mut c).await.subnet_manager.unwrap();
    assert!(!sm.reachable);
    assert!(sm.last_error.contains("503"), "{}", sm.last_error);
    assert_eq!(fake.members(0x0c33), all_guids(), "UFM still holds them");
    node.tree.assert_all_hold(&[]);
    let during = fake.request_count();
    let head: Vec<String> = fake
        .requests()
        .iter()
        .take(3)
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    eprintln!("release met the outage: {head:#?}");
    // Reconciler backoff capped at 1 s, two attempts per apply: about 120 requests.
    assert!(
        during < 300,
        "{during} requests during a 60 s outage: no backoff"
    );

    let a = wait_state(&mut c, "gpu-1", Released, Duration::from_secs(5)).await;
    let late = Instant::now().saturating_duration_since(outage_end);
    eprintln!("RELEASED {late:?} after the outage ended ({during} requests during it)");
    assert!(a.reason.is_empty(), "{}", a.reason);
    assert!(fake.members(0x0c33).is_empty());
    node.tree.assert_all_hold(&[]);
    let sm = node_status(&mut c).await.subnet_manager.unwrap();
    assert!(sm.reachable && sm.last_error.is_empty(), "{sm:?}");
    assert_eq!(
        history(&mut c, "gpu-1").await,
        [Pending, Programming, Active, Releasing, Released]
    );
}

/// Wrong credentials: a clear error in GetNode and on the attachment, no further calls until
/// the credentials file changes, and ACTIVE once it holds the right ones.
async fn wrong_credentials_stop_calls_until_the_file_changes_steps() {
    let fake = FakeUfm::start_with(FakeAuth::Basic {
        user: USER.into(),
        password: PASSWORD.into(),
    })
    .await;
    let node = start_node(&fake, &format!("{USER}:not-the-password"));
    let mut c = node.daemon.client().await;
    let a = c
        .attach_partition(attach("gpu-1", partition("ibpart_train", 0x0c33), None))
        .await
        .unwrap()
        .into_inner()
        .attachment
        .unwrap();
    assert_eq!(state(&a), Pending);

    // Wait for the refusal to show.
    let deadline = Instant::now() + Duration::from_secs(5);
    let sm = loop {
        let sm = node_status(&mut c).await.subnet_manager.unwrap();
        if !sm.last_error.is_empty() {
            break sm;
        }
        assert!(Instant::now() < deadline, "no error shown: {sm:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let cred = node.credentials.display().to_string();
    assert!(!sm.reachable);
    assert!(
        sm.last_error.contains("rejected the credentials") && sm.last_error.contains(&cred),
        "{}",
        sm.last_error
    );
    let rejected = fake.requests();
    assert!(!rejected.is_empty() && rejected.iter().all(|r| r.status == 401));
    let calls = rejected.len();

    // The reconciler keeps retrying (about once a second) but the backend does not call UFM.
    let applies = sm.applies;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let sm = node_status(&mut c).await.subnet_manager.unwrap();
    assert!(
        sm.applies >= applies + 2,
        "retried: {applies} -> {}",
        sm.applies
    );
    assert_eq!(
        fake.request_count(),
        calls,
        "no call with the rejected secret"
    );
    let a = get(&mut c, "gpu-1").await;
    assert_eq!(state(&a), Pending);
    assert!(
        a.reason.contains("rejected the credentials") && a.reason.contains(&cred),
        "{}",
        a.reason
    );

    // Fix the file: the next retry calls UFM and converges.
    std::fs::write(&node.credentials, format!("{USER}:{PASSWORD}\n")).unwrap();
    let a = wait_state(&mut c, "gpu-1", Active, Duration::from_secs(5)).await;
    assert!(a.reason.is_empty(), "{}", a.reason);
    assert!(fake.request_count() > calls);
    node.tree.assert_all_hold(&[0x8c33]);
    let sm = node_status(&mut c).await.subnet_manager.unwrap();
    assert!(sm.reachable && sm.last_error.is_empty(), "{sm:?}");
}

/// Standard base64, to look for an encoded `user:password` too.
fn base64(input: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(input)
}

/// No credential in the log, the status, the attachments or the events, even when UFM
/// quotes the `Authorization` header back in its errors, and with a wrong password too.
async fn credentials_never_leak_into_log_status_or_events_steps() {
    let wrong = "Wr0ng-canary-pw-77c";
    let fake = FakeUfm::start_with(FakeAuth::Basic {
        user: USER.into(),
        password: PASSWORD.into(),
    })
    .await;
    fake.set_echo_auth(true);
    let node = start_node(&fake, &format!("{USER}:{PASSWORD}"));
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;

    // UFM refuses a request quoting the header back (4xx: its words reach the reason).
    fake.inject_status(1, 400);
    // Each instance on its own four ports (a port carries one partition at a time).
    let (first, second) = (
        ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1"],
        ["mlx5_4/1", "mlx5_5/1", "mlx5_6/1", "mlx5_7/1"],
    );
    c.attach_partition(attach_on(
        "gpu-1",
        partition("ibpart_train", 0x0c33),
        &first,
        None,
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let a = get(&mut c, "gpu-1").await;
        if a.reason.contains("400") {
            break a.reason;
        }
        assert!(Instant::now() < deadline, "refusal not shown: {a:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        refused.contains("<redacted>"),
        "UFM's quote shown: {refused}"
    );
    wait_state(&mut c, "gpu-1", Active, Duration::from_secs(5)).await;
    // 503s quoting the header (retried, then reported as unavailable).
    fake.inject_status(4, 503);
    c.attach_partition(attach_on(
        "gpu-2",
        partition("ibpart_eval", 0x0d44),
        &second,
        None,
    ))
    .await
    .unwrap();
    wait_state(&mut c, "gpu-2", Active, Duration::from_secs(5)).await;
    // A wrong password, rejected, then the right one again.
    std::fs::write(&node.credentials, format!("{USER}:{wrong}\n")).unwrap();
    fake.drop_partition(0x0d44);
    wait_state(&mut c, "gpu-2", Drifted, Duration::from_secs(5)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node_status(&mut c)
        .await
        .subnet_manager
        .unwrap()
        .last_error
        .contains("rejected the credentials")
    {
        assert!(Instant::now() < deadline, "wrong password not reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(&node.credentials, format!("{USER}:{PASSWORD}\n")).unwrap();
    wait_state(&mut c, "gpu-2", Active, Duration::from_secs(5)).await;
    release(&mut c, "gpu-1", Some(5000)).await;

    let secrets = [
        PASSWORD.to_string(),
        wrong.to_string(),
        base64(format!("{USER}:{PASSWORD}").as_bytes()),
        base64(format!("{USER}:{wrong}").as_bytes()),
    ];
    assert!(
        fake.requests().iter().any(|r| r.status == 400),
        "the echo was exercised"
    );
    let node_text = format!("{:?}", node_status(&mut c).await);
    let list = c
        .list_attachments(pb::ListAttachmentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let list_text = format!("{list:?}");
    let events_text = format!("{:?}", events(&mut c, 0).await);
    let log = node.daemon.log();
    assert!(log.contains("rejected"), "the log records the refusals");
    for (what, text) in [
        ("daemon log", &log),
        ("GetNode", &node_text),
        ("ListAttachments", &list_text),
        ("events", &events_text),
    ] {
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{what} holds a credential ({secret}):\n{text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_key_answered_with_an_empty_object_is_created() {
    within(
        30,
        missing_key_answered_with_an_empty_object_is_created_steps(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_partitions_are_recreated_while_desired() {
    within(30, deleted_partitions_are_recreated_while_desired_steps()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ufm_outage_during_release_holds_releasing_then_converges() {
    within(
        120,
        ufm_outage_during_release_holds_releasing_then_converges_steps(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_stop_calls_until_the_file_changes() {
    within(
        30,
        wrong_credentials_stop_calls_until_the_file_changes_steps(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_leak_into_log_status_or_events() {
    within(45, credentials_never_leak_into_log_status_or_events_steps()).await;
}

/// The agent is killed while attached and comes back with four of its eight ports no longer
/// selected (as if their HCAs failed to enumerate): the release still takes every GUID it
/// ever put in the key out of it, because the ledger in the store remembers them.
async fn a_release_after_a_restart_with_fewer_ports_removes_every_guid_steps() {
    let fake = FakeUfm::start().await;
    let mut node = start_node(&fake, &format!("{USER}:123456"));
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;
    let a = attach_to(&mut c, "gpu-1", "ibpart_train", 0x0c33).await;
    assert_eq!(state(&a), Active, "{}", a.reason);
    assert_eq!(fake.members(0x0c33), all_guids());

    node.daemon.crash();
    let config = std::fs::read_to_string(&node.daemon.config).unwrap();
    let devices: Vec<String> = IB.iter().map(|d| format!("\"{d}\"")).collect();
    let narrowed = config.replace(&devices.join(", "), &devices[..4].join(", "));
    assert_ne!(narrowed, config);
    std::fs::write(&node.daemon.config, narrowed).unwrap();
    node.daemon.spawn(&[]);
    let mut c = node.daemon.client().await;
    settle(&mut c, &fake).await;

    let r = release(&mut c, "gpu-1", Some(5000)).await;
    assert_eq!(state(&r), Released, "{}", r.reason);
    assert!(
        fake.members(0x0c33).is_empty(),
        "hidden GUIDs left in the key: {:?}",
        fake.members(0x0c33)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_restart_with_fewer_ports_removes_every_guid() {
    within(
        30,
        a_release_after_a_restart_with_fewer_ports_removes_every_guid_steps(),
    )
    .await;
}
