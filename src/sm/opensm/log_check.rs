//! Knowing OpenSM's log: the agent's confirmations and rejection repairs read only OpenSM's log,
//! so the `log_file` it reads must be the one OpenSM writes. Checked at start (`serve` refuses
//! with exit 64 and the reason), by `check-config` and by `doctor`:
//!
//! - OpenSM's own configuration — `opensm_conf`, or the `-F`/`--config` file on the running
//!   OpenSM's command line — must name the same `log_file` and `partition_config_file` (its
//!   `-f`/`--log_file` and `-P`/`--Pconfig` options too), and set `force_log_flush TRUE` (OpenSM
//!   otherwise buffers its `SUBNET UP` lines and a confirmation would wait for a full buffer),
//!   and set no `log_prefix` (OpenSM would write it before every message, and none of its lines
//!   would have the shape the agent trusts, [`super::log_line`]); `log_flags` with DEBUG is
//!   reported (OpenSM then logs ServiceRecord names raw);
//! - the running OpenSM (pid from `pid_file`/`pid`, named `process_name`) must hold `log_file`
//!   open: same device and inode through `/proc/PID/fd`, so a symlink or a second path to the
//!   same file still matches and a rotated-away file does not.
//!
//! What cannot be seen (OpenSM not running yet, `/proc/PID/fd` hidden from the agent's user) is
//! reported as not verified, never as a pass.

use super::OpenSmConfig;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// OpenSM's defaults (3.3) for the keys read here.
const DEFAULT_LOG_FILE: &str = "/var/log/opensm.log";
const DEFAULT_PARTITIONS: &str = "/etc/opensm/partitions.conf";
/// OpenSM's DEBUG log flag.
const DEBUG_FLAG: u8 = 0x08;

/// Why the configured log (or partitions file) is not OpenSM's.
#[derive(Debug, Error)]
pub enum LogCheckError {
    /// OpenSM's configuration file could not be read.
    #[error("cannot read OpenSM's configuration {}: {source}", path.display())]
    ConfRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// OpenSM's configuration (or command line) names another file than the agent's setting.
    #[error("{origin} sets {key} {theirs}, but the agent's {setting} is {ours}: the agent would watch a file OpenSM does not use")]
    Mismatch {
        /// Where OpenSM's value comes from ("/etc/opensm/opensm.conf", "OpenSM's command line").
        origin: String,
        /// OpenSM's key.
        key: &'static str,
        /// OpenSM's value.
        theirs: String,
        /// The agent's setting's name.
        setting: &'static str,
        /// The agent's value.
        ours: String,
    },
    /// OpenSM buffers its log.
    #[error("{origin} does not set force_log_flush TRUE: OpenSM buffers its log lines, so its SUBNET UP and PARSE ERROR lines reach the log late; set force_log_flush TRUE")]
    NoFlush {
        /// Where OpenSM's configuration comes from.
        origin: String,
    },
    /// OpenSM puts a prefix before every message: none of its lines has the shape the agent
    /// trusts (see [`super::log_line`]), so no write would ever be confirmed.
    #[error("{origin} sets log_prefix {prefix:?}: OpenSM then writes it before every message and the agent cannot recognise OpenSM's SUBNET UP and PARSE ERROR lines; remove log_prefix")]
    LogPrefix {
        /// Where OpenSM's configuration comes from.
        origin: String,
        /// The prefix.
        prefix: String,
    },
    /// The running OpenSM does not hold the agent's `log_file` open.
    #[error("OpenSM (pid {pid}) does not have {} open, so it does not log there{}", log.display(), describe_open(.open))]
    NotOpen {
        /// OpenSM's pid.
        pid: i32,
        /// The agent's `log_file`.
        log: PathBuf,
        /// The regular files OpenSM holds open (its real log among them).
        open: Vec<PathBuf>,
    },
}

fn describe_open(open: &[PathBuf]) -> String {
    if open.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = open
        .iter()
        .take(6)
        .map(|p| p.display().to_string())
        .collect();
    format!("; the files it has open: {}", shown.join(", "))
}

/// What was verified, and what could not be seen.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogCheck {
    /// Checks that passed, one line each.
    pub verified: Vec<String>,
    /// What could not be checked, and why.
    pub unverified: Vec<String>,
}

impl LogCheck {
    /// One line for humans.
    pub fn summary(&self) -> String {
        let mut parts = self.verified.clone();
        parts.extend(self.unverified.iter().map(|u| format!("not verified: {u}")));
        parts.join("; ")
    }
}

/// Checks that `config.log_file` is OpenSM's log (see the module docs).
pub fn verify(config: &OpenSmConfig) -> Result<LogCheck, LogCheckError> {
    let mut out = LogCheck::default();
    let pid = running_opensm(config, &mut out);
    let cmdline = pid.and_then(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok());
    let args: Vec<String> = cmdline
        .map(|c| {
            c.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    // Order: the configured opensm.conf, OpenSM's open files, then what its command line names.
    if let Some(path) = &config.opensm_conf {
        check_conf(config, path, &mut out)?;
    }
    if let Some(pid) = pid {
        match open_files(pid) {
            Ok(open) => {
                let ours = std::fs::metadata(&config.log_file)
                    .ok()
                    .map(|m| (m.dev(), m.ino()));
                let holds = ours.is_some_and(|id| open.iter().any(|(_, other)| *other == id));
                if !holds {
                    return Err(LogCheckError::NotOpen {
                        pid,
                        log: config.log_file.clone(),
                        open: open.into_iter().map(|(p, _)| p).collect(),
                    });
                }
                out.verified.push(format!(
                    "OpenSM (pid {pid}) has {} open",
                    config.log_file.display()
                ));
            }
            Err(e) => out.unverified.push(format!(
                "OpenSM's open files (/proc/{pid}/fd: {e}); see docs/OPENSM.md on ProtectProc"
            )),
        }
    }
    match option_value(&args, "-F", "--config").map(PathBuf::from) {
        Some(path) if config.opensm_conf.as_ref() != Some(&path) => {
            check_conf(config, &path, &mut out)?
        }
        Some(_) => {}
        None if config.opensm_conf.is_none() => out.unverified.push(
            "OpenSM's configuration (set opensm_conf, or run OpenSM with -F) was not read".into(),
        ),
        None => {}
    }
    let origin = "OpenSM's command line".to_owned();
    if let Some(log) = option_value(&args, "-f", "--log_file") {
        same_file(&origin, "-f", &log, "log_file", &config.log_file)?;
    }
    if let Some(parts) = option_value(&args, "-P", "--Pconfig") {
        same_file(
            &origin,
            "-P",
            &parts,
            "partitions_file",
            &config.partitions_file,
        )?;
    }
    Ok(out)
}

/// OpenSM's configuration at `path` names the agent's files and flushes its log.
fn check_conf(config: &OpenSmConfig, path: &Path, out: &mut LogCheck) -> Result<(), LogCheckError> {
    let text = std::fs::read_to_string(path).map_err(|source| LogCheckError::ConfRead {
        path: path.to_owned(),
        source,
    })?;
    let keys = conf_keys(&text);
    let origin = path.display().to_string();
    let log = keys
        .get("log_file")
        .cloned()
        .unwrap_or_else(|| DEFAULT_LOG_FILE.into());
    same_file(&origin, "log_file", &log, "log_file", &config.log_file)?;
    let parts = keys
        .get("partition_config_file")
        .cloned()
        .unwrap_or_else(|| DEFAULT_PARTITIONS.into());
    same_file(
        &origin,
        "partition_config_file",
        &parts,
        "partitions_file",
        &config.partitions_file,
    )?;
    if !keys
        .get("force_log_flush")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Err(LogCheckError::NoFlush { origin });
    }
    if let Some(prefix) = keys
        .get("log_prefix")
        .filter(|p| !p.is_empty() && p.as_str() != "(null)")
    {
        return Err(LogCheckError::LogPrefix {
            origin,
            prefix: prefix.clone(),
        });
    }
    let flags = keys.get("log_flags").and_then(|v| {
        let v = v.trim();
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u8::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    });
    if flags.is_some_and(|f| f & DEBUG_FLAG != 0) {
        out.unverified.push(format!(
            "{origin} sets log_flags with DEBUG (0x08): OpenSM then logs ServiceRecord names, which any host sets, without cleaning them; a name holding a newline could forge a line the agent reads (see docs/OPENSM.md); keep log_flags at 0x03"
        ));
    }
    out.verified.push(format!(
        "{origin} names the same log_file and partition_config_file and flushes its log"
    ));
    Ok(())
}

/// OpenSM's pid when it runs under `process_name`; notes why not otherwise.
fn running_opensm(config: &OpenSmConfig, out: &mut LogCheck) -> Option<i32> {
    let pid = match (&config.pid_file, config.pid) {
        (Some(path), _) => match std::fs::read_to_string(path) {
            Ok(t) => t.trim().parse::<i32>().ok().filter(|p| *p > 1),
            Err(e) => {
                out.unverified.push(format!(
                    "OpenSM's open files: pid file {}: {e} (is OpenSM running?)",
                    path.display()
                ));
                return None;
            }
        },
        (None, pid) => pid,
    };
    let Some(pid) = pid else {
        out.unverified
            .push("OpenSM's open files: no pid (pid_file or pid) to look at".into());
        return None;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) if comm.trim_end() == config.process_name => Some(pid),
        Ok(comm) => {
            out.unverified.push(format!(
                "OpenSM's open files: pid {pid} runs {:?}, not {:?}",
                comm.trim_end(),
                config.process_name
            ));
            None
        }
        Err(e) => {
            out.unverified.push(format!(
                "OpenSM's open files: pid {pid}: {e} (is OpenSM running?)"
            ));
            None
        }
    }
}

/// The regular files `pid` holds open, with their device and inode.
fn open_files(pid: i32) -> std::io::Result<Vec<(PathBuf, (u64, u64))>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let target = std::fs::read_link(entry.path()).unwrap_or_else(|_| entry.path());
        out.push((target, (meta.dev(), meta.ino())));
    }
    Ok(out)
}

/// `key value` lines of an `opensm.conf` (`#` comments), last one wins as in OpenSM.
pub fn conf_keys(text: &str) -> BTreeMap<String, String> {
    let mut keys = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut it = line.splitn(2, char::is_whitespace);
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        keys.insert(k.to_owned(), v.trim().to_owned());
    }
    keys
}

/// The value of `short VALUE`, `long VALUE` or `long=VALUE` in `args` (the last one wins).
fn option_value(args: &[String], short: &str, long: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == short || a == long {
            found = it.next().cloned();
        } else if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            found = Some(v.to_owned());
        }
    }
    found
}

/// Whether OpenSM's `theirs` and the agent's `ours` name one file: the same device and inode
/// when both exist, else the same path.
fn same_file(
    origin: &str,
    key: &'static str,
    theirs: &str,
    setting: &'static str,
    ours: &Path,
) -> Result<(), LogCheckError> {
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let same = match (id(Path::new(theirs)), id(ours)) {
        (Some(a), Some(b)) => a == b,
        _ => Path::new(theirs) == ours,
    };
    if same {
        Ok(())
    } else {
        Err(LogCheckError::Mismatch {
            origin: origin.to_owned(),
            key,
            theirs: theirs.to_owned(),
            setting,
            ours: ours.display().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> OpenSmConfig {
        OpenSmConfig {
            partitions_file: dir.join("partitions.conf"),
            log_file: dir.join("opensm.log"),
            opensm_conf: Some(dir.join("opensm.conf")),
            pid: None,
            ..OpenSmConfig::default()
        }
    }

    #[test]
    fn opensm_conf_must_name_the_same_files_and_flush() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("opensm.log"), "").unwrap();
        std::fs::write(d.join("partitions.conf"), "").unwrap();
        let good = format!(
            "# comment\npartition_config_file {}\nlog_file {}\nforce_log_flush TRUE\n",
            d.join("partitions.conf").display(),
            d.join("opensm.log").display()
        );
        std::fs::write(d.join("opensm.conf"), &good).unwrap();
        let ok = verify(&config(d)).unwrap();
        assert_eq!(ok.verified.len(), 1, "{ok:?}");
        assert!(ok.summary().contains("not verified"), "{ok:?}");

        let other = good.replace("opensm.log", "other.log");
        std::fs::write(d.join("opensm.conf"), other).unwrap();
        let e = verify(&config(d)).unwrap_err();
        assert!(
            matches!(
                e,
                LogCheckError::Mismatch {
                    key: "log_file",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("other.log"), "{e}");

        let parts = good.replace("partitions.conf", "elsewhere.conf");
        std::fs::write(d.join("opensm.conf"), parts).unwrap();
        let e = verify(&config(d)).unwrap_err();
        assert!(
            matches!(
                e,
                LogCheckError::Mismatch {
                    key: "partition_config_file",
                    ..
                }
            ),
            "{e}"
        );

        std::fs::write(d.join("opensm.conf"), format!("{good}log_prefix osm1\n")).unwrap();
        let e = verify(&config(d)).unwrap_err();
        assert!(matches!(e, LogCheckError::LogPrefix { .. }), "{e}");
        assert!(e.to_string().contains("remove log_prefix"), "{e}");
        std::fs::write(d.join("opensm.conf"), format!("{good}log_prefix (null)\n")).unwrap();
        assert!(verify(&config(d)).is_ok());
        std::fs::write(d.join("opensm.conf"), format!("{good}log_flags 0x0b\n")).unwrap();
        let debug = verify(&config(d)).unwrap();
        assert!(
            debug.summary().contains("log_flags with DEBUG"),
            "{debug:?}"
        );
        std::fs::write(d.join("opensm.conf"), format!("{good}log_flags 0x03\n")).unwrap();
        assert!(!verify(&config(d)).unwrap().summary().contains("DEBUG"));
        std::fs::write(d.join("opensm.conf"), good.replace("TRUE", "FALSE")).unwrap();
        assert!(matches!(
            verify(&config(d)).unwrap_err(),
            LogCheckError::NoFlush { .. }
        ));
        // OpenSM's default log_file applies when the conf has none.
        std::fs::write(d.join("opensm.conf"), "force_log_flush TRUE\n").unwrap();
        assert!(verify(&config(d))
            .unwrap_err()
            .to_string()
            .contains("/var/log/opensm.log"));
        std::fs::remove_file(d.join("opensm.conf")).unwrap();
        assert!(matches!(
            verify(&config(d)).unwrap_err(),
            LogCheckError::ConfRead { .. }
        ));
    }

    #[test]
    fn a_running_process_must_hold_the_log_open() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = d.join("held.log");
        let held = std::fs::File::create(&log).unwrap();
        std::fs::write(d.join("other.log"), "").unwrap();
        let me = std::process::id() as i32;
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let config = |log: PathBuf| OpenSmConfig {
            log_file: log,
            pid: Some(me),
            process_name: comm.trim_end().to_owned(),
            opensm_conf: None,
            ..OpenSmConfig::default()
        };
        let ok = verify(&config(log.clone())).unwrap();
        assert!(ok.summary().contains("has"), "{ok:?}");
        let e = verify(&config(d.join("other.log"))).unwrap_err();
        assert!(matches!(e, LogCheckError::NotOpen { .. }), "{e}");
        assert!(e.to_string().contains("held.log"), "{e}");
        drop(held);
    }

    #[test]
    fn options_are_read_in_every_spelling() {
        let args: Vec<String> = ["opensm", "-F", "/a.conf", "--log_file=/x.log", "-P", "/p"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(
            option_value(&args, "-F", "--config").as_deref(),
            Some("/a.conf")
        );
        assert_eq!(
            option_value(&args, "-f", "--log_file").as_deref(),
            Some("/x.log")
        );
        assert_eq!(
            option_value(&args, "-P", "--Pconfig").as_deref(),
            Some("/p")
        );
        assert_eq!(option_value(&args, "-B", "--daemon"), None);
    }
}
