//! A throw-away certificate authority for TLS tests: a self-signed CA and the leaf certificates
//! it signs, as PEM text or written to files in a test's temp dir.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};

/// A certificate authority.
pub struct Pki {
    /// The CA's certificate and key.
    pub ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA whose certificate has the common name `name`.
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Pki {
            ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// Writes the CA certificate (PEM) to `path`.
    pub fn write_ca(&self, path: &Path) {
        std::fs::write(path, self.ca.pem()).unwrap();
    }

    /// A leaf certificate with these SANs, the common name `cn` (rcgen's default name when
    /// `None`) and `edit` applied last, signed by the CA: (certificate PEM, key PEM).
    pub fn leaf(
        &self,
        sans: &[&str],
        cn: Option<&str>,
        edit: impl FnOnce(&mut CertificateParams),
    ) -> (String, String) {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        edit(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// [`Pki::leaf`] written to `<dir>/<file>.crt` and `<dir>/<file>.key`; returns both paths.
    pub fn issue_with(
        &self,
        dir: &Path,
        file: &str,
        sans: &[&str],
        cn: Option<&str>,
        edit: impl FnOnce(&mut CertificateParams),
    ) -> (PathBuf, PathBuf) {
        let (cert, key) = self.leaf(sans, cn, edit);
        (
            write(dir, &format!("{file}.crt"), &cert),
            write(dir, &format!("{file}.key"), &key),
        )
    }

    /// A leaf with these SANs and common name `cn`, written as by [`Pki::issue_with`].
    pub fn issue(&self, dir: &Path, file: &str, sans: &[&str], cn: &str) -> (PathBuf, PathBuf) {
        self.issue_with(dir, file, sans, Some(cn), |_| {})
    }
}

/// A self-signed leaf certificate for `san` that no test CA signed: (certificate PEM, key PEM).
pub fn self_signed(san: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![san.to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Writes `text` to `<dir>/<name>` and returns the path.
/// A private key (`*.key`) is made 0600, as the daemon requires of secrets.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    if name.ends_with(".key") {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    p
}
