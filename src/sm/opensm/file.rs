//! Atomic replacement of the partitions file. OpenSM re-reads it on sweeps the agent did not
//! trigger, so it must never see a half-written file: write a temp file in the same directory,
//! fsync it, rename it over the file, fsync the directory. The temp file is created exclusively
//! and never through a symlink (`O_CREAT|O_EXCL|O_NOFOLLOW`), and gets the old file's owner and
//! mode before it replaces it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn temp_path(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(".fabric-agent.tmp");
    Ok(path.with_file_name(tmp))
}

/// Reads the file; a missing file reads as empty.
pub fn read_or_empty(path: &Path) -> io::Result<Vec<u8>> {
    match fs::read(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}

/// Replaces `path` with `bytes` atomically, keeping the old file's permission bits and owner.
/// A leftover temp file (a crash mid-write) is removed first; the new one is created exclusively
/// and never through a symlink. If the old owner cannot be kept (the service may not chown),
/// nothing is replaced and the error says so.
pub fn replace_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = temp_path(path)?;
    let (mode, owner) = match fs::metadata(path) {
        Ok(m) => (m.permissions().mode() & 0o7777, Some((m.uid(), m.gid()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (0o644, None),
        Err(e) => return Err(e),
    };
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut created = false;
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(crate::sys::fs_flags::O_NOFOLLOW)
            .mode(mode)
            .open(&tmp)?;
        created = true;
        if let Some((uid, gid)) = owner {
            let m = f.metadata()?;
            if (m.uid(), m.gid()) != (uid, gid) {
                std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "cannot give the new file the owner of {} ({uid}:{gid}): {e}; own \
                             the file by the service's user or let the service chown",
                            path.display()
                        ),
                    )
                })?;
            }
        }
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() && created {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Where the copy of the last file OpenSM accepted lives: beside the file, hidden.
pub fn accepted_copy_path(partitions_file: &Path) -> PathBuf {
    let name = partitions_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "partitions.conf".into());
    partitions_file.with_file_name(format!(".{name}.fabric-agent-accepted"))
}

/// Where an operator's edit that OpenSM rejected is kept when the accepted file is restored.
pub fn rejected_copy_path(partitions_file: &Path) -> PathBuf {
    let name = partitions_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "partitions.conf".into());
    partitions_file.with_file_name(format!("{name}.rejected"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("partitions.conf");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        replace_atomically(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1);
        assert_eq!(read_or_empty(&dir.path().join("absent")).unwrap(), b"");
    }

    #[test]
    fn keeps_the_owner_and_never_writes_through_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("partitions.conf");
        fs::write(&p, b"old").unwrap();
        // Someone planted the temp name as a symlink to a file they want overwritten.
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, temp_path(&p).unwrap()).unwrap();
        if nix_is_root() {
            std::os::unix::fs::chown(&p, Some(4242), Some(4343)).unwrap();
        }
        replace_atomically(&p, b"new").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert!(!fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        if nix_is_root() {
            let m = fs::metadata(&p).unwrap();
            assert_eq!((m.uid(), m.gid()), (4242, 4343));
        }
    }

    fn nix_is_root() -> bool {
        fs::metadata("/proc/self").unwrap().uid() == 0
    }
}
