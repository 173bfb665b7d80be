//! Logging: under systemd, records go to the journal natively, every tracing field as a journal
//! field of its own (`instance_id` -> `INSTANCE_ID`, so `journalctl -u fabric-agent
//! INSTANCE_ID=vm-42` works); elsewhere text on stderr, without colours unless stderr is a
//! terminal and `NO_COLOR` is unset. `FABRIC_AGENT_LOG` sets the filter (over the config's `[log] filter`),
//! `FABRIC_AGENT_LOG_JSON=1` (or true/yes/on) forces JSON on stderr.

use std::io::IsTerminal;
use std::path::Path;
use tracing_subscriber::layer::Layered;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// The subscriber the output layer sits on: the registry under the reloadable filter.
type Base = Layered<reload::Layer<EnvFilter, Registry>, Registry>;
use fabric_agent::cli::LogControl;

/// The journal's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// True when stderr is the journal: systemd sets `JOURNAL_STREAM=<dev>:<inode>` for a service
/// whose output it connects to the journal, and stderr is still that stream (not redirected by
/// a caller that inherited the variable), and the journal's socket is there.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok((dev, ino)) = fabric_agent::sys::process::device_and_inode(std::io::stderr()) else {
        return false;
    };
    stream.to_str().is_some_and(|s| names_stream(s, dev, ino)) && Path::new(JOURNAL_SOCKET).exists()
}

/// Whether a `JOURNAL_STREAM` value (`<dev>:<inode>`, decimal) names this device and inode.
fn names_stream(journal_stream: &str, dev: u64, ino: u64) -> bool {
    journal_stream
        .split_once(':')
        .is_some_and(|(d, i)| d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino))
}

/// Whether a boolean environment value means on: `1`, `true`, `yes`, `on` (any case); `0`,
/// `false`, `no`, `off` and the empty string mean off. Anything else is reported and means off.
fn env_flag(name: &str) -> bool {
    let Some(v) = std::env::var_os(name) else {
        return false;
    };
    match parse_flag(&v.to_string_lossy()) {
        Some(on) => on,
        None => {
            eprintln!("warning: {name}={v:?} is not a boolean (1/0, true/false, yes/no, on/off); taken as off");
            false
        }
    }
}

fn parse_flag(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

/// Whether `NO_COLOR` (<https://no-color.org>) asks for no colours: set and not empty.
fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// Installs the global subscriber; `default_level` applies when `FABRIC_AGENT_LOG` is unset
/// (the daemon then applies its config's `[log] filter`, and again on SIGHUP, through the
/// returned control).
pub fn init(default_level: &str) -> LogControl {
    let pinned = std::env::var("FABRIC_AGENT_LOG").ok().and_then(|f| {
        match fabric_agent::config::check_log_filter(&f) {
            Ok(()) => Some(f),
            Err(e) => {
                // Loud: a broken filter silently applied would hide every WARN for the
                // process's whole life.
                eprintln!(
                    "warning: FABRIC_AGENT_LOG ignored: {e}; logging with the config's [log] \
                     filter (default {default_level:?}) instead"
                );
                None
            }
        }
    });
    let filter = pinned
        .as_deref()
        .and_then(|f| EnvFilter::builder().parse(f).ok())
        .unwrap_or_else(|| EnvFilter::new(default_level));
    let (filter, handle) = reload::Layer::new(filter);
    let json = env_flag("FABRIC_AGENT_LOG_JSON");
    let registry = tracing_subscriber::registry().with(filter);
    let journal = if !json && stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(journal) => Some(journal.with_field_prefix(None)),
            Err(e) => {
                eprintln!("warning: cannot log to the journal ({e}); logging to stderr");
                None
            }
        }
    } else {
        None
    };
    let output: Box<dyn Layer<Base> + Send + Sync> = match journal {
        Some(journal) => Box::new(journal),
        None if json => Box::new(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(std::io::stderr),
        ),
        None => Box::new(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal() && !no_color()),
        ),
    };
    registry.with(output).init();
    LogControl::new(
        move |f| {
            let filter = EnvFilter::builder().parse(f)?;
            handle.reload(filter)?;
            Ok(())
        },
        pinned,
    )
}

#[cfg(test)]
mod tests {
    use super::{names_stream, parse_flag};

    #[test]
    fn boolean_environment_values() {
        for on in ["1", "true", "TRUE", "yes", "on"] {
            assert_eq!(parse_flag(on), Some(true), "{on}");
        }
        for off in ["0", "false", "no", "off", ""] {
            assert_eq!(parse_flag(off), Some(false), "{off:?}");
        }
        assert_eq!(parse_flag("2"), None);
    }

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
