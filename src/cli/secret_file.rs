//! Secret files the daemon reads (TLS private keys, UFM credentials and tokens, the grant
//! signing key of `grant sign`) must not be readable beyond `0640` (the owner, and the agent's
//! group read-only) and must not be a symbolic link to a file outside its own directory (a
//! link inside it, such as a Kubernetes secret volume's `..data/` links, is followed).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The mode bits a secret file may have beyond the owner's: group read.
const ALLOWED_BEYOND_OWNER: u32 = 0o040;

/// Why a secret file is refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file (or its link's target) cannot be examined.
    #[error("{}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Group or others may do more than the group reading it.
    #[error("{} has mode {mode:04o}: a secret may be readable by the owner and its group only (at most 0640); chmod 0600 or 0640", path.display())]
    TooOpen {
        /// The file (the link's target when it is a link).
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A symbolic link out of the file's directory.
    #[error("{} is a symbolic link to {} outside its directory; name the file itself", path.display(), target.display())]
    LinkElsewhere {
        /// The configured path.
        path: PathBuf,
        /// Where it leads.
        target: PathBuf,
    },
}

/// Checks one secret file (see the module docs).
pub fn check(path: &Path) -> Result<(), SecretFileError> {
    let unreadable = |source| SecretFileError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::symlink_metadata(path).map_err(unreadable)?;
    let target = if meta.file_type().is_symlink() {
        let target = std::fs::canonicalize(path).map_err(unreadable)?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(dir).map_err(unreadable)?;
        if !target.starts_with(&dir) {
            return Err(SecretFileError::LinkElsewhere {
                path: path.to_owned(),
                target,
            });
        }
        target
    } else {
        path.to_owned()
    };
    let mode = std::fs::metadata(&target)
        .map_err(unreadable)?
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o077 & !ALLOWED_BEYOND_OWNER != 0 {
        return Err(SecretFileError::TooOpen { path: target, mode });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, "secret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn modes_up_to_0640_pass_and_wider_ones_fail_naming_path_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o640, 0o400, 0o440] {
            check(&file(dir.path(), "ok", mode)).unwrap();
        }
        for mode in [0o644, 0o660, 0o604, 0o641, 0o650, 0o666] {
            let p = file(dir.path(), "open", mode);
            let e = check(&p).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(&p.display().to_string()), "{text}");
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
        }
    }

    #[test]
    fn a_link_out_of_the_directory_fails_and_one_inside_is_followed() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = file(outside.path(), "k", 0o600);
        let link = dir.path().join("key");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        assert!(matches!(
            check(&link),
            Err(SecretFileError::LinkElsewhere { .. })
        ));
        // A Kubernetes-style secret volume: key -> ..data/key, inside the directory.
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        let inner = file(&dir.path().join("..data"), "k2", 0o640);
        let link2 = dir.path().join("key2");
        std::os::unix::fs::symlink(&inner, &link2).unwrap();
        check(&link2).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            check(&link2),
            Err(SecretFileError::TooOpen { mode: 0o644, .. })
        ));
    }

    #[test]
    fn a_missing_file_is_unreadable() {
        assert!(matches!(
            check(Path::new("/nonexistent/secret")),
            Err(SecretFileError::Unreadable { .. })
        ));
    }
}
