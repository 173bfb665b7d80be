//! The unix socket's guard: accepts connections for the gRPC server and, when the socket file
//! is deleted while the daemon runs (by hand, or by a careless tool), binds it again at the same
//! path and logs it. A path that another process has taken meanwhile is left alone.

use crate::sys::dirwatch::{Change, DirWatch};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

/// The socket file this daemon currently owns, by inode (0: none).
#[derive(Debug, Clone, Default)]
pub struct OwnedSocket(Arc<AtomicU64>);

impl OwnedSocket {
    /// Whether `path` is still the socket this daemon bound (so it may delete it on exit).
    pub fn is_ours(&self, path: &Path) -> bool {
        let ours = self.0.load(Ordering::Relaxed);
        ours != 0 && inode(path) == Some(ours)
    }
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

/// Who may open the socket file: its mode, and the group it is given (the read group; `None`
/// keeps the agent's own group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// The file mode, e.g. 0o660.
    pub mode: u32,
    /// The file's group.
    pub group: Option<u32>,
}

/// Binds `path` with `access`, the caller having checked that no live agent answers there.
pub fn bind(path: &Path, access: SocketAccess) -> io::Result<UnixListener> {
    let listener = UnixListener::bind(path)?;
    if let Some(gid) = access.group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode))?;
    Ok(listener)
}

/// Accepted connections on `listener`, re-binding `path` if its file disappears, until
/// `shutdown` turns true.
pub fn incoming(
    listener: UnixListener,
    path: PathBuf,
    access: SocketAccess,
    shutdown: watch::Receiver<bool>,
    owned: OwnedSocket,
) -> ReceiverStream<io::Result<UnixStream>> {
    let (tx, rx) = mpsc::channel(64);
    owned.0.store(inode(&path).unwrap_or(0), Ordering::Relaxed);
    tokio::spawn(guard(listener, path, access, shutdown, owned, tx));
    ReceiverStream::new(rx)
}

async fn guard(
    mut listener: UnixListener,
    path: PathBuf,
    access: SocketAccess,
    mut shutdown: watch::Receiver<bool>,
    owned: OwnedSocket,
    tx: mpsc::Sender<io::Result<UnixStream>>,
) {
    let dir = path.parent().map(Path::to_owned).unwrap_or_default();
    let name = path.file_name().map(ToOwned::to_owned).unwrap_or_default();
    let mut dir_watch = watch_dir(&dir);
    let mut warned_taken = false;
    loop {
        let changes = async {
            match &dir_watch {
                Some(w) => w.changes().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            accepted = listener.accept() => {
                if tx.send(accepted.map(|(s, _)| s)).await.is_err() {
                    return;
                }
            }
            changes = changes => {
                let changes = changes.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "watching the socket's directory failed");
                    vec![Change::DirGone]
                });
                let dir_gone = changes.contains(&Change::DirGone);
                let touched = dir_gone || changes.iter().any(|c| {
                    matches!(c, Change::Removed(n) | Change::Created(n) if *n == name)
                });
                if dir_gone {
                    dir_watch = None;
                }
                if !touched {
                    continue;
                }
                match inode(&path) {
                    Some(i) if i == owned.0.load(Ordering::Relaxed) => {}
                    Some(_) => {
                        if !warned_taken {
                            tracing::error!(socket = %path.display(), "the unix socket path now belongs to another file or process; leaving it alone (this daemon is reachable only over TCP, if configured)");
                            warned_taken = true;
                        }
                    }
                    // The daemon removes its own socket as it stops: never bring it back then.
                    None if *shutdown.borrow() => return,
                    None => match rebind(&path, access) {
                        Ok(l) => {
                            listener = l;
                            owned.0.store(inode(&path).unwrap_or(0), Ordering::Relaxed);
                            warned_taken = false;
                            tracing::warn!(socket = %path.display(), "the unix socket was deleted; re-created it");
                        }
                        Err(e) => tracing::error!(socket = %path.display(), error = %e, "the unix socket was deleted and cannot be re-created"),
                    },
                }
                if dir_watch.is_none() {
                    dir_watch = watch_dir(&dir);
                }
            }
        }
    }
}

async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

fn rebind(path: &Path, access: SocketAccess) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    bind(path, access)
}

fn watch_dir(dir: &Path) -> Option<DirWatch> {
    match DirWatch::new(dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the socket's directory; a deleted socket will not be re-created");
            None
        }
    }
}
