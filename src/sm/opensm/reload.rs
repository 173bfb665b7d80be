//! Making OpenSM re-read the partitions file, and learning whether it accepted it.
//!
//! Every heavy sweep re-reads the file; SIGHUP forces one, and so does `resweep heavy` on the
//! loopback console. OpenSM's answer is only in its log: a rejected file logs `PARSE ERROR`
//! lines or, for an empty file, `Partition configuration in error`, then OpenSM falls back to
//! its default configuration. So the log's length is taken before the file is replaced, and
//! after the reload the new part of the log is watched for errors.
//!
//! When to stop watching: OpenSM logs nothing for a successful re-read at its default
//! verbosity (`SUBNET UP` only on some sweeps). But reading the file advances its access time:
//! the agent's write leaves atime at or before mtime, and with `relatime` (the default) the
//! first read after that sets atime to the read's time. So the watch ends a short grace after
//! atime moves past mtime (OpenSM has read, and parsed, the new file), at `SUBNET UP`, at an
//! error line, or after `reload_check_ms` (e.g. on a `noatime` mount).

use super::{OpenSmConfig, ReloadMethod};
use async_trait::async_trait;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a reload failed.
#[derive(Debug, Clone, Error)]
pub enum ReloadError {
    /// OpenSM could not be signalled (no pid, dead process, console closed).
    #[error("cannot make OpenSM re-read the partitions file: {0}")]
    Unreachable(#[source] Unsignalled),
    /// OpenSM's log shows it rejected the file: its error lines, as OpenSM wrote them.
    #[error("OpenSM rejected the partitions file: {0}")]
    Rejected(String),
}

/// Why OpenSM could not be made to re-read the file.
#[derive(Debug, Clone, Error)]
pub enum Unsignalled {
    /// The pid file could not be read.
    #[error("pid file {}: {source}", path.display())]
    PidFile {
        /// The pid file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The pid file holds no pid above 1.
    #[error("pid file {} holds {text:?}, not a pid", path.display())]
    NotAPid {
        /// The pid file.
        path: PathBuf,
        /// Its (trimmed) text.
        text: String,
    },
    /// Neither `pid_file` nor `pid` is configured.
    #[error("no pid_file or pid configured")]
    NoPid,
    /// The signal could not be sent (ESRCH: no such process, EPERM: not allowed).
    #[error("SIGHUP to pid {pid}: {source}")]
    Signal {
        /// The pid.
        pid: i32,
        /// The kernel's answer.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The pid does not run OpenSM (a stale pid file, a recycled pid), or what it runs cannot
    /// be seen: no signal was sent.
    #[error("{0}")]
    NotOpenSm(#[source] Arc<crate::sys::process::NamedSignalError>),
    /// The console did not take the command.
    #[error("console 127.0.0.1:{port}: {step} {}", .source.as_ref().map_or_else(|| "timed out".to_owned(), ToString::to_string))]
    Console {
        /// OpenSM's console port.
        port: u16,
        /// What failed: "connect" or "write".
        step: &'static str,
        /// The I/O error; `None`: the step timed out.
        #[source]
        source: Option<Arc<std::io::Error>>,
    },
}

/// What a reload saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReloadReport {
    /// OpenSM was seen re-reading the file (access time or `SUBNET UP`) without logging an
    /// error; false when the watch window ended first.
    pub file_read: bool,
}

/// Forces a heavy sweep after the file was replaced.
#[async_trait]
pub trait Reloader: Send + Sync + 'static {
    /// Taken just before the file is replaced (the log's length).
    fn checkpoint(&self) -> u64;
    /// Forces a heavy sweep and checks OpenSM's verdict on everything after `checkpoint`.
    async fn reload(&self, checkpoint: u64) -> Result<ReloadReport, ReloadError>;
    /// Rejections OpenSM logged after `offset` on its own (a sweep the agent did not trigger
    /// re-read a file an operator broke), and the offset read up to. Default: none.
    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        (Vec::new(), offset)
    }
}

/// The real [`Reloader`]: SIGHUP or console, then OpenSM's log.
#[derive(Debug, Clone)]
pub struct OpenSmReloader {
    method: ReloadMethod,
    pid_file: Option<PathBuf>,
    pid: Option<i32>,
    process_name: String,
    console_port: u16,
    log_file: PathBuf,
    partitions_file: PathBuf,
    check: Duration,
}

const CONSOLE_TIMEOUT: Duration = Duration::from_secs(2);
const CONSOLE_DRAIN: Duration = Duration::from_millis(200);
const LOG_POLL: Duration = Duration::from_millis(5);
/// How long to keep reading the log after OpenSM read the file: parsing a partitions file
/// takes well under this, and its error lines are flushed as they are written.
const READ_GRACE: Duration = Duration::from_millis(100);

impl OpenSmReloader {
    /// From the backend's settings.
    pub fn new(config: &OpenSmConfig) -> Self {
        OpenSmReloader {
            method: config.reload,
            pid_file: config.pid_file.clone(),
            pid: config.pid,
            process_name: config.process_name.clone(),
            console_port: config.console_port,
            log_file: config.log_file.clone(),
            partitions_file: config.partitions_file.clone(),
            check: Duration::from_millis(config.reload_check_ms),
        }
    }

    fn opensm_pid(&self) -> Result<i32, ReloadError> {
        if let Some(path) = &self.pid_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ReloadError::Unreachable(Unsignalled::PidFile {
                    path: path.clone(),
                    source: Arc::new(e),
                })
            })?;
            return text
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|p| *p > 1)
                .ok_or_else(|| {
                    ReloadError::Unreachable(Unsignalled::NotAPid {
                        path: path.clone(),
                        text: text.trim().to_owned(),
                    })
                });
        }
        self.pid.ok_or(ReloadError::Unreachable(Unsignalled::NoPid))
    }

    fn sighup(&self) -> Result<(), ReloadError> {
        use crate::sys::process::{send_sighup_if_named, NamedSignalError};
        let pid = self.opensm_pid()?;
        send_sighup_if_named(pid, &self.process_name).map_err(|e| {
            ReloadError::Unreachable(match e {
                NamedSignalError::Kernel(e) => Unsignalled::Signal {
                    pid,
                    source: Arc::new(e),
                },
                other => Unsignalled::NotOpenSm(Arc::new(other)),
            })
        })
    }

    async fn console_resweep(&self) -> Result<(), ReloadError> {
        let unreachable = |step: &'static str, e: Option<std::io::Error>| {
            ReloadError::Unreachable(Unsignalled::Console {
                port: self.console_port,
                step,
                source: e.map(Arc::new),
            })
        };
        let mut s = tokio::time::timeout(
            CONSOLE_TIMEOUT,
            tokio::net::TcpStream::connect(("127.0.0.1", self.console_port)),
        )
        .await
        .map_err(|_| unreachable("connect", None))?
        .map_err(|e| unreachable("connect", Some(e)))?;
        tokio::time::timeout(CONSOLE_TIMEOUT, async {
            s.write_all(b"resweep heavy\nquit\n").await?;
            s.flush().await
        })
        .await
        .map_err(|_| unreachable("write", None))?
        .map_err(|e| unreachable("write", Some(e)))?;
        // Drain what OpenSM answers for a moment, then close: closing ends the session, which
        // matters since OpenSM serves one console session at a time.
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(CONSOLE_DRAIN, s.read_to_end(&mut sink)).await;
        Ok(())
    }
}

/// A file's access and modification times, nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileTimes {
    atime: i128,
    mtime: i128,
}

impl FileTimes {
    fn of(path: &Path) -> Option<FileTimes> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileTimes {
            atime: i128::from(m.atime()) * 1_000_000_000 + i128::from(m.atime_nsec()),
            mtime: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }

    /// Whether the file was read after `written` was taken: same file (mtime unchanged) and its
    /// atime moved past both the old atime and mtime.
    fn read_since(now: Option<FileTimes>, written: Option<FileTimes>) -> bool {
        match (now, written) {
            (Some(n), Some(w)) => n.mtime == w.mtime && n.atime > w.atime && n.atime > n.mtime,
            _ => false,
        }
    }
}

/// The log's current length (0 when absent).
pub fn log_length(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Complete lines written after `offset` (from the start when the log was rotated).
pub fn log_lines_since(path: &Path, offset: u64) -> Vec<String> {
    log_lines_and_end(path, offset).0
}

/// Complete lines written after `offset` (from the start when the log was rotated), and the
/// offset just past the last complete line.
pub fn log_lines_and_end(path: &Path, offset: u64) -> (Vec<String>, u64) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return (Vec::new(), offset);
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = if len < offset { 0 } else { offset };
    if f.seek(SeekFrom::Start(from)).is_err() {
        return (Vec::new(), offset);
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return (Vec::new(), offset);
    }
    let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let lines = String::from_utf8_lossy(&buf[..complete])
        .lines()
        .map(str::to_owned)
        .collect();
    (lines, from + complete as u64)
}

/// OpenSM's verdict in log lines: the lines showing it dropped the file, and whether a sweep
/// finished. `mgid` lines (`PARSE ERROR partition conf file line N: mgid ...`) are excluded:
/// OpenSM logs them but keeps the file, and the parser reports them as warnings.
pub fn verdict(lines: &[String]) -> (Vec<String>, bool) {
    let errors = lines
        .iter()
        .filter(|l| {
            (l.contains("PARSE ERROR") && !l.contains("PARSE ERROR partition conf file"))
                || l.contains("Partition configuration in error")
        })
        .cloned()
        .collect();
    let swept = lines.iter().any(|l| l.contains("SUBNET UP"));
    (errors, swept)
}

#[async_trait]
impl Reloader for OpenSmReloader {
    fn checkpoint(&self) -> u64 {
        log_length(&self.log_file)
    }

    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        if log_length(&self.log_file) == offset {
            return (Vec::new(), offset);
        }
        let (lines, end) = log_lines_and_end(&self.log_file, offset);
        (verdict(&lines).0, end)
    }

    async fn reload(&self, checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        let written = FileTimes::of(&self.partitions_file);
        match self.method {
            ReloadMethod::Sighup => self.sighup()?,
            ReloadMethod::Console => self.console_resweep().await?,
        }
        let deadline = tokio::time::Instant::now() + self.check;
        let mut read_at = None;
        loop {
            let (errors, swept) = verdict(&log_lines_since(&self.log_file, checkpoint));
            if !errors.is_empty() {
                return Err(ReloadError::Rejected(errors.join(" | ")));
            }
            let now = tokio::time::Instant::now();
            if read_at.is_none()
                && FileTimes::read_since(FileTimes::of(&self.partitions_file), written)
            {
                read_at = Some(now);
            }
            if swept || read_at.is_some_and(|t| now >= t + READ_GRACE) {
                return Ok(ReloadReport { file_read: true });
            }
            if now >= deadline {
                return Ok(ReloadReport { file_read: false });
            }
            tokio::time::sleep(LOG_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_reads_opensm_lines() {
        let lines: Vec<String> = [
            "Dec 02 10:28:50 374208 [907926C0] 0x02 -> SUBNET UP",
            "Dec 02 10:28:50 841089 [907926C0] 0x01 -> parse_part_conf: PARSE ERROR: line 5: no partition definition found",
            "x 0x01 -> PARSE ERROR partition conf file line 3: mgid \"fe80::1\": gid is not multicast",
        ]
        .map(str::to_owned)
        .to_vec();
        let (errors, swept) = verdict(&lines);
        assert!(swept);
        assert_eq!(errors.len(), 1);
        let empty = ["0x01 -> osm_prtn_make_partitions: Partition configuration in error; retrying with default config".to_owned()];
        assert_eq!(verdict(&empty).0.len(), 1);
    }

    #[test]
    fn log_lines_since_handles_rotation_and_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("opensm.log");
        std::fs::write(&p, "old line\n").unwrap();
        let mark = log_length(&p);
        std::fs::write(&p, "old line\nnew line\npartial").unwrap();
        assert_eq!(log_lines_since(&p, mark), vec!["new line".to_owned()]);
        std::fs::write(&p, "x\n").unwrap();
        assert_eq!(log_lines_since(&p, mark), vec!["x".to_owned()]);
    }

    #[test]
    fn reading_a_fresh_file_advances_its_atime_past_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("partitions.conf");
        crate::sm::opensm::file::replace_atomically(&p, b"Default=0x7fff : ALL=full;\n").unwrap();
        let written = FileTimes::of(&p);
        assert!(!FileTimes::read_since(FileTimes::of(&p), written));
        std::thread::sleep(Duration::from_millis(20));
        let _ = std::fs::read(&p).unwrap();
        // Holds on relatime/strictatime mounts; noatime mounts fall back to the time window.
        let mounted_noatime =
            std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| m.contains("noatime"));
        if !mounted_noatime {
            assert!(FileTimes::read_since(FileTimes::of(&p), written));
        }
    }

    #[tokio::test]
    async fn sighup_without_a_process_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("opensm.pid");
        std::fs::write(&pid_file, "not a pid\n").unwrap();
        let config = OpenSmConfig {
            pid_file: Some(pid_file),
            log_file: dir.path().join("opensm.log"),
            ..OpenSmConfig::default()
        };
        let r = OpenSmReloader::new(&config);
        assert!(matches!(
            r.reload(0).await,
            Err(ReloadError::Unreachable(_))
        ));
    }

    #[tokio::test]
    async fn a_stale_pid_file_naming_another_program_gets_no_signal() {
        let dir = tempfile::tempdir().unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid_file = dir.path().join("opensm.pid");
        std::fs::write(&pid_file, format!("{}\n", other.id())).unwrap();
        let config = OpenSmConfig {
            pid_file: Some(pid_file),
            log_file: dir.path().join("opensm.log"),
            ..OpenSmConfig::default()
        };
        let e = OpenSmReloader::new(&config).reload(0).await.unwrap_err();
        assert!(
            matches!(e, ReloadError::Unreachable(Unsignalled::NotOpenSm(_))),
            "{e}"
        );
        assert!(e.to_string().contains("not \"opensm\""), "{e}");
        // Not signalled: still running.
        assert!(other.try_wait().unwrap().is_none());
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
