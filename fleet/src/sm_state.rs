//! What a node's subnet manager did with the node's last finished apply, as the fleet shows it:
//! acknowledged, refused (the manager is up and said no) or unreachable (no answer). Read from
//! `SubnetManagerStatus.state` / `SubnetManagerChanged.state`; an agent too old to send the
//! state (UNSPECIFIED) is read from its `reachable` flag, which cannot tell a refusal from no
//! answer, so a false one is shown as unknown rather than guessed.

use crate::proto::agent::SubnetManagerState;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's subnet-manager state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SmState {
    /// Not known: no status heard yet, no apply finished since the agent started, or an agent
    /// too old to tell a refusal from no answer said "not reachable".
    #[default]
    Unknown,
    /// The last apply was acknowledged.
    Reachable,
    /// The subnet manager answered and refused the last apply: it is up and said no.
    Refused,
    /// The last apply got no answer (no connection, timed out, the reply was lost).
    Unreachable,
}

impl SmState {
    /// The state an agent reported: `state` (the proto enum's number) when it names one, else
    /// the compatibility flag `reachable`.
    pub fn from_report(state: i32, reachable: bool) -> SmState {
        match SubnetManagerState::try_from(state) {
            Ok(SubnetManagerState::Reachable) => SmState::Reachable,
            Ok(SubnetManagerState::Refused) => SmState::Refused,
            Ok(SubnetManagerState::Unreachable) => SmState::Unreachable,
            Ok(SubnetManagerState::Unspecified) | Err(_) if reachable => SmState::Reachable,
            Ok(SubnetManagerState::Unspecified) | Err(_) => SmState::Unknown,
        }
    }

    /// The upper-case name (`REACHABLE`, `REFUSED`, `UNREACHABLE`, `UNKNOWN`).
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

#[cfg(test)]
mod tests {
    use super::SmState;
    use crate::proto::agent::SubnetManagerState as S;

    #[test]
    fn the_state_wins_and_an_old_agent_is_read_from_its_flag() {
        let cases = [
            (S::Reachable as i32, true, SmState::Reachable),
            (S::Refused as i32, false, SmState::Refused),
            (S::Unreachable as i32, false, SmState::Unreachable),
            // An old agent (no state): its flag, and "not reachable" is not guessed at.
            (S::Unspecified as i32, true, SmState::Reachable),
            (S::Unspecified as i32, false, SmState::Unknown),
            // A state newer than this client: the flag.
            (99, true, SmState::Reachable),
            (99, false, SmState::Unknown),
        ];
        for (state, reachable, want) in cases {
            assert_eq!(
                SmState::from_report(state, reachable),
                want,
                "{state} {reachable}"
            );
        }
        assert_eq!(SmState::Refused.to_string(), "REFUSED");
        assert_eq!(
            serde_json::to_string(&SmState::Unreachable).unwrap(),
            "\"UNREACHABLE\""
        );
    }
}
