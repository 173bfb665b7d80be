//! `fabric-agent doctor` on fixture hosts (a healthy one, and one whose ports are full members
//! of the default partition) with a running daemon, and on the ibsim fabric through SMPs.

use testkit::common;
use testkit::rig;

use common::*;
use std::path::Path;
use std::process::Output;

/// A copy of the 8x ConnectX fixture with every port ACTIVE and slot 0 set to `default`.
fn host(root: &Path, default: u16) {
    mlx5_8x_active(root);
    for dev in MLX5_8X_IB {
        set_pkey(root, dev, 0, default);
    }
}

fn doctor(config: &Path, json: bool) -> Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("--config").arg(config).arg("doctor");
    if json {
        cmd.arg("--json");
    }
    cmd.output().unwrap()
}

fn verdicts(o: &Output) -> Vec<(String, String, String)> {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor --json");
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["verdict"].as_str().unwrap().to_owned(),
                c["check"].as_str().unwrap().to_owned(),
                c["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn daemon_on(tmp: &Path, default: u16) -> Daemon {
    let root = tmp.join("sys");
    host(&root, default);
    let mut d = Daemon::prepare(tmp, &mlx5_8x_config(&root, ""));
    d.spawn(&[]);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_host_passes_and_a_full_default_member_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = daemon_on(tmp.path(), 0x7fff);
    // Let the start-up apply be acknowledged.
    let mut c = d.client().await;
    for _ in 0..50 {
        let n = c
            .get_node(fabric_agent::proto::agent::GetNodeRequest {})
            .await
            .unwrap()
            .into_inner();
        if n.subnet_manager.unwrap().reachable {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let o = doctor(&d.config, true);
    let v = verdicts(&o);
    assert_eq!(o.status.code(), Some(0), "{v:#?}");
    assert!(v.iter().all(|(verdict, _, _)| verdict != "FAIL"), "{v:#?}");
    let default_lines: Vec<_> = v
        .iter()
        .filter(|(_, c, _)| c.ends_with("default partition"))
        .collect();
    assert_eq!(default_lines.len(), 8, "{v:#?}");
    assert!(default_lines
        .iter()
        .all(|(verdict, _, d)| verdict == "OK" && d.contains("0x7fff")));
    assert!(v.iter().any(|(verdict, c, d)| verdict == "OK"
        && c == "port mlx5_bond_0/1"
        && d.contains("not a fabric port")));
    let text = doctor(&d.config, false);
    assert!(String::from_utf8_lossy(&text.stdout).contains("verdict: nothing blocks"));
    d.stop();

    let tmp = tempfile::tempdir().unwrap();
    let mut d = daemon_on(tmp.path(), 0xffff);
    let o = doctor(&d.config, true);
    let v = verdicts(&o);
    assert_eq!(o.status.code(), Some(1), "{v:#?}");
    let failing: Vec<_> = v
        .iter()
        .filter(|(verdict, c, _)| verdict == "FAIL" && c.ends_with("default partition"))
        .collect();
    assert_eq!(failing.len(), 8, "{v:#?}");
    assert!(failing[0].2.contains("0xffff"));
    d.stop();
    // With the daemon gone, doctor says so and fails.
    let o = doctor(&d.config, true);
    assert_eq!(o.status.code(), Some(1));
    assert!(verdicts(&o)
        .iter()
        .any(|(verdict, c, _)| verdict == "FAIL" && c == "daemon"));
}

#[test]
fn doctor_reads_the_ibsim_fabric_through_smps() {
    for (partitions, verdict, says) in [
        (
            "Default=0x7fff : ALL=limited, SELF=full ;\n",
            "OK",
            "0x7fff",
        ),
        ("Default=0x7fff : ALL=full ;\n", "FAIL", "0xffff"),
    ] {
        let Some(fabric) = rig::Fabric::start(&rig::FabricSpec::new(1, 2), partitions) else {
            return;
        };
        let config = fabric.dir().join("doctor.toml");
        std::fs::write(
            &config,
            format!(
                "node_id = \"node1\"\nfabric = \"fab1\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n\
                 [subnet_manager]\nbackend = \"remote\"\n[subnet_manager.remote]\nendpoint = \"http://127.0.0.1:1\"\n\
                 [observer]\nkind = \"smp\"\n",
                fabric.dir().join("node1-state").display(),
                fabric.dir().join("node1.sock").display()
            ),
        )
        .unwrap();
        let o = fabric
            .client_command("node1", BIN)
            .arg("--config")
            .arg(&config)
            .args(["doctor", "--json"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let v = verdicts(&o);
        assert!(
            v.iter()
                .any(|(vd, c, d)| vd == "OK" && c == "observer" && d.starts_with("smp")),
            "{v:#?}"
        );
        let port: Vec<_> = v
            .iter()
            .filter(|(_, c, _)| c.ends_with("default partition"))
            .collect();
        assert_eq!(port.len(), 1, "one HCA port: {v:#?}");
        assert_eq!(port[0].0, verdict, "{partitions}: {v:#?}");
        assert!(port[0].2.contains(says), "{v:#?}");
        // No daemon runs here: doctor fails on that, whatever the ports say.
        assert_eq!(o.status.code(), Some(1));
    }
}
