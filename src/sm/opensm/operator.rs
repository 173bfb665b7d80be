//! Operator edits through the agent. With `operator_file` set, the operator edits their own file
//! and the agent alone composes and writes the live `partitions.conf`: the operator's part
//! (validated with the strict parser first) followed by the agent's region. A part OpenSM would
//! reject never reaches the live file: it is refused with its line and reason, and the previous
//! live file is kept. `fabric-agent opensm apply` installs the operator's part now (validate,
//! compose with the live region, write atomically, sweep, confirm by the sweep fence).
//!
//! Every write of the live file, the daemon's and `apply`'s, holds an advisory lock
//! (`flock` on `.<name>.fabric-agent.lock` beside it); an operator editing the live file in
//! place can take the same lock (`flock <lock> $EDITOR <file>`) so the agent never writes
//! between their read and their write.

use super::file::{read_or_empty, replace_atomically};
use super::model::PartitionsConf;
use super::parse::parse;
use super::region::{compose, split_region, OperatorParts, RegionError};
use super::reload::{OpenSmReloader, ReloadError, Reloader};
use super::repair::describe;
use super::OpenSmConfig;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Where the advisory lock of the live file lives: beside it, hidden.
pub fn lock_path(partitions_file: &Path) -> PathBuf {
    let name = partitions_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "partitions.conf".into());
    partitions_file.with_file_name(format!(".{name}.fabric-agent.lock"))
}

/// Holds the live file's advisory lock until dropped.
pub struct LiveFileLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

/// Takes the live file's advisory lock, waiting for a holder (blocking: call it on a blocking
/// thread).
pub fn lock_live_file(partitions_file: &Path) -> std::io::Result<LiveFileLock> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path(partitions_file))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map(LiveFileLock)
        .map_err(|(_, errno)| std::io::Error::from(errno))
}

/// Why an operator's file is refused.
#[derive(Debug, Error)]
pub enum OperatorFileError {
    /// It could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// OpenSM would reject it (or it holds the agent's markers): its line and reason.
    #[error("{}: refused: {problem}; {quoted}", path.display())]
    Refused {
        /// The file.
        path: PathBuf,
        /// The region check's verdict.
        problem: RegionError,
        /// The strict parser's line and reason, the line quoted.
        quoted: String,
    },
}

/// Reads and validates the operator's file as the part before the agent's region: the strict
/// parser must load it (a part without entries is fine: the region completes it), it must not
/// end inside an entry, and it must not hold the agent's markers.
pub fn load_operator_file(
    path: &Path,
) -> Result<(OperatorParts, PartitionsConf), OperatorFileError> {
    let bytes = std::fs::read(path).map_err(|source| OperatorFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let refused = |problem| OperatorFileError::Refused {
        path: path.to_owned(),
        problem,
        quoted: describe(&bytes),
    };
    let split = split_region(&bytes).map_err(refused)?;
    if !split.after.is_empty() || split.before.len() != bytes.len() {
        return Err(refused(RegionError::OperatorFile(
            super::region::OperatorFileProblem::Markers { begins: 1, ends: 1 },
        )));
    }
    let parts = OperatorParts {
        before: bytes.clone(),
        after: Vec::new(),
    };
    let conf = parts.parse().map_err(refused)?;
    Ok((parts, conf))
}

/// What `opensm apply` did.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Bytes written to the live file.
    pub bytes: usize,
    /// Whether the live file already held exactly this (then it was still re-confirmed).
    pub unchanged: bool,
}

/// Why `opensm apply` did not install the operator's part.
#[derive(Debug, Error)]
pub enum ApplyError {
    /// `operator_file` is not configured.
    #[error("subnet_manager.opensm.operator_file is not set: the operator's part lives in the live file ({}); edit it in place under the lock", .0.display())]
    NotConfigured(PathBuf),
    /// The operator's file is refused: nothing was written.
    #[error("{0}; nothing was written, the live file is unchanged")]
    Operator(#[from] OperatorFileError),
    /// The live file's region cannot be found, or the composed file would not load.
    #[error("the live file {}: {problem}; nothing was written", path.display())]
    Live {
        /// The live file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Reading, locking or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// OpenSM could not be made to re-read the file, or was not seen doing so.
    #[error("written, but {0}")]
    Unconfirmed(String),
    /// OpenSM rejected the file: the previous live file was put back.
    #[error("OpenSM rejected the composed file ({lines}); the previous live file was put back{restored}")]
    Rejected {
        /// OpenSM's lines.
        lines: String,
        /// What putting it back achieved.
        restored: String,
    },
}

/// Installs the operator's file now: validate, compose with the live file's region, write
/// atomically under the lock, force the sweeps and confirm by the sweep fence.
pub async fn apply(config: &OpenSmConfig) -> Result<Applied, ApplyError> {
    let op = config
        .operator_file
        .clone()
        .ok_or_else(|| ApplyError::NotConfigured(config.partitions_file.clone()))?;
    let (parts, _) = load_operator_file(&op)?;
    let live = config.partitions_file.clone();
    let lock_of = live.clone();
    let _lock = tokio::task::spawn_blocking(move || lock_live_file(&lock_of))
        .await
        .map_err(|e| ApplyError::Io(std::io::Error::other(e)))??;
    let current = read_or_empty(&live)?;
    let live_parts = split_region(&current).map_err(|e| ApplyError::Live {
        path: live.clone(),
        problem: e.to_string(),
    })?;
    let region_len = current.len() - live_parts.before.len() - live_parts.after.len();
    let region = std::str::from_utf8(&current[live_parts.before.len()..][..region_len])
        .map_err(|e| ApplyError::Live {
            path: live.clone(),
            problem: format!("the agent's region is not UTF-8: {e}"),
        })?
        .to_owned();
    let bytes = compose(&parts, &region);
    if let Err(e) = parse(&bytes) {
        return Err(ApplyError::Live {
            path: live.clone(),
            problem: format!("the composed file would not load: {e}"),
        });
    }
    let unchanged = bytes == current;
    replace_atomically(&live, &bytes)?;
    let reloader = OpenSmReloader::new(config);
    let mark = reloader.checkpoint();
    match reloader.reload(mark).await {
        Ok(r) if r.file_read => {
            let copy = super::file::accepted_copy_path(&live);
            replace_atomically(&copy, &bytes)?;
            Ok(Applied {
                bytes: bytes.len(),
                unchanged,
            })
        }
        Ok(_) => Err(ApplyError::Unconfirmed(format!(
            "OpenSM was not seen re-reading it within {} ms",
            config.reload_check_ms
        ))),
        Err(ReloadError::Unreachable(e)) => Err(ApplyError::Unconfirmed(e.to_string())),
        Err(ReloadError::Rejected(lines)) => {
            replace_atomically(&live, &current)?;
            let mark = reloader.checkpoint();
            let restored = match reloader.reload(mark).await {
                Ok(r) if r.file_read => String::new(),
                Ok(_) => " (OpenSM not yet seen re-reading it)".into(),
                Err(e) => format!(" ({e})"),
            };
            Err(ApplyError::Rejected { lines, restored })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_file_is_validated_as_a_part() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("partitions.operator.conf");
        std::fs::write(&p, "# only comments: the region completes it\n").unwrap();
        assert!(load_operator_file(&p).is_ok());
        std::fs::write(
            &p,
            "Default=0x7fff : ALL=limited, SELF=full ;\nx=0x2 : 0xzz ;\n",
        )
        .unwrap();
        let e = load_operator_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("\"x=0x2 : 0xzz ;\""),
            "{e}"
        );
        std::fs::write(&p, "Default=0x7fff : ALL=limited,\n").unwrap();
        assert!(load_operator_file(&p).is_err());
        let marked = format!(
            "{}\n{}\n",
            super::super::region::BEGIN_MARKER,
            super::super::region::END_MARKER
        );
        std::fs::write(&p, marked).unwrap();
        assert!(load_operator_file(&p).is_err());
        assert!(load_operator_file(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn the_lock_excludes_a_second_holder() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("partitions.conf");
        let held = lock_live_file(&live).unwrap();
        let file = File::options().write(true).open(lock_path(&live)).unwrap();
        let second = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock);
        assert!(second.is_err());
        drop(held);
        assert!(lock_live_file(&live).is_ok());
    }
}
