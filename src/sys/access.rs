//! Whether this process may use a path, asked of the kernel (access(2)) without touching it.

use nix::unistd::{access, AccessFlags};
use std::io;
use std::path::Path;

/// Ok when `dir` is a directory this process may create files in (write and search).
pub fn writable_dir(dir: &Path) -> io::Result<()> {
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        ));
    }
    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(io::Error::from)
}

/// Ok when `file` exists and this process may read it.
pub fn readable(file: &Path) -> io::Result<()> {
    access(file, AccessFlags::R_OK).map_err(io::Error::from)
}

/// Ok when `file` exists and this process may read and write it.
pub fn read_writable(file: &Path) -> io::Result<()> {
    access(file, AccessFlags::R_OK | AccessFlags::W_OK).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_dir_is_writable_and_a_missing_file_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        writable_dir(dir.path()).unwrap();
        assert!(readable(&dir.path().join("absent")).is_err());
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        readable(&dir.path().join("f")).unwrap();
        assert!(writable_dir(&dir.path().join("f")).is_err());
    }
}
