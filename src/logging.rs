//! Logging: under systemd, records go to the journal natively, every tracing field as a journal
//! field of its own (`instance_id` -> `INSTANCE_ID`, so `journalctl -u fabric-agent
//! INSTANCE_ID=vm-42` works); elsewhere text on stderr, without colours unless stderr is a
//! terminal. `FABRIC_AGENT_LOG` sets the filter, `FABRIC_AGENT_LOG_JSON=1` forces JSON on stderr.

use std::io::IsTerminal;
use std::path::Path;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// The journal's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// True when stderr is the journal: systemd sets `JOURNAL_STREAM=<dev>:<inode>` for a service
/// whose output it connects to the journal, and stderr is still that stream (not redirected by
/// a caller that inherited the variable), and the journal's socket is there.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(std::io::stderr()) else {
        return false;
    };
    stream
        .to_str()
        .is_some_and(|s| names_stream(s, stat.st_dev, stat.st_ino))
        && Path::new(JOURNAL_SOCKET).exists()
}

/// Whether a `JOURNAL_STREAM` value (`<dev>:<inode>`, decimal) names this device and inode.
fn names_stream(journal_stream: &str, dev: u64, ino: u64) -> bool {
    journal_stream
        .split_once(':')
        .is_some_and(|(d, i)| d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino))
}

/// Installs the global subscriber; `default_level` applies when `FABRIC_AGENT_LOG` is unset.
pub fn init(default_level: &str) {
    let filter = EnvFilter::try_from_env("FABRIC_AGENT_LOG")
        .unwrap_or_else(|_| EnvFilter::new(default_level));
    let json = std::env::var_os("FABRIC_AGENT_LOG_JSON").is_some();
    if !json && stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(journal) => {
                tracing_subscriber::registry()
                    .with(filter)
                    .with(journal.with_field_prefix(None))
                    .init();
                return;
            }
            Err(e) => eprintln!("warning: cannot log to the journal ({e}); logging to stderr"),
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::names_stream;

    #[test]
    fn journal_stream_must_name_stderrs_device_and_inode() {
        assert!(names_stream("27:123456", 27, 123456));
        assert!(!names_stream("27:123457", 27, 123456));
        assert!(!names_stream("28:123456", 27, 123456));
        assert!(!names_stream("27", 27, 123456));
        assert!(!names_stream("x:y", 27, 123456));
        assert!(!names_stream("", 0, 0));
    }
}
