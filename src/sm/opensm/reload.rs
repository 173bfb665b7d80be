//! Making OpenSM re-read the partitions file, and learning whether it accepted it.
//!
//! Every heavy sweep re-reads the file; SIGHUP forces one, and so does `resweep heavy` on the
//! loopback console. OpenSM's answer is only in its log: a rejected file logs `PARSE ERROR`
//! lines or, for an empty file, `Partition configuration in error`, then OpenSM falls back to
//! its default configuration.
//!
//! Confirmation comes from OpenSM's own log, ordered against a mark taken *after* the file was
//! replaced (the sweep fence): OpenSM runs its sweeps one after another on one thread, reads the
//! partitions file early in every heavy sweep and logs `SUBNET UP` at the end of it. The first
//! `SUBNET UP` after the mark may end a sweep that started (and read the file) before the write;
//! the second one ends a sweep that started after the first was logged, so after the write: it
//! read the new file. So the agent signals, waits for one `SUBNET UP` past the mark, signals
//! again, and confirms only at the second one with no error line since the mark. Only OpenSM's
//! own lines count, read by structure ([`super::log_line`]): prefix, level and the whole
//! message, never a substring a NodeDescription OpenSM logs could carry. Nothing a
//! reader of the partitions file does (its access time, a `cat`, a backup) can produce OpenSM's
//! log lines, and a stopped OpenSM (SIGSTOP, a hung sweep, a standby) logs none: the write stays
//! unconfirmed. Writing the log itself needs write access to it, which only OpenSM should have.

use super::log_line::{verdicts, Verdicts};
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
    /// OpenSM's log shows a whole heavy sweep that started after the mark (two `SUBNET UP`
    /// lines past it, see the module docs) and no error line: OpenSM read and accepted the
    /// file. False when the watch window ended first.
    pub file_read: bool,
}

/// Forces a heavy sweep after the file was replaced.
#[async_trait]
pub trait Reloader: Send + Sync + 'static {
    /// Taken just after the file is replaced (the log's length): the sweep fence's mark.
    fn checkpoint(&self) -> u64;
    /// Forces heavy sweeps and checks OpenSM's verdict on everything after `checkpoint` (see
    /// the module docs for why two `SUBNET UP` lines are needed).
    async fn reload(&self, checkpoint: u64) -> Result<ReloadReport, ReloadError>;
    /// Rejections OpenSM logged after `offset` on its own (a sweep the agent did not trigger
    /// re-read a file an operator broke), and the offset read up to. Default: none.
    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        (Vec::new(), offset)
    }
    /// The log file's device and inode (a rotated log is another file). Default: not known.
    fn log_identity(&self) -> Option<(u64, u64)> {
        None
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
    check: Duration,
}

const CONSOLE_TIMEOUT: Duration = Duration::from_secs(2);
const CONSOLE_DRAIN: Duration = Duration::from_millis(200);
const LOG_POLL: Duration = Duration::from_millis(5);
/// How long a forced sweep may go without a new `SUBNET UP` before it is forced again: a heavy
/// sweep that a link change interrupts ends with errors and no `SUBNET UP`, and OpenSM's next
/// sweep is otherwise its periodic one (`sweep_interval`, 10 s by default).
const SWEEP_RETRY: Duration = Duration::from_millis(1000);

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
            check: Duration::from_millis(config.reload_check_ms),
        }
    }

    /// OpenSM's pid, from `pid_file` or `pid`.
    pub fn opensm_pid(&self) -> Result<i32, ReloadError> {
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

    fn console_error(&self, step: &'static str, e: Option<std::io::Error>) -> ReloadError {
        ReloadError::Unreachable(Unsignalled::Console {
            port: self.console_port,
            step,
            source: e.map(Arc::new),
        })
    }

    /// Opens one console session for the whole fence: OpenSM serves one session at a time, so
    /// both `resweep heavy` commands go through the same one.
    async fn console_open(&self) -> Result<tokio::net::TcpStream, ReloadError> {
        tokio::time::timeout(
            CONSOLE_TIMEOUT,
            tokio::net::TcpStream::connect(("127.0.0.1", self.console_port)),
        )
        .await
        .map_err(|_| self.console_error("connect", None))?
        .map_err(|e| self.console_error("connect", Some(e)))
    }

    async fn console_send(
        &self,
        s: &mut tokio::net::TcpStream,
        command: &[u8],
    ) -> Result<(), ReloadError> {
        tokio::time::timeout(CONSOLE_TIMEOUT, async {
            s.write_all(command).await?;
            s.flush().await
        })
        .await
        .map_err(|_| self.console_error("write", None))?
        .map_err(|e| self.console_error("write", Some(e)))
    }

    /// Ends the session: `quit`, drain what OpenSM answers for a moment, close.
    async fn console_close(&self, mut s: tokio::net::TcpStream) {
        let _ = self.console_send(&mut s, b"quit\n").await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(CONSOLE_DRAIN, s.read_to_end(&mut sink)).await;
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
/// finished. Only OpenSM's own lines count, read by structure ([`super::log_line`]): a
/// NodeDescription quoting `SUBNET UP` or `PARSE ERROR` in a line OpenSM logs about that node
/// is neither. `mgid` lines (`PARSE ERROR partition conf file line N: mgid ...`) are not
/// rejections: OpenSM logs them but keeps the file, and the parser reports them as warnings.
pub fn verdict(lines: &[String]) -> (Vec<String>, bool) {
    let v = verdicts(lines);
    (v.rejections, v.sweeps > 0)
}

#[async_trait]
impl Reloader for OpenSmReloader {
    fn checkpoint(&self) -> u64 {
        log_length(&self.log_file)
    }

    fn log_identity(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.log_file)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    }

    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        if log_length(&self.log_file) == offset {
            return (Vec::new(), offset);
        }
        let (lines, end) = log_lines_and_end(&self.log_file, offset);
        (verdict(&lines).0, end)
    }

    async fn reload(&self, checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        let mut console = match self.method {
            ReloadMethod::Console => Some(self.console_open().await?),
            ReloadMethod::Sighup => None,
        };
        let result = self.fence_after(checkpoint, &mut console).await;
        if let Some(s) = console {
            self.console_close(s).await;
        }
        result
    }
}

impl OpenSmReloader {
    /// Forces a heavy sweep: SIGHUP, or `resweep heavy` on the open console session.
    async fn force_sweep(
        &self,
        console: &mut Option<tokio::net::TcpStream>,
    ) -> Result<(), ReloadError> {
        match console {
            Some(s) => self.console_send(s, b"resweep heavy\n").await,
            None => self.sighup(),
        }
    }

    /// Forces sweeps until the fence passes, OpenSM logs an error, or the watch ends.
    async fn fence_after(
        &self,
        checkpoint: u64,
        console: &mut Option<tokio::net::TcpStream>,
    ) -> Result<ReloadReport, ReloadError> {
        self.force_sweep(console).await?;
        let deadline = tokio::time::Instant::now() + self.check;
        let mut signalled_again = false;
        // The sweeps seen when a sweep was last forced, and when.
        let mut forced = (0usize, tokio::time::Instant::now());
        loop {
            let seen = verdicts(&log_lines_since(&self.log_file, checkpoint));
            let standing = fence_of(&seen);
            if seen.sweeps > forced.0 {
                forced = (seen.sweeps, tokio::time::Instant::now());
            } else if forced.1.elapsed() >= SWEEP_RETRY && matches!(standing, Fence::Ended(_)) {
                // The forced sweep did not end (a link changed under it): force another.
                tracing::debug!(
                    sweeps = seen.sweeps,
                    "no sweep ended since the last forced one; forcing another"
                );
                self.force_sweep(console).await?;
                forced.1 = tokio::time::Instant::now();
            }
            if !matches!(standing, Fence::Ended(_)) && !seen.distrusted.is_empty() {
                tracing::warn!(lines = ?seen.distrusted, "OpenSM's log holds verdict-shaped lines inside a message that carried a newline; not trusted");
            }
            match standing {
                Fence::Rejected(errors) => return Err(ReloadError::Rejected(errors.join(" | "))),
                Fence::Passed => return Ok(ReloadReport { file_read: true }),
                // One sweep ended after the mark: it may have started before the write. Ask
                // for another; the one after it started after the mark.
                Fence::Ended(1) if !signalled_again => {
                    signalled_again = true;
                    self.force_sweep(console).await?;
                    forced.1 = tokio::time::Instant::now();
                }
                Fence::Ended(_) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(ReloadReport { file_read: false });
            }
            tokio::time::sleep(LOG_POLL).await;
        }
    }
}

/// Where the sweep fence stands in the log lines after the mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// OpenSM logged that it dropped a file: its error lines.
    Rejected(Vec<String>),
    /// This many sweeps ended (`SUBNET UP`) after the mark, fewer than two, no error.
    Ended(usize),
    /// Two sweeps ended after the mark with no error: the second started after the mark.
    Passed,
}

/// Judges the log lines written after the mark (taken after the file was replaced).
pub fn fence(lines: &[String]) -> Fence {
    fence_of(&verdicts(lines))
}

/// The fence's standing from OpenSM's verdicts after the mark.
fn fence_of(v: &Verdicts) -> Fence {
    if !v.rejections.is_empty() {
        return Fence::Rejected(v.rejections.clone());
    }
    match v.sweeps {
        n @ 0..=1 => Fence::Ended(n),
        _ => Fence::Passed,
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
            "Dec 02 10:28:50 841090 [907926C0] 0x01 -> mgroup_create: PARSE ERROR partition conf file line 3: mgid \"fe80::1\": gid is not multicast",
        ]
        .map(str::to_owned)
        .to_vec();
        let (errors, swept) = verdict(&lines);
        assert!(swept);
        assert_eq!(errors.len(), 1);
        let empty = ["Dec 02 10:28:50 841089 [907926C0] 0x01 -> osm_prtn_make_partitions: Partition configuration in error; retrying with default config".to_owned()];
        assert_eq!(verdict(&empty).0.len(), 1);
        // The same words without OpenSM's prefix are no verdict.
        let bare = ["0x01 -> osm_prtn_make_partitions: Partition configuration in error; retrying with default config".to_owned()];
        assert!(verdict(&bare).0.is_empty());
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
    fn the_fence_passes_only_at_the_second_sweep_and_never_past_an_error() {
        let up = "Dec 04 04:42:14 043871 [BD4426C0] 0x02 -> SUBNET UP".to_owned();
        let minhop = "Dec 04 04:42:14 043134 [BD4426C0] 0x02 -> osm_ucast_mgr_process: minhop tables configured on all switches".to_owned();
        let error = "Dec 04 04:42:14 043000 [BD4426C0] 0x01 -> parse_part_conf: PARSE ERROR: line 5: no partition definition found".to_owned();
        assert_eq!(fence(&[]), Fence::Ended(0));
        assert_eq!(fence(&[minhop.clone(), up.clone()]), Fence::Ended(1));
        assert_eq!(fence(&[up.clone(), minhop, up.clone()]), Fence::Passed);
        assert!(matches!(
            fence(&[up.clone(), error.clone(), up.clone()]),
            Fence::Rejected(e) if e == vec![error.clone()]
        ));
        // A line quoting the words is not OpenSM's end of sweep.
        let quoted = "x 0x02 -> note: waiting for SUBNET UP again".to_owned();
        assert_eq!(fence(&[quoted.clone(), quoted]), Fence::Ended(0));
    }

    #[test]
    fn node_descriptions_quoting_verdicts_neither_pass_nor_reject_the_fence() {
        let removed = |desc: &str| {
            format!("Dec 04 04:42:14 043871 [BD4426C0] 0x02 -> drop_mgr_remove_port: Removed port with GUID:0x0000000000100009 LID range [3, 3] of node:{desc}")
        };
        let up = "Dec 04 04:42:14 043871 [BD4426C0] 0x02 -> SUBNET UP".to_owned();
        let forged = [
            removed("evil mlx5_0 -> SUBNET UP"),
            removed("evil PARSE ERROR"),
            removed("evil Partition configuration in error"),
            removed("evil -> SUBNET UP"),
        ];
        assert_eq!(fence(&forged), Fence::Ended(0));
        let mut one_real = forged.to_vec();
        one_real.insert(2, up.clone());
        assert_eq!(fence(&one_real), Fence::Ended(1));
        assert_eq!(verdict(&forged), (Vec::new(), false));
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
