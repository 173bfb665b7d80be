use serde::{Deserialize, Serialize};
use std::fmt;

/// What the subnet manager did with the node's last finished apply. A manager that answered
/// and said no (`Refused`) is up: the operator must read its reason, not look for a network
/// fault; `Unreachable` means no answer at all (connection failed, timed out, reply lost).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SmState {
    /// No apply has finished since the agent started (or an event recorded before the state
    /// was).
    #[default]
    Unknown,
    /// The last apply was acknowledged.
    Reachable,
    /// The subnet manager answered and refused the last apply (the reason says why).
    Refused,
    /// The last apply got no answer.
    Unreachable,
}

impl SmState {
    /// Every state, in wire order.
    pub const ALL: [SmState; 4] = [
        SmState::Unknown,
        SmState::Reachable,
        SmState::Refused,
        SmState::Unreachable,
    ];

    /// The wire and log name, e.g. `REFUSED`.
    pub fn name(self) -> &'static str {
        match self {
            SmState::Unknown => "UNKNOWN",
            SmState::Reachable => "REACHABLE",
            SmState::Refused => "REFUSED",
            SmState::Unreachable => "UNREACHABLE",
        }
    }
}

impl fmt::Display for SmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
