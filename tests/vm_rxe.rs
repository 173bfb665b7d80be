//! A real kernel under test: a Debian 12 guest (scripts/vm-rig.sh, booted once for the whole
//! binary) with soft-RoCE `rxe0` on its `eth0`. Each test is one scenario that runs inside the
//! guest (this binary again, with `FABRIC_VM_GUEST=1`); on the host the test reports the
//! scenario's exit code and log. Covered: the verbs observer against `ibv_devinfo -v`, the sysfs
//! observer against the verbs one, async port events from a link down/up (in libibverbs and in
//! the agent's event log), an rxe link removed and added back while observed, the .deb under the
//! guest's real systemd (start, reload, verify, stop on a host without procps), and
//! docs/RXE.md's embedded-backend story through the CLI.

use testkit::common;
#[path = "vm/guest.rs"]
mod guest;
#[path = "vm/rig.rs"]
mod rig;

use fabric_agent::config::ObserverConfig;
use fabric_agent::domain::{Guid, LinkLayer, PKeyValue, PortState};
use fabric_agent::observe::sysfs::SysfsObserver;
use fabric_agent::observe::verbs::VerbsObserver;
use fabric_agent::observe::PortObserver;
use fabric_agent::sys::verbs::{AsyncEventKind, AsyncEvents, DeviceList};
use guest::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every scenario, in the order the guest runs them (the .deb one last: it installs a package).
const SCENARIOS: &[&str] = &[
    "verbs_observer_matches_ibv_devinfo_on_rxe",
    "sysfs_observer_reads_the_same_view_as_verbs",
    "link_down_up_raises_port_events_in_verbs_and_the_agent",
    "verbs_observer_recovers_when_rxe_is_removed_and_added_back",
    "rxe_embedded_story_attach_active_release_released",
    "deb_on_minimal_debian_starts_reloads_and_stops_under_systemd",
];

/// Runs `body` in the guest, or checks its result on the host.
fn scenario(name: &str, body: fn()) {
    assert!(SCENARIOS.contains(&name), "{name} is not in SCENARIOS");
    if rig::in_guest() {
        body();
    } else {
        rig::check(name, SCENARIOS);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How long a port event may take to reach libibverbs and the agent (the guest is emulated
/// when the host has no hardware KVM, so this is generous; the agent's slow poll is a minute).
const EVENT_BOUND: Duration = Duration::from_secs(10);

#[test]
fn verbs_observer_matches_ibv_devinfo_on_rxe() {
    scenario("verbs_observer_matches_ibv_devinfo_on_rxe", || {
        let info = DevInfo::read("rxe0");
        runtime().block_on(async {
            let observer = VerbsObserver::open(&ObserverConfig::default()).expect("open verbs");
            assert_eq!(observer.device_names(), ["rxe0"]);
            let inventory = observer.inventory().await.expect("verbs inventory");
            eprintln!("verbs inventory: {inventory:#?}");
            let [port] = &inventory.ports[..] else {
                panic!("one port expected: {inventory:?}")
            };
            assert_eq!((port.device.as_str(), port.port_number), ("rxe0", 1));
            assert_eq!(port.node_guid, Guid(info.guid("node_guid")));
            assert_eq!(port.node_guid, Guid(MAC_EUI64), "EUI-64 of the guest's MAC");
            assert_eq!(info.field("state"), "PORT_ACTIVE (4)");
            assert_eq!(port.state, PortState::Active);
            assert_eq!(info.field("link_layer"), "Ethernet");
            assert_eq!(port.link_layer, LinkLayer::Ethernet);
            assert_eq!(port.lid.to_string(), info.field("port_lid"));
            assert_eq!(port.sm_lid.to_string(), info.field("sm_lid"));
            // GID 0 holds the port GUID as its interface id; the whole table must agree.
            assert_eq!(
                port.port_guid.0,
                u64::from_be_bytes(info.gids[&0][8..].try_into().unwrap())
            );
            assert!(!info.gids.is_empty());
            let list = DeviceList::get().unwrap();
            let device = list.open(0).unwrap();
            let attributes = device.query_device().unwrap();
            assert_eq!(attributes.node_guid, info.guid("node_guid"));
            assert_eq!(attributes.sys_image_guid, info.guid("sys_image_guid"));
            assert_eq!(
                attributes.max_pkeys.to_string(),
                info.field("max_pkeys"),
                "max_pkeys"
            );
            assert_eq!(
                attributes.phys_port_cnt.to_string(),
                info.field("phys_port_cnt")
            );
            let attrs = device.query_port(1).unwrap();
            assert_eq!(attrs.gid_tbl_len.to_string(), info.field("gid_tbl_len"));
            for (index, want) in &info.gids {
                let gid = device.query_gid(1, *index).unwrap();
                assert_eq!(&gid.0, want, "GID[{index}]");
            }
            // rxe has one P_Key entry, the full default; sysfs says the same.
            assert_eq!(port.pkeys, [PKeyValue(0xffff)]);
            let sysfs_pkey = sh_ok("cat /sys/class/infiniband/rxe0/ports/1/pkeys/0");
            assert_eq!(sysfs_pkey.trim(), "0xffff");
        });
        // The CLI's direct read through the configured verbs observer shows the same.
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "fabric = \"lab-rxe\"\n[subnet_manager]\nbackend = \"embedded\"\n\
             [observer]\nkind = \"verbs\"\n",
        )
        .unwrap();
        let out = sh_ok(&format!(
            "{} --config {} ports --json",
            guest::BIN,
            config.display()
        ));
        let ports: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(ports["observer"], "verbs");
        let guid = format!("{MAC_EUI64:#018x}");
        assert!(
            has_object(
                &ports,
                &[
                    ("device", "rxe0"),
                    ("node_guid", &guid),
                    ("port_guid", &guid),
                    ("state", "ACTIVE"),
                    ("link_layer", "ETHERNET"),
                ]
            ),
            "{ports}"
        );
        assert_eq!(ports["ports"][0]["pkeys"], serde_json::json!(["0xffff"]));
    });
}

#[test]
fn sysfs_observer_reads_the_same_view_as_verbs() {
    scenario("sysfs_observer_reads_the_same_view_as_verbs", || {
        runtime().block_on(async {
            let config = ObserverConfig::default();
            let verbs = VerbsObserver::open(&config)
                .unwrap()
                .inventory()
                .await
                .unwrap();
            let sysfs = SysfsObserver::new("/sys/class/infiniband", &config)
                .inventory()
                .await
                .unwrap();
            eprintln!("sysfs inventory: {sysfs:#?}");
            assert_eq!(sysfs.ports.len(), 1);
            assert_eq!(sysfs, verbs, "sysfs and verbs disagree on the real kernel");
        });
    });
}

#[test]
fn link_down_up_raises_port_events_in_verbs_and_the_agent() {
    scenario(
        "link_down_up_raises_port_events_in_verbs_and_the_agent",
        || {
            let agent = Agent::start("verbs");
            runtime().block_on(async {
                let list = DeviceList::get().unwrap();
                let device = Arc::new(list.open(0).unwrap());
                let events = AsyncEvents::new(Arc::clone(&device)).unwrap();
                let observer = VerbsObserver::open(&ObserverConfig::default()).unwrap();
                for (action, want_event, want_state) in [
                    ("down", AsyncEventKind::PortError, PortState::Down),
                    ("up", AsyncEventKind::PortActive, PortState::Active),
                ] {
                    let started = Instant::now();
                    sh_ok(&format!("ip link set {NETDEV} {action}"));
                    let seen = tokio::time::timeout(EVENT_BOUND, async {
                        loop {
                            let batch = events.next_batch().await.unwrap();
                            eprintln!("async events: {batch:?}");
                            if batch
                                .iter()
                                .any(|e| e.kind == want_event && e.port == Some(1))
                            {
                                break;
                            }
                        }
                    })
                    .await;
                    assert!(seen.is_ok(), "no {want_event:?} within {EVENT_BOUND:?}");
                    eprintln!(
                        "link {action}: {want_event:?} after {} ms",
                        started.elapsed().as_millis()
                    );
                    let inventory = observer.inventory().await.unwrap();
                    assert_eq!(inventory.ports[0].state, want_state);
                }
            });
            // The agent saw both transitions through its event log, long before its slow poll.
            let (down, up) = (
                [("device", "rxe0"), ("from", "ACTIVE"), ("to", "DOWN")],
                [("device", "rxe0"), ("from", "DOWN"), ("to", "ACTIVE")],
            );
            let started = Instant::now();
            let both = wait_until(EVENT_BOUND, || {
                let events = agent.events();
                events.iter().any(|e| has_object(e, &down))
                    && events.iter().any(|e| has_object(e, &up))
            });
            eprintln!("agent events: {:?}", agent.events());
            assert!(
                both,
                "the agent logged no DOWN/ACTIVE port events:\n{}",
                agent.log()
            );
            eprintln!(
                "agent port events present {} ms after the link came back",
                started.elapsed().as_millis()
            );
        },
    );
}

#[test]
fn verbs_observer_recovers_when_rxe_is_removed_and_added_back() {
    scenario(
        "verbs_observer_recovers_when_rxe_is_removed_and_added_back",
        || {
            let agent = Agent::start("verbs");
            runtime().block_on(async {
                let observer = VerbsObserver::open(&ObserverConfig::default()).unwrap();
                let before = observer.inventory().await.unwrap();
                assert_eq!(before.ports.len(), 1);
                // rxe cannot disassociate a user context: the kernel sends DEVICE_FATAL to every
                // open context, then `rdma link delete` waits until each one is closed. So the
                // delete runs in the background while the observer (and the agent) let go.
                let mut delete = std::process::Command::new("rdma")
                    .args(["link", "delete", "rxe0"])
                    .spawn()
                    .expect("spawn rdma link delete");
                let started = Instant::now();
                let mut gone = None;
                while started.elapsed() < EVENT_BOUND && gone.is_none() {
                    tokio::time::timeout(Duration::from_millis(500), observer.changed(false))
                        .await
                        .ok();
                    // The ports of a device that went away are unknown, not absent: the read
                    // fails, naming it (never a stale read, never an inventory without it).
                    match observer.inventory().await {
                        Err(e) if e.to_string().contains("rxe0 gone") => gone = Some(e),
                        other => eprintln!("rxe0 not gone yet: {other:?}"),
                    }
                }
                let gone = gone.expect("the observer kept reading a removed device");
                eprintln!("read with rxe0 removed: {gone}");
                let deleted = tokio::task::spawn_blocking(move || {
                    common::process::wait_timeout(&mut delete, EVENT_BOUND)
                })
                .await
                .unwrap();
                if !deleted.is_some_and(|s| s.success()) {
                    sh("for f in /proc/[0-9]*/fd/*; do l=$(readlink $f); case $l in *uverbs*) echo $f $l $(cat ${f%/fd/*}/cmdline | tr '\\0' ' ');; esac; done");
                    panic!("rdma link delete did not finish: a context stayed open\n{}", agent.log());
                }
                eprintln!(
                    "rxe0 removed, contexts closed, delete done after {} ms",
                    started.elapsed().as_millis()
                );
                rxe_add();
                let started = Instant::now();
                let mut last = None;
                while started.elapsed() < EVENT_BOUND {
                    match observer.inventory().await {
                        Ok(inventory) if inventory.ports.len() == 1 => {
                            last = Some(inventory);
                            break;
                        }
                        other => eprintln!("not back yet: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let after = last.expect("rxe0 re-registered but the observer never read it");
                eprintln!("rxe0 read again after {} ms", started.elapsed().as_millis());
                assert_eq!(observer.device_names(), ["rxe0"]);
                assert_eq!(after.ports[0].port_guid, before.ports[0].port_guid);
                assert_eq!(after.ports[0].node_guid, before.ports[0].node_guid);
                // And again, through the reopened context (not a one-off fresh read).
                assert_eq!(observer.inventory().await.unwrap().ports.len(), 1);
            });
            // The running agent recovered too: `node` lists rxe0 again.
            let back = wait_until(EVENT_BOUND * 3, || {
                let out = agent.cli(&["node", "--json"]);
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("rxe0")
            });
            assert!(back, "the agent never listed rxe0 again:\n{}", agent.log());
            assert!(
                agent.log().contains("devices reopened"),
                "no reopen in the agent's log:\n{}",
                agent.log()
            );
        },
    );
}

#[test]
fn rxe_embedded_story_attach_active_release_released() {
    scenario("rxe_embedded_story_attach_active_release_released", || {
        // docs/RXE.md: embedded backend, observer auto (libibverbs finds rxe0).
        let agent = Agent::start("auto");
        let node = agent.cli(&["node", "--json"]);
        let node: serde_json::Value = serde_json::from_slice(&node.stdout).unwrap();
        eprintln!("node: {node:#}");
        assert_eq!(node["observer"], "verbs", "{node}");
        let reason = node["observer_reason"].as_str().unwrap_or_default();
        assert!(reason.contains("rxe0"), "{reason}");
        let attach = agent.cli(&[
            "attach",
            "--instance",
            "vm-42",
            "--partition",
            "ibpart_rxe",
            "--name",
            "train-a",
            "--workspace",
            "ml-team",
            "--account",
            "acme",
            "--pkey",
            "0a12",
            "--wait",
            "60",
        ]);
        eprintln!("{}", String::from_utf8_lossy(&attach.stdout));
        assert!(
            attach.status.success(),
            "attach: {attach:?}\n{}",
            agent.log()
        );
        let listed = agent.cli(&["attachments", "--json"]);
        assert!(String::from_utf8_lossy(&listed.stdout).contains("ACTIVE"));
        let release = agent.cli(&["release", "--instance", "vm-42", "--wait", "60"]);
        eprintln!("{}", String::from_utf8_lossy(&release.stdout));
        assert!(
            release.status.success(),
            "release: {release:?}\n{}",
            agent.log()
        );
        let listed = agent.cli(&["attachments", "--json"]);
        let listed = String::from_utf8_lossy(&listed.stdout);
        assert!(listed.contains("RELEASED"), "{listed}");
        // rxe0's own table never changed: RoCE has no P_Key programming.
        assert_eq!(
            sh_ok("cat /sys/class/infiniband/rxe0/ports/1/pkeys/0").trim(),
            "0xffff"
        );
    });
}

#[test]
fn deb_on_minimal_debian_starts_reloads_and_stops_under_systemd() {
    scenario(
        "deb_on_minimal_debian_starts_reloads_and_stops_under_systemd",
        || {
            // The minimal host: no procps, so no /bin/kill.
            assert!(!exists("/bin/kill") && !exists("/usr/bin/kill"));
            let deb = sh_ok("ls deb/fabric-agent*.deb");
            // Offline: every dependency is in the image already.
            sh_ok(&format!(
                "cp /mnt/share/{} /tmp/ && DEBIAN_FRONTEND=noninteractive \
                 apt-get install -y /tmp/$(basename {})",
                deb.trim(),
                deb.trim()
            ));
            sh_ok(
                "printf 'fabric = \"lab-rxe\"\\n[subnet_manager]\\nbackend = \"embedded\"\\n\
                 [observer]\\nkind = \"verbs\"\\n' > /etc/fabric-agent/config.toml",
            );
            sh_ok("fabric-agent check-config --config /etc/fabric-agent/config.toml");
            sh_ok("systemd-analyze verify /lib/systemd/system/fabric-agent.service");
            let started = Instant::now();
            sh_ok("systemctl start fabric-agent");
            eprintln!(
                "systemctl start (Type=notify) returned after {} ms",
                started.elapsed().as_millis()
            );
            let show = |prop: &str| {
                sh_ok(&format!("systemctl show -P {prop} fabric-agent"))
                    .trim()
                    .to_owned()
            };
            assert_eq!(show("ActiveState"), "active");
            assert_eq!(show("Type"), "notify");
            assert_eq!(show("WatchdogUSec"), "30s");
            assert_eq!(show("ProtectSystem"), "strict");
            let pid = show("MainPID");
            assert_ne!(pid, "0");
            let node = sh_ok("fabric-agent node --json");
            assert!(
                node.contains("rxe0") && node.contains("\"verbs\""),
                "{node}"
            );
            let ports = sh_ok("fabric-agent ports --json");
            assert!(ports.contains("rxe0"), "{ports}");
            let doctor = sh("fabric-agent doctor");
            assert!(
                matches!(doctor.status.code(), Some(0 | 1)),
                "doctor must answer (0 healthy, 1 blocking): {doctor:?}"
            );
            assert!(String::from_utf8_lossy(&doctor.stdout).contains("rxe0"));

            let cursor = sh_ok("journalctl -u fabric-agent -n 0 --show-cursor --no-pager")
                .lines()
                .last()
                .and_then(|l| l.strip_prefix("-- cursor: "))
                .expect("journal cursor")
                .to_owned();
            sh_ok("systemctl reload fabric-agent");
            let reloaded = wait_until(Duration::from_secs(20), || {
                let j = sh(&format!(
                    "journalctl -u fabric-agent --after-cursor='{cursor}' --no-pager -o cat"
                ));
                String::from_utf8_lossy(&j.stdout).contains("SIGHUP: log filter")
            });
            assert!(
                reloaded,
                "no SIGHUP re-read in the journal after systemctl reload"
            );
            assert_eq!(show("ActiveState"), "active");
            assert_eq!(show("MainPID"), pid, "reload must not restart the daemon");
            assert_eq!(show("NRestarts"), "0");
            // The watchdog keeps being fed: still active well past a few checks.
            std::thread::sleep(Duration::from_secs(2));
            assert_eq!(show("ActiveState"), "active");

            sh_ok("systemctl stop fabric-agent");
            assert_eq!(show("ActiveState"), "inactive");
            assert_eq!(show("Result"), "success");
            let journal = sh_ok("journalctl -u fabric-agent --no-pager -o cat");
            assert!(!journal.contains("Failed with result"), "{journal}");
        },
    );
}
