//! Signals to other processes, and facts about this process's own file descriptors.

use std::os::fd::AsFd;

/// Sends SIGHUP to process `pid` (must be > 0). The error is the kernel's (`ESRCH`: no such
/// process, `EPERM`: not allowed).
pub fn send_sighup(pid: i32) -> std::io::Result<()> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .map_err(std::io::Error::from)
}

/// The device and inode of what a file descriptor refers to (`fstat`'s `st_dev`, `st_ino`).
pub fn device_and_inode(fd: impl AsFd) -> std::io::Result<(u64, u64)> {
    let stat = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
    Ok((stat.st_dev, stat.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sighup_to_a_missing_process_is_an_error() {
        // Pids above the kernel's pid_max (at most 2^22) never exist.
        let e = send_sighup(i32::MAX).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ESRCH));
    }

    #[test]
    fn an_open_file_has_its_own_inode() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("fabric-agent-process-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let (_, ino) = device_and_inode(&file).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(ino, std::fs::metadata(&path).unwrap().ino());
        std::fs::remove_file(&path).unwrap();
    }
}
