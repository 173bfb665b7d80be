//! The checks `serve` runs before it binds anything, and `check-config` runs alone: the file
//! validates, the paths the daemon will create or write are usable by this process, the socket
//! path fits a unix socket address, and every PEM file the daemon will load parses.

use super::verdict::{Check, Verdict};
use crate::config::{Backend, Config, SubnetManagerConfig, TlsConfig};
use crate::sys::access;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A unix socket address holds 108 bytes of path, NUL included.
const MAX_SOCKET_PATH: usize = 107;

/// What a configured file must hold, beyond being readable.
#[derive(Debug, Clone, Copy)]
enum Pem {
    /// Anything: it is read as is.
    None,
    /// PEM certificates.
    Certificates,
    /// A PEM private key (a secret: see [`super::secret_file`]).
    PrivateKey,
    /// A secret read as is (credentials, tokens; see [`super::secret_file`]).
    Secret,
}

/// The umad devices the configured components open, each with its setting's name.
fn umad_users(config: &Config) -> Vec<(&'static str, &Path)> {
    use crate::config::ObserverKind;
    let mut users: Vec<(&'static str, &Path)> = Vec::new();
    match config.observer.kind {
        Some(ObserverKind::Smp) => {
            users.push(("observer.umad_device", &config.observer.umad_device))
        }
        Some(ObserverKind::Embedded) => {}
        _ => {
            if let Some(d) = &config.observer.sa_umad_device {
                users.push(("observer.sa_umad_device", d));
            }
        }
    }
    if config.subnet_manager.backend == Backend::Opensm {
        if let Some(o) = &config.subnet_manager.opensm {
            if o.ownership.enabled {
                users.push((
                    "subnet_manager.opensm.ownership.umad_device",
                    &o.ownership.umad_device,
                ));
            }
        }
        if let Some(d) = config
            .subnet_manager
            .opensm_ha
            .as_ref()
            .and_then(|h| h.sminfo_umad_device.as_ref())
        {
            users.push(("subnet_manager.opensm_ha.sminfo_umad_device", d));
        }
    }
    users
}

/// Every check's verdict for one configuration.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Preflight {
    /// The checks, in order.
    pub checks: Vec<Check>,
}

impl Preflight {
    /// Runs every check against `config`.
    pub fn run(config: &Config) -> Preflight {
        let mut p = Preflight::default();
        p.directory("state_dir", &config.state_dir);
        p.store_file(&config.state_dir.join(crate::daemon::STORE_FILE));
        p.socket(&config.listen.unix_socket);
        if let Some(group) = &config.listen.read_group {
            match crate::sys::users::group_id(group) {
                Ok(gid) => p.pass("listen.read_group", format!("{group} is gid {gid}")),
                Err(e) => p.fail("listen.read_group", e.to_string()),
            }
        }
        if let Some(tls) = &config.listen.tls {
            p.listen_tls(tls);
        }
        p.subnet_manager(&config.subnet_manager);
        p.grants(config);
        p.umad_users(config, crate::sys::umad::umad2sim_in_process());
        p
    }

    /// The umad devices this agent opens, and by which settings. Under the umad2sim shim
    /// (`shim`: what gave it away) a device opened by two of them kills the process (see
    /// [`crate::sys::umad::umad2sim_in_process`]), so that is refused before anything starts;
    /// on a kernel each user's agents are apart and sharing a device is fine.
    fn umad_users(&mut self, config: &Config, shim: Option<String>) {
        let users = umad_users(config);
        let mut shared: Vec<(&Path, Vec<&str>)> = Vec::new();
        for (setting, device) in &users {
            match shared.iter_mut().find(|(d, _)| d == device) {
                Some((_, settings)) => settings.push(setting),
                None => shared.push((device, vec![setting])),
            }
        }
        shared.retain(|(_, settings)| settings.len() > 1);
        for (device, settings) in shared {
            let names = settings.join(", ");
            match &shim {
                Some(why) => self.fail(
                    "umad.shared_device",
                    format!(
                        "{} is opened by {names} in one process under the umad2sim shim ({why}): the shim \
                         routes each management class to one fd per device and crashes the process \
                         (SIGSEGV) once one of them closes; give each its own device, or leave all but one \
                         unset (e.g. observer.kind = \"sysfs\" beside sminfo_umad_device)",
                        device.display()
                    ),
                ),
                None => self.pass(
                    "umad.shared_device",
                    format!("{} is opened by {names} (separate umad agents)", device.display()),
                ),
            }
        }
    }

    /// `[grants]`: loaded (keys parsed at validation); not requiring them is a loud warning on
    /// the SM host and on a node.
    fn grants(&mut self, config: &Config) {
        let g = match config.grants.load() {
            Ok(g) => g,
            Err(e) => return self.fail("grants.keys", e.to_string()),
        };
        if g.require {
            self.pass(
                "grants",
                format!(
                    "required: fabric {}, {} key(s) {}",
                    g.fabric.as_str(),
                    g.keys.len(),
                    g.keys
                ),
            );
        } else {
            let what = if config.subnet_manager.backend == Backend::Opensm
                || config.subnet_manager.ufm_broker()
            {
                "this fabric side (SM host or UFM broker) accepts any key a node names (a rooted node joins every tenant's partition)"
            } else {
                "attaches without a grant are accepted"
            };
            self.warn(
                "grants",
                format!("not required ([grants] require = false): {what}"),
            );
        }
    }

    /// The listener's PEM files parse, and make the TLS material the listener will build.
    fn listen_tls(&mut self, tls: &TlsConfig) {
        let before = self.checks.len();
        self.files(&[
            ("listen.tls.cert", Some(&tls.cert), Pem::Certificates),
            ("listen.tls.key", Some(&tls.key), Pem::PrivateKey),
            (
                "listen.tls.client_ca",
                Some(&tls.client_ca),
                Pem::Certificates,
            ),
        ]);
        // Each file parses: now build the TLS material exactly as the listener will (the key
        // must belong to the certificate, the CA bundle must make a verifier).
        if self.checks[before..].iter().all(|c| c.ok) {
            match crate::api::TlsReloader::load(tls) {
                Ok((_, loaded)) => self.pass("listen.tls", loaded.to_string()),
                Err(e) => self.fail("listen.tls", e.to_string()),
            }
        }
    }

    /// The configured backend's files and directories.
    fn subnet_manager(&mut self, sm: &SubnetManagerConfig) {
        match sm.backend {
            Backend::Embedded => {}
            Backend::Opensm => {
                if let Some(o) = &sm.opensm {
                    match o.partitions_file.parent() {
                        Some(dir) => self.directory("subnet_manager.opensm.partitions_file", dir),
                        None => self.fail(
                            "subnet_manager.opensm.partitions_file",
                            "has no directory".into(),
                        ),
                    }
                    self.files(&[(
                        "subnet_manager.opensm.pid_file",
                        o.pid_file.as_ref(),
                        Pem::None,
                    )]);
                    // The log the agent reads must be the one OpenSM writes.
                    match crate::sm::opensm::log_check::verify(o) {
                        Ok(c) => self.pass("subnet_manager.opensm.log_file", c.summary()),
                        Err(e) => self.fail("subnet_manager.opensm.log_file", e.to_string()),
                    }
                }
                // The peers' client TLS files, read as the first pull will read them.
                if let Some(ha) = &sm.opensm_ha {
                    self.client_tls("subnet_manager.opensm_ha", &ha.ca, &ha.cert, &ha.key);
                    // OpenSM bound to this agent (systemd), so it never reads a stale file.
                    use super::doctor_sm_host::{binding, Binding, UnitSource};
                    match binding(&UnitSource::System) {
                        Binding::Bound(d) => self.pass("opensm unit", d),
                        Binding::Unbound(d) | Binding::Unknown(d) => self.warn("opensm unit", d),
                    }
                }
            }
            Backend::Remote => {
                if let Some(r) = &sm.remote {
                    self.client_tls("subnet_manager.remote", &r.ca, &r.cert, &r.key);
                }
            }
            Backend::Ufm => {
                if let Some(u) = &sm.ufm {
                    self.files(&[
                        (
                            "subnet_manager.ufm.ca_file",
                            u.ca_file.as_ref(),
                            Pem::Certificates,
                        ),
                        (
                            "subnet_manager.ufm.credentials_file",
                            u.credentials_file.as_ref(),
                            Pem::Secret,
                        ),
                        (
                            "subnet_manager.ufm.token_file",
                            u.token_file.as_ref(),
                            Pem::Secret,
                        ),
                        (
                            "subnet_manager.ufm.client_cert",
                            u.client_cert.as_ref(),
                            Pem::Certificates,
                        ),
                        (
                            "subnet_manager.ufm.client_key",
                            u.client_key.as_ref(),
                            Pem::PrivateKey,
                        ),
                    ]);
                }
            }
        }
    }

    /// A client's TLS files under `section`: `ca` and `cert` PEM certificates, `key` a private
    /// key (each only when configured).
    fn client_tls(
        &mut self,
        section: &str,
        ca: &Option<PathBuf>,
        cert: &Option<PathBuf>,
        key: &Option<PathBuf>,
    ) {
        let (c, t, k) = (
            format!("{section}.ca"),
            format!("{section}.cert"),
            format!("{section}.key"),
        );
        self.files(&[
            (&c, ca.as_ref(), Pem::Certificates),
            (&t, cert.as_ref(), Pem::Certificates),
            (&k, key.as_ref(), Pem::PrivateKey),
        ]);
    }

    /// Checks each configured file (`None`: not configured, nothing to check) as its kind.
    fn files(&mut self, files: &[(&str, Option<&PathBuf>, Pem)]) {
        for (check, file, pem) in files {
            let Some(file) = file else { continue };
            match pem {
                Pem::None => self.readable(check, file),
                Pem::Certificates => self.certificates(check, file),
                Pem::PrivateKey => {
                    if self.secret(check, file) {
                        self.private_key(check, file)
                    }
                }
                Pem::Secret => {
                    if self.secret(check, file) {
                        self.readable(check, file)
                    }
                }
            }
        }
    }

    /// Whether every check passed.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.ok)
    }

    fn pass(&mut self, check: &str, detail: String) {
        self.checks.push(Check::new(Verdict::Ok, check, detail));
    }

    fn warn(&mut self, check: &str, detail: String) {
        self.checks.push(Check::new(Verdict::Warn, check, detail));
    }

    fn fail(&mut self, check: &str, detail: String) {
        self.checks.push(Check::new(Verdict::Fail, check, detail));
    }

    /// A directory the daemon writes in: writable now, or creatable (its nearest existing
    /// ancestor is writable).
    fn directory(&mut self, check: &str, dir: &Path) {
        let existing = dir.ancestors().find(|a| a.exists());
        match existing {
            Some(a) if a == dir => match access::writable_dir(dir) {
                Ok(()) => self.pass(check, format!("{} is writable", dir.display())),
                Err(e) => self.fail(check, format!("{}: not writable: {e}", dir.display())),
            },
            Some(a) => match access::writable_dir(a) {
                Ok(()) => self.pass(
                    check,
                    format!("{} will be created in {}", dir.display(), a.display()),
                ),
                Err(e) => self.fail(
                    check,
                    format!(
                        "{} does not exist and cannot be created in {}: {e}",
                        dir.display(),
                        a.display()
                    ),
                ),
            },
            None => self.fail(check, format!("{}: no existing ancestor", dir.display())),
        }
    }

    /// The store file, when it exists: a regular file this process may read and write (the
    /// daemon opens it read-write; anything else fails `serve` after the directory passed).
    fn store_file(&mut self, file: &Path) {
        const CHECK: &str = "state_dir";
        match std::fs::symlink_metadata(file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => self.fail(CHECK, format!("{}: {e}", file.display())),
            Ok(m) if !m.file_type().is_file() => self.fail(
                CHECK,
                format!(
                    "{}: not a regular file (the store cannot open it)",
                    file.display()
                ),
            ),
            Ok(_) => match access::read_writable(file) {
                Ok(()) => self.pass(
                    CHECK,
                    format!("{} is readable and writable", file.display()),
                ),
                Err(e) => self.fail(
                    CHECK,
                    format!(
                        "{}: the store cannot open it read-write: {e}",
                        file.display()
                    ),
                ),
            },
        }
    }

    fn socket(&mut self, path: &Path) {
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            self.fail(
                "listen.unix_socket",
                format!(
                    "{} is {len} bytes; a unix socket path holds at most {MAX_SOCKET_PATH}",
                    path.display()
                ),
            );
            return;
        }
        match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => self.directory("listen.unix_socket", dir),
            _ => self.fail(
                "listen.unix_socket",
                format!("{}: give an absolute path", path.display()),
            ),
        }
    }

    fn readable(&mut self, check: &str, file: &Path) {
        match access::readable(file) {
            Ok(()) => self.pass(check, format!("{} is readable", file.display())),
            Err(e) => self.fail(check, format!("{}: {e}", file.display())),
        }
    }

    fn certificates(&mut self, check: &str, file: &Path) {
        let certs: Result<Vec<CertificateDer<'static>>, _> =
            CertificateDer::pem_file_iter(file).and_then(|it| it.collect());
        match certs {
            Ok(c) if !c.is_empty() => self.pass(
                check,
                format!("{}: {} certificate(s)", file.display(), c.len()),
            ),
            Ok(_) => self.fail(
                check,
                format!("{}: no PEM certificate in the file", file.display()),
            ),
            Err(e) => self.fail(check, format!("{}: {e}", file.display())),
        }
    }

    /// A secret file's mode and link (fails and returns false when refused).
    fn secret(&mut self, check: &str, file: &Path) -> bool {
        match super::secret_file::check(file) {
            Ok(()) => true,
            // A file that cannot be read is the readability check's to report.
            Err(super::secret_file::SecretFileError::Unreadable { .. }) => true,
            Err(e) => {
                self.fail(check, e.to_string());
                false
            }
        }
    }

    fn private_key(&mut self, check: &str, file: &Path) {
        match PrivateKeyDer::from_pem_file(file) {
            Ok(_) => self.pass(check, format!("{}: a private key", file.display())),
            Err(e) => self.fail(check, format!("{}: {e}", file.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("test.toml")).unwrap()
    }

    #[test]
    fn a_long_socket_path_and_missing_tls_files_fail() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("/tmp/{}/agent.sock", "x".repeat(120));
        let c = config(&format!(
            "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{long}\"\ntcp = \"127.0.0.1:7443\"\n\
             [listen.tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\n\
             client_ca = \"/nonexistent/ca.pem\"\nallowed_clients = [\"dns:cp\"]\n",
            dir.path().join("state").display()
        ));
        let p = Preflight::run(&c);
        let failed: Vec<&str> = p.failures().map(|c| c.check.as_str()).collect();
        assert_eq!(
            failed,
            [
                "listen.unix_socket",
                "listen.tls.cert",
                "listen.tls.key",
                "listen.tls.client_ca"
            ],
            "{p:?}"
        );
        assert!(p.checks[0].ok, "state_dir is creatable: {p:?}");
    }

    #[test]
    fn a_key_that_does_not_belong_to_the_certificate_fails_as_serve_would() {
        let dir = tempfile::tempdir().unwrap();
        let pem = |name: &str, text: String| {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            // Secrets are 0600 (see `secret_file`); certificates may be world-readable.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            path
        };
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(vec!["ca.example".into()])
            .unwrap()
            .self_signed(&ca_key)
            .unwrap();
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["node1.example".into()])
            .unwrap()
            .self_signed(&server_key)
            .unwrap();
        let text = |key: &rcgen::KeyPair| {
            format!(
                "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\ntcp = \"127.0.0.1:7443\"\n\
                 [listen.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\nallowed_clients = [\"dns:cp\"]\n",
                dir.path().join("state").display(),
                dir.path().join("agent.sock").display(),
                pem("server.pem", server.pem()).display(),
                pem("key.pem", key.serialize_pem()).display(),
                pem("ca.pem", ca.pem()).display(),
            )
        };
        let good = Preflight::run(&config(&text(&server_key)));
        assert!(good.ok(), "{good:?}");
        assert!(
            good.checks.iter().any(|c| c.check == "listen.tls"),
            "{good:?}"
        );
        // Every file parses, but the key is the CA's: the listener could not be built.
        let bad = Preflight::run(&config(&text(&ca_key)));
        let failed: Vec<&str> = bad.failures().map(|c| c.check.as_str()).collect();
        assert_eq!(failed, ["listen.tls"], "{bad:?}");
    }

    #[test]
    fn the_peers_tls_files_are_read_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let text = |key: &str| {
            format!(
                "fabric = \"f\"\nstate_dir = \"{d}/state\"\n[listen]\nunix_socket = \"{d}/a.sock\"\n\
                 [subnet_manager]\nbackend = \"opensm\"\n\
                 [subnet_manager.opensm]\npartitions_file = \"{d}/partitions.conf\"\nlog_file = \"{d}/opensm.log\"\npid = 4194000\n\
                 [subnet_manager.opensm_ha]\npeers = [\"https://smhost2:7443\"]\npeer_identities = [\"dns:smhost2\"]\n\
                 ca = \"{}\"\ncert = \"{d}/missing.crt\"\nkey = \"{key}\"\n",
                ca.display(),
                d = dir.path().display()
            )
        };
        let missing_key = dir.path().join("missing.key");
        let p = Preflight::run(&config(&text(&missing_key.display().to_string())));
        let peers: Vec<&Check> = p
            .checks
            .iter()
            .filter(|c| c.check.starts_with("subnet_manager.opensm_ha"))
            .collect();
        let names: Vec<(&str, bool)> = peers.iter().map(|c| (c.check.as_str(), c.ok)).collect();
        assert_eq!(
            names,
            [
                ("subnet_manager.opensm_ha.ca", false),
                ("subnet_manager.opensm_ha.cert", false),
                ("subnet_manager.opensm_ha.key", false)
            ],
            "{p:?}"
        );
        assert!(peers[0].detail.contains(&ca.display().to_string()), "{p:?}");
        assert!(peers[1].detail.contains("missing.crt"), "{p:?}");
        assert!(peers[2].detail.contains("missing.key"), "{p:?}");
    }

    #[test]
    fn one_umad_device_for_two_users_is_refused_under_the_shim_only() {
        let text = |observer: &str, ownership: &str| {
            format!(
                "fabric = \"f\"\nstate_dir = \"/tmp/s\"\n[listen]\nunix_socket = \"/tmp/a.sock\"\n\
                 [subnet_manager]\nbackend = \"opensm\"\n\
                 [subnet_manager.opensm]\npartitions_file = \"/tmp/p.conf\"\nlog_file = \"/tmp/o.log\"\npid = 4194000\n\
                 [subnet_manager.opensm.ownership]\nenabled = {ownership}\n\
                 [subnet_manager.opensm_ha]\npeers = [\"https://smhost2:7443\"]\npeer_identities = [\"dns:smhost2\"]\n\
                 ca = \"/tmp/ca.pem\"\ncert = \"/tmp/a.crt\"\nkey = \"/tmp/a.key\"\nsminfo_umad_device = \"/dev/infiniband/umad0\"\n[observer]\nkind = \"{observer}\"\n"
            )
        };
        let check = |observer: &str, ownership: &str, shim: Option<&str>| {
            let mut p = Preflight::default();
            p.umad_users(&config(&text(observer, ownership)), shim.map(str::to_owned));
            p.checks
        };
        // The SMP observer and SMInfo on umad0 under the shim: refused, both settings named.
        let refused = check("smp", "false", Some("LD_PRELOAD names libumad2sim.so"));
        assert_eq!(refused.len(), 1);
        assert!(!refused[0].ok);
        assert!(
            refused[0]
                .detail
                .contains("observer.umad_device, subnet_manager.opensm_ha.sminfo_umad_device")
                && refused[0].detail.contains("SIGSEGV"),
            "{refused:?}"
        );
        // The ownership check is a third user of the same device.
        let three = check("smp", "true", Some("x"));
        assert!(
            three[0].detail.contains("ownership.umad_device"),
            "{three:?}"
        );
        // On a kernel: passes, named.
        let kernel = check("smp", "false", None);
        assert!(kernel.len() == 1 && kernel[0].ok, "{kernel:?}");
        // One user only (sysfs observer beside SMInfo): nothing to say.
        assert!(check("sysfs", "false", Some("x")).is_empty());
    }

    #[test]
    fn a_good_config_passes() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(&format!(
            "fabric = \"f\"\nstate_dir = \"{}\"\n[listen]\nunix_socket = \"{}\"\n",
            dir.path().join("state").display(),
            dir.path().join("run/agent.sock").display()
        ));
        let p = Preflight::run(&c);
        assert!(p.ok(), "{p:?}");
    }
}
