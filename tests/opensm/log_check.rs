//! The SM-host agent refuses to start (exit 64, with the reason) when the log it would read is
//! not the one the running OpenSM writes: found through OpenSM's open files, and through its
//! own `opensm.conf`. On an ibsim fabric with a real OpenSM; skipped when ibsim/OpenSM are
//! missing.

use testkit::common;
use testkit::rig;

use common::process::{wait_timeout, BIN};
use rig::agents::sm_config;
use rig::{Fabric, FabricSpec, LIMITED_DEFAULT_PARTITIONS};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `fabric-agent --config <config> <args>` and returns its exit code and stderr + stdout.
fn run(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let dir = config.parent().unwrap();
    let out = dir.join("run.out");
    let file = std::fs::File::create(&out).unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let status = match wait_timeout(&mut child, Duration::from_secs(20)) {
        Some(s) => s,
        None => {
            // Stopped by its own pid: it did not refuse in time.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "fabric-agent {args:?} did not exit: {}",
                std::fs::read_to_string(&out).unwrap_or_default()
            );
        }
    };
    (status.code(), std::fs::read_to_string(&out).unwrap())
}

#[test]
fn the_agent_refuses_to_start_when_opensm_logs_to_another_file() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 1), LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    let d = fabric.dir();
    let other = d.join("other.log");
    std::fs::write(&other, "").unwrap();
    let real = fabric.opensm_log_path();
    let good = sm_config(&fabric, common::free_port());
    let config = d.join("smhost.toml");

    // The right log: every start check passes, OpenSM's open log verified.
    std::fs::write(&config, &good).unwrap();
    let (code, out) = run(&config, &["--json", "check-config"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("has ") && out.contains("opensm.log open"),
        "{out}"
    );

    // OpenSM logs to opensm.log, the agent would read other.log: found through OpenSM's fds.
    let wrong = good.replace(
        &format!("log_file = \"{}\"", real.display()),
        &format!("log_file = \"{}\"", other.display()),
    );
    assert_ne!(wrong, good);
    std::fs::write(&config, &wrong).unwrap();
    for _ in 0..2 {
        let (code, out) = run(&config, &["serve"]);
        assert_eq!(code, Some(64), "{out}");
        assert!(
            out.contains(&format!(
                "OpenSM (pid {}) does not have {} open",
                fabric.opensm_pid(),
                other.display()
            )),
            "{out}"
        );
        // The reason names the log OpenSM really writes.
        assert!(out.contains(&real.display().to_string()), "{out}");
    }

    // The same, found in OpenSM's own configuration before its open files are looked at.
    let conf = d.join("opensm.conf");
    let with_conf = wrong.replace(
        "[subnet_manager.opensm]\n",
        &format!(
            "[subnet_manager.opensm]\nopensm_conf = \"{}\"\n",
            conf.display()
        ),
    );
    std::fs::write(&config, &with_conf).unwrap();
    let (code, out) = run(&config, &["serve"]);
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains(&format!(
            "{} sets log_file {}, but the agent's log_file is {}",
            conf.display(),
            real.display(),
            other.display()
        )),
        "{out}"
    );
    assert!(
        !d.join("smstate").exists(),
        "a refused start opened the store"
    );
}

/// `doctor` on an SM host reports OpenSM's M_Key settings: the rig's OpenSM runs with
/// OpenSM's defaults (m_key 0, protection level 0), two WARNs naming the settings; with a key
/// and protection level 2 in its opensm.conf, an OK line.
#[test]
fn doctor_warns_when_opensm_leaves_p_key_tables_unprotected() {
    let Some(fabric) = Fabric::start(&FabricSpec::new(1, 1), LIMITED_DEFAULT_PARTITIONS) else {
        return;
    };
    let d = fabric.dir();
    let conf = d.join("opensm.conf");
    let config = d.join("smhost.toml");
    std::fs::write(
        &config,
        sm_config(&fabric, common::free_port()).replace(
            "[subnet_manager.opensm]\n",
            &format!(
                "[subnet_manager.opensm]\nopensm_conf = \"{}\"\n",
                conf.display()
            ),
        ),
    )
    .unwrap();
    let m_key_lines = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains("opensm m_key"))
            .map(str::to_owned)
            .collect()
    };
    let (_, out) = run(&config, &["doctor"]);
    let lines = m_key_lines(&out);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WARN") && l.contains("m_key is 0")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WARN") && l.contains("m_key_protection_level is 0")),
        "{out}"
    );

    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str("m_key 0x5eed00000000c0de\nm_key_protection_level 2\nm_key_lease_period 60\n");
    std::fs::write(&conf, text).unwrap();
    let (_, out) = run(&config, &["doctor"]);
    let lines = m_key_lines(&out);
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.starts_with("OK")),
        "{out}"
    );
    assert!(
        lines.iter().any(|l| l.contains("m_key_protection_level 2")),
        "{out}"
    );
}
