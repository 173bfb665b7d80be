//! A credential file (`user:password`, as the UFM backend reads it) in its own temp dir.

use std::path::{Path, PathBuf};

/// A credential file, removed with its directory when dropped.
pub struct CredFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl CredFile {
    /// Writes `user:password` and a newline to a fresh file.
    pub fn new(user_password: &str) -> CredFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ufm.cred");
        std::fs::write(&path, format!("{user_password}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        CredFile { _dir: dir, path }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
