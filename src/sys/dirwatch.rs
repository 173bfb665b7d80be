//! Watching one directory for entries that appear, disappear or are rewritten (inotify), without
//! polling: the daemon uses it to notice its unix socket being deleted and its TLS files being
//! replaced.

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// What happened in the watched directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An entry was deleted or moved away.
    Removed(OsString),
    /// An entry was created or moved in.
    Created(OsString),
    /// A file opened for writing was closed (its new content is complete).
    Written(OsString),
    /// The directory itself was deleted or moved: the watch has ended.
    DirGone,
}

/// An inotify instance (its descriptor, for tokio's reactor).
struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A watch on one directory.
pub struct DirWatch {
    fd: AsyncFd<Fd>,
}

impl DirWatch {
    /// Starts watching `dir` (must be called inside a tokio runtime).
    pub fn new(dir: &Path) -> io::Result<DirWatch> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(
            dir,
            AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        )?;
        // SAFETY: `Fd` owns the inotify descriptor (nix's `Inotify` holds an `OwnedFd`), so it
        // stays open and is the same descriptor for as long as the `AsyncFd` owns the `Fd`.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(inotify), Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(DirWatch { fd })
    }

    /// Waits for the next changes.
    pub async fn changes(&self) -> io::Result<Vec<Change>> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                Ok(events) => {
                    return Ok(events?
                        .into_iter()
                        .filter_map(|e| {
                            let gone = AddWatchFlags::IN_DELETE_SELF
                                | AddWatchFlags::IN_MOVE_SELF
                                | AddWatchFlags::IN_IGNORED;
                            if e.mask.intersects(gone) {
                                Some(Change::DirGone)
                            } else if e
                                .mask
                                .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                            {
                                e.name.map(Change::Removed)
                            } else if e.mask.contains(AddWatchFlags::IN_CLOSE_WRITE) {
                                e.name.map(Change::Written)
                            } else {
                                e.name.map(Change::Created)
                            }
                        })
                        .collect())
                }
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sees_an_entry_removed_and_the_directory_gone() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("run");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("agent.sock"), b"").unwrap();
        let w = DirWatch::new(&sub).unwrap();
        std::fs::remove_file(sub.join("agent.sock")).unwrap();
        let c = w.changes().await.unwrap();
        assert_eq!(c, [Change::Removed("agent.sock".into())]);
        std::fs::write(sub.join("ca.pem"), b"x").unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&Change::Written("ca.pem".into())) {
            seen.extend(w.changes().await.unwrap());
        }
        assert!(seen.contains(&Change::Created("ca.pem".into())), "{seen:?}");
        std::fs::remove_file(sub.join("ca.pem")).unwrap();
        std::fs::remove_dir(&sub).unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&Change::DirGone) {
            seen.extend(w.changes().await.unwrap());
        }
    }
}
