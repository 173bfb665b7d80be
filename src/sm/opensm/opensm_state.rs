//! What OpenSM's own log last announced of its SM state ([`super::state`]). The SM's SMInfo
//! ([`super::sminfo`]) is the first source of the state; the log is the fallback, and the standby
//! write confirmation ([`super::standby`]) reads either.

use std::path::PathBuf;
use std::sync::Mutex;

pub use super::state::OpenSmState;

impl OpenSmState {
    /// The state a log line announces, if it is OpenSM's own `Entering <STATE> state` line:
    /// OpenSM's prefix, level `0x80` and exactly that message ([`super::log_line`]), never a
    /// line that merely carries the words (a NodeDescription in a line about that node).
    pub fn of_line(line: &str) -> Option<OpenSmState> {
        match super::log_line::Verdict::of_line(line)? {
            super::log_line::Verdict::Entered(s) => Some(s),
            _ => None,
        }
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
        if let Some(s) = super::log_line::verdicts(&lines).state {
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
        let l = |s: &str| format!("Dec 04 12:00:00 000000 [AB12] 0x80 -> {s}");
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
        // A NodeDescription carrying the words, in the line OpenSM logs when its port goes.
        let removed = "Dec 04 12:00:00 000000 [AB12] 0x02 -> drop_mgr_remove_port: Removed port with GUID:0x0000000000100009 LID range [3, 3] of node:Entering STANDBY state";
        assert_eq!(OpenSmState::of_line(removed), None);
    }

    #[test]
    fn the_log_reader_keeps_the_last_state_opensm_announced() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("opensm.log");
        let master = "Dec 04 12:00:00 000000 [AB12] 0x80 -> Entering MASTER state\n";
        let forged = "Dec 04 12:00:01 000000 [AB12] 0x02 -> drop_mgr_remove_port: Removed port with GUID:0x0000000000100009 LID range [3, 3] of node:Entering STANDBY state\n";
        std::fs::write(&log, format!("{master}{forged}")).unwrap();
        let reader = LogStateReader::new(log.clone());
        assert_eq!(reader.state(), OpenSmState::Master);
        std::fs::write(&log, format!("{master}{forged}{forged}")).unwrap();
        assert_eq!(reader.state(), OpenSmState::Master);
    }
}
