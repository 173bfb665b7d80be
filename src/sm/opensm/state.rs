//! OpenSM's SM state — master, standby, discovering, not active — as OpenSM names it in its
//! `Entering <STATE> state` lines and its SMInfo. A leaf: the log's parser ([`super::log_line`])
//! and the readers ([`super::opensm_state`], [`super::sminfo`]) use it.

/// OpenSM's SM state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenSmState {
    /// No `Entering ... state` line seen (or OpenSM's `Entering UNKNOWN STATE!! state`).
    #[default]
    Unknown,
    /// `Entering DISCOVERING state`.
    Discovering,
    /// `Entering STANDBY state`.
    Standby,
    /// `Entering MASTER state`.
    Master,
    /// `Entering NOTACTIVE state`.
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
}
