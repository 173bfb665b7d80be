//! Signals to other processes, children that can receive them, and facts about this process's
//! own file descriptors.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// Sends SIGHUP to process `pid` (must be > 0). The error is the kernel's (`ESRCH`: no such
/// process, `EPERM`: not allowed).
pub fn send_sighup(pid: i32) -> std::io::Result<()> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .map_err(std::io::Error::from)
}

/// Why a signal to a named process was not sent.
#[derive(Debug, thiserror::Error)]
pub enum NamedSignalError {
    /// The process could not be opened or signalled (ESRCH: gone; EPERM: not allowed).
    #[error("{0}")]
    Kernel(#[source] std::io::Error),
    /// `/proc/PID/comm` could not be read, so what runs under the pid is unknown. Under
    /// systemd's `ProtectProc=invisible` another user's process is hidden this way.
    #[error(
        "cannot tell what pid {pid} runs (/proc/{pid}/comm: {source}); a service with \
         ProtectProc=invisible cannot see another user's processes"
    )]
    Unverifiable {
        /// The pid.
        pid: i32,
        /// Why `/proc/PID/comm` was unreadable.
        #[source]
        source: std::io::Error,
    },
    /// Another program runs under the pid (a stale pid file, a recycled pid).
    #[error("pid {pid} is {found:?}, not {expected:?}: no signal sent")]
    NotTheProgram {
        /// The pid.
        pid: i32,
        /// The process's name (`/proc/PID/comm`).
        found: String,
        /// The name that was expected.
        expected: String,
    },
}

/// Sends SIGHUP to process `pid` only if its name (`/proc/PID/comm`, at most 15 bytes of the
/// executable's name) is `expected`. The process is pinned with a pidfd before its name is
/// read and signalled through that pidfd, so a pid recycled in between is never signalled: if
/// the checked process exits, the signal fails with ESRCH instead of reaching a newcomer.
pub fn send_sighup_if_named(pid: i32, expected: &str) -> Result<(), NamedSignalError> {
    let pidfd = pidfd_open(pid).map_err(NamedSignalError::Kernel)?;
    let found = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map_err(|source| NamedSignalError::Unverifiable { pid, source })?;
    let found = found.trim_end_matches('\n');
    // comm is the executable's name cut to 15 bytes.
    let want: String = expected.chars().take(15).collect();
    if found != want {
        return Err(NamedSignalError::NotTheProgram {
            pid,
            found: found.to_owned(),
            expected: expected.to_owned(),
        });
    }
    pidfd_send_sighup(&pidfd).map_err(NamedSignalError::Kernel)
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(std::io::Error::from_raw_os_error(nix::libc::EINVAL));
    }
    // SAFETY: pidfd_open(2) takes a pid and flags (0) and returns a new file descriptor or -1;
    // no memory is passed.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(nix::libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_send_sighup(pidfd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal(2) with a live pidfd we own, SIGHUP, a null siginfo (the kernel
    // fills it as kill(2) would) and flags 0; no memory is passed besides the null pointer.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            nix::libc::SIGHUP,
            std::ptr::null::<nix::libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The signals a child must be able to receive: SIGHUP (a reload: OpenSM's heavy sweep, the
/// agent's configuration) and SIGINT and SIGTERM (a stop).
const CHILD_DEFAULT_SIGNALS: [nix::sys::signal::Signal; 3] = [
    nix::sys::signal::Signal::SIGHUP,
    nix::sys::signal::Signal::SIGINT,
    nix::sys::signal::Signal::SIGTERM,
];

/// Makes `command`'s child start with the default disposition of SIGHUP, SIGINT and SIGTERM,
/// whatever this process's are. An ignored signal stays ignored across fork and exec, so a
/// process started with SIGHUP ignored (under `nohup`, by some init scripts and CI runners)
/// would otherwise pass that on, and its children could not be reloaded or stopped with the
/// signal. (std already resets the child's signal mask and SIGPIPE; handlers are reset by exec.)
pub fn with_default_signals(command: &mut std::process::Command) -> &mut std::process::Command {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    use std::os::unix::process::CommandExt;
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be called: it calls only sigaction(2), which POSIX lists
    // as async-signal-safe, with a value built before the fork; it allocates nothing and takes
    // no lock. Setting SIG_DFL installs no handler, so sigaction's own safety condition (a
    // handler must be async-signal-safe) holds.
    unsafe {
        command.pre_exec(move || {
            for signal in CHILD_DEFAULT_SIGNALS {
                sigaction(signal, &default).map_err(std::io::Error::from)?;
            }
            Ok(())
        })
    }
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
    fn a_named_sighup_reaches_only_the_named_program() {
        // Default dispositions: when this suite runs with SIGHUP ignored (under nohup), a plain
        // child would inherit that and survive the signal.
        let mut child = with_default_signals(std::process::Command::new("sleep").arg("30"))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // spawn may return before the child has exec'd: wait until it is `sleep`.
        let comm = format!("/proc/{pid}/comm");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(&comm).unwrap() != "sleep\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never became sleep"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        match send_sighup_if_named(pid, "opensm") {
            Err(NamedSignalError::NotTheProgram { found, .. }) => assert_eq!(found, "sleep"),
            other => panic!("{other:?}"),
        }
        // Still alive: nothing was sent.
        assert!(child.try_wait().unwrap().is_none());
        send_sighup_if_named(pid, "sleep").unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(nix::libc::SIGHUP));
        // The pid is gone now: the kernel says so.
        assert!(matches!(
            send_sighup_if_named(pid, "sleep"),
            Err(NamedSignalError::Kernel(_))
        ));
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

    /// The environment variable that makes `dispositions_probe` run (it is started by
    /// `a_child_gets_default_dispositions_when_this_process_ignores_sighup`).
    const PROBE: &str = "FABRIC_AGENT_DISPOSITIONS_PROBE";

    /// Signals ignored by `pid`, from the `SigIgn` mask of `/proc/PID/status` (bit n-1 for
    /// signal n), read by a `cat` child spawned with `command`.
    fn ignored_by_a_child(command: &mut std::process::Command) -> u64 {
        let out = command.arg("/proc/self/status").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let status = String::from_utf8(out.stdout).unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .unwrap_or_else(|| panic!("{status}"));
        u64::from_str_radix(mask.trim(), 16).unwrap()
    }

    const HUP_INT_TERM: u64 =
        1 << (nix::libc::SIGHUP - 1) | 1 << (nix::libc::SIGINT - 1) | 1 << (nix::libc::SIGTERM - 1);

    /// Run by the test below under `nohup` (SIGHUP ignored in this process): a plain child
    /// inherits the ignored SIGHUP, a child spawned through `with_default_signals` does not.
    #[test]
    #[ignore = "a probe started by a_child_gets_default_dispositions_when_this_process_ignores_sighup"]
    fn dispositions_probe() {
        assert_eq!(
            std::env::var(PROBE).as_deref(),
            Ok("1"),
            "run by the test below"
        );
        let sighup = 1 << (nix::libc::SIGHUP - 1);
        let plain = ignored_by_a_child(&mut std::process::Command::new("cat"));
        assert_eq!(
            plain & sighup,
            sighup,
            "the probe must run with SIGHUP ignored"
        );
        let reset =
            ignored_by_a_child(with_default_signals(&mut std::process::Command::new("cat")));
        assert_eq!(
            reset & HUP_INT_TERM,
            0,
            "a child spawned through with_default_signals ignores {reset:#x}"
        );
        println!("PROBE-OK plain={plain:#x} reset={reset:#x}");
    }

    #[test]
    fn a_child_gets_default_dispositions_when_this_process_ignores_sighup() {
        // This test binary again, under nohup (SIGHUP ignored from its start), running only the
        // probe: independent of how this process itself was started.
        let me = std::env::current_exe().unwrap();
        let out = std::process::Command::new("nohup")
            .arg(me)
            .args(["--exact", "sys::process::tests::dispositions_probe"])
            .args(["--ignored", "--nocapture", "--test-threads=1"])
            .env(PROBE, "1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("PROBE-OK"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
