//! OpenSM's SM state — master, standby, discovering, not active — and what OpenSM's own log last
//! announced of it. The SM's SMInfo ([`super::sminfo`]) is the first source of the state; the
//! log is the fallback, and the standby write confirmation ([`super::standby`]) reads either.

use std::path::PathBuf;
use std::sync::Mutex;

/// OpenSM's state as its log last announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenSmState {
    /// No `Entering ... state` line seen.
    #[default]
    Unknown,
    /// `Entering DISCOVERING state`.
    Discovering,
    /// `Entering STANDBY state`.
    Standby,
    /// `Entering MASTER state`.
    Master,
    /// `Entering NOT-ACTIVE state` (or another state name).
    NotActive,
}

impl OpenSmState {
    /// Lowercase name for status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            OpenSmState::Unknown => "unknown",
            OpenSmState::Discovering => "discovering",
            OpenSmState::Standby => "standby",
            OpenSmState::Master => "master",
            OpenSmState::NotActive => "not-active",
        }
    }

    /// The state a log line announces, if it is OpenSM's `Entering <STATE> state`.
    pub fn of_line(line: &str) -> Option<OpenSmState> {
        let rest = &line[line.find("Entering ")? + "Entering ".len()..];
        let name = rest.strip_suffix(" state")?;
        Some(match name {
            "MASTER" => OpenSmState::Master,
            "STANDBY" => OpenSmState::Standby,
            "DISCOVERING" => OpenSmState::Discovering,
            _ if name.chars().all(|c| c.is_ascii_uppercase() || c == '-') => OpenSmState::NotActive,
            _ => return None,
        })
    }
}

/// Reads OpenSM's state from its log, incrementally.
#[derive(Debug)]
pub struct LogStateReader {
    log_file: PathBuf,
    seen: Mutex<(u64, OpenSmState)>,
}

impl LogStateReader {
    /// Reads `log_file`.
    pub fn new(log_file: PathBuf) -> LogStateReader {
        LogStateReader {
            log_file,
            seen: Mutex::new((0, OpenSmState::Unknown)),
        }
    }

    /// The last state OpenSM's log announced (a rotated log is read from its start).
    pub fn state(&self) -> OpenSmState {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (lines, end) = super::reload::log_lines_and_end(&self.log_file, seen.0);
        let rotated = end < seen.0;
        if rotated {
            seen.1 = OpenSmState::Unknown;
        }
        if let Some(s) = lines.iter().rev().find_map(|l| OpenSmState::of_line(l)) {
            seen.1 = s;
        }
        seen.0 = end;
        seen.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_from_opensm_lines() {
        let l = |s: &str| format!("Dec 04 12:00:00 000000 [AB] 0x02 -> {s}");
        assert_eq!(
            OpenSmState::of_line(&l("Entering MASTER state")),
            Some(OpenSmState::Master)
        );
        assert_eq!(
            OpenSmState::of_line(&l("Entering STANDBY state")),
            Some(OpenSmState::Standby)
        );
        assert_eq!(
            OpenSmState::of_line(&l("Entering DISCOVERING state")),
            Some(OpenSmState::Discovering)
        );
        assert_eq!(OpenSmState::of_line(&l("SUBNET UP")), None);
        assert_eq!(OpenSmState::of_line(&l("Entering the fray state")), None);
    }
}
