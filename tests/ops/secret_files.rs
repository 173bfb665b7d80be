//! Start-up checks of secret files and of grants: `serve` refuses to start (exit 64, the path
//! and the mode in the message) when a TLS private key or a UFM credential file is readable
//! beyond 0640 or is a symbolic link out of its directory; `grant sign` refuses such a signing
//! key; a UFM broker, and a node talking to UFM directly, that run without grants required say
//! so in a WARN line at start.

use testkit::common;

use common::pki::Pki;
use common::process::{wait_timeout, DaemonProcess};
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `serve` on `config`; its exit code and stderr (it must exit by itself).
fn serve_exit(config: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(20));
    if status.is_none() {
        child.kill().unwrap();
        child.wait().unwrap();
        panic!("serve did not exit");
    }
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.unwrap().code(), err)
}

/// A TLS listener config; the key at `key`.
fn tls_config(dir: &Path, key: &Path) -> PathBuf {
    let pki = Pki::new("t CA");
    pki.write_ca(&dir.join("ca.pem"));
    let (crt, k) = pki.issue(dir, "server", &["localhost"], "server");
    if k != key {
        std::fs::rename(&k, key).unwrap();
    }
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "fabric = \"fab1\"\nnode_id = \"n1\"\nstate_dir = \"{d}/state\"\n\
             [listen]\nunix_socket = \"{d}/agent.sock\"\ntcp = \"127.0.0.1:{port}\"\n\
             [listen.tls]\ncert = \"{crt}\"\nkey = \"{key}\"\nclient_ca = \"{d}/ca.pem\"\n\
             allowed_clients = [\"dns:cp\"]\n",
            d = dir.display(),
            port = free_port(),
            crt = crt.display(),
            key = key.display(),
        ),
    )
    .unwrap();
    config
}

#[test]
fn a_tls_key_readable_beyond_0640_or_linked_elsewhere_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let config = tls_config(dir.path(), &key);
    for mode in [0o644, 0o660] {
        chmod(&key, mode);
        let (code, err) = serve_exit(&config);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains(&key.display().to_string()), "{err}");
        assert!(err.contains(&format!("{mode:04o}")), "{err}");
    }
    // A link to a 0600 key in another directory.
    chmod(&key, 0o600);
    let other = tempfile::tempdir().unwrap();
    let moved = other.path().join("server.key");
    std::fs::rename(&key, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &key).unwrap();
    let (code, err) = serve_exit(&config);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(err.contains(&key.display().to_string()), "{err}");
}

/// A `ufm` backend config with `extra` appended; the credential file is `cred`.
fn ufm_config(dir: &Path, cred: &Path, extra: &str) -> PathBuf {
    let root = dir.join("sys");
    mlx5_8x_active(&root);
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "fabric = \"fab1\"\nnode_id = \"n1\"\nstate_dir = \"{d}/state\"\n\
             [listen]\nunix_socket = \"{d}/agent.sock\"\n{extra}\
             [subnet_manager]\nbackend = \"ufm\"\n\
             [subnet_manager.ufm]\nurl = \"http://127.0.0.1:9\"\ncredentials_file = \"{cred}\"\n\
             connect_timeout_ms = 100\nrequest_timeout_ms = 200\nretries = 0\n\
             {obs}",
            d = dir.display(),
            cred = cred.display(),
            obs = mlx5_8x_config(&root, "slow_poll_ms = 200\n"),
        ),
    )
    .unwrap();
    config
}

#[test]
fn a_ufm_credential_file_readable_beyond_0640_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let cred = dir.path().join("ufm.cred");
    std::fs::write(&cred, "admin:pw\n").unwrap();
    chmod(&cred, 0o604);
    let config = ufm_config(dir.path(), &cred, "");
    let (code, err) = serve_exit(&config);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains(&cred.display().to_string()), "{err}");
    assert!(err.contains("0604"), "{err}");
}

#[test]
fn grant_sign_refuses_a_signing_key_readable_beyond_0640() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["grant", "keygen", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = dir.path().join("grant-signing.key");
    let sign = || {
        Command::new(BIN)
            .args(["grant", "sign", "--key"])
            .arg(&key)
            .args([
                "--key-id",
                "k1",
                "--fabric",
                "fab1",
                "--node",
                "n1",
                "--instance",
                "i1",
                "--partition",
                "ibpart_0a12",
                "--pkey",
                "0x0a12",
            ])
            .output()
            .unwrap()
    };
    let ok = sign();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    chmod(&key, 0o644);
    let refused = sign();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains("0644") && err.contains(&key.display().to_string()),
        "{err}"
    );
}

/// Starts `config` (its socket at `<dir>/agent.sock`) and returns its log once it answers.
fn start_log(dir: &Path, config: &Path) -> String {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("NOTIFY_SOCKET").env_remove("WATCHDOG_USEC");
    let d = DaemonProcess::start(
        cmd,
        "daemon",
        config,
        &dir.join("agent.sock"),
        &dir.join("daemon.log"),
    );
    let log = d.log_text();
    d.stop();
    log
}

#[test]
fn a_broker_or_a_direct_ufm_node_without_grants_warns_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cred = dir.path().join("ufm.cred");
    std::fs::write(&cred, "admin:pw\n").unwrap();
    chmod(&cred, 0o600);
    let direct = ufm_config(dir.path(), &cred, "");
    let log = start_log(dir.path(), &direct);
    assert!(
        log.contains("WARN") && log.contains("DIRECT UFM ACCESS"),
        "{log}"
    );
    assert!(!log.contains("GRANTS NOT REQUIRED"), "{log}");

    let dir = tempfile::tempdir().unwrap();
    let cred = dir.path().join("ufm.cred");
    std::fs::write(&cred, "admin:pw\n").unwrap();
    chmod(&cred, 0o600);
    let broker = ufm_config(
        dir.path(),
        &cred,
        &format!(
            "tcp = \"127.0.0.1:{}\"\ninsecure_plaintext_for_tests = true\n\
             [subnet_manager.ufm_broker]\nenabled = true\n",
            free_port()
        ),
    );
    let log = start_log(dir.path(), &broker);
    assert!(
        log.contains("WARN") && log.contains("GRANTS NOT REQUIRED"),
        "{log}"
    );
    assert!(log.contains("UFM broker"), "{log}");
    assert!(!log.contains("DIRECT UFM ACCESS"), "{log}");
}
