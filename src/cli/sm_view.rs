//! The subnet manager's state in words, one wording for `node`, `doctor` and `events`: a
//! manager that answered and refused is REFUSED (it is up; read its reason), one that did not
//! answer is UNREACHABLE (look at the network), and an apply waiting for its answer is shown
//! with since when and to which backend.

use super::verdict::Verdict;
use crate::proto::agent as pb;

/// An apply in flight this long makes `doctor` warn (a normal apply takes milliseconds).
const SLOW_APPLY_SECS: u64 = 1;

/// The state's name: `REACHABLE`, `REFUSED`, `UNREACHABLE`, or `UNKNOWN` (no apply finished
/// yet, or an agent too old to say).
pub fn state_name(state: i32) -> &'static str {
    match pb::SubnetManagerState::try_from(state) {
        Ok(pb::SubnetManagerState::Reachable) => "REACHABLE",
        Ok(pb::SubnetManagerState::Refused) => "REFUSED",
        Ok(pb::SubnetManagerState::Unreachable) => "UNREACHABLE",
        _ => "UNKNOWN",
    }
}

/// The last finished apply in words, and how `doctor` judges it.
pub fn summary(sm: &pb::SubnetManagerStatus) -> (Verdict, String) {
    match pb::SubnetManagerState::try_from(sm.state) {
        Ok(pb::SubnetManagerState::Reachable) => {
            (Verdict::Ok, "REACHABLE: last apply acknowledged".into())
        }
        Ok(pb::SubnetManagerState::Refused) => (
            Verdict::Fail,
            format!("REFUSED (it answered and said no): {}", sm.last_error),
        ),
        Ok(pb::SubnetManagerState::Unreachable) => (
            Verdict::Fail,
            format!("UNREACHABLE (no answer): {}", sm.last_error),
        ),
        _ if sm.reachable => (Verdict::Ok, "last apply acknowledged".into()),
        _ if sm.applies == 0 || sm.last_error.is_empty() => {
            (Verdict::Warn, "no apply finished yet".into())
        }
        _ => (
            Verdict::Fail,
            format!("last apply failed: {}", sm.last_error),
        ),
    }
}

/// The apply waiting for the subnet manager's answer, in words (None when none is), and how
/// `doctor` judges it.
pub fn in_flight(sm: &pb::SubnetManagerStatus) -> Option<(Verdict, String)> {
    let since = sm.apply_in_flight_since.as_ref()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let age = now.saturating_sub(u64::try_from(since.seconds).unwrap_or(0));
    let verdict = if age >= SLOW_APPLY_SECS {
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    Some((
        verdict,
        format!(
            "generation {} sent to {} at {} ({age}s ago), waiting for its answer",
            sm.apply_in_flight_generation,
            sm.backend.to_lowercase(),
            super::timestamp::time(&sm.apply_in_flight_since),
        ),
    ))
}

/// Why keys are in doubt, in the words of the state that left them so.
pub fn in_doubt_cause(sm: &pb::SubnetManagerStatus) -> &'static str {
    if sm.apply_in_flight_since.is_some() {
        return "an apply carrying them is in flight";
    }
    match pb::SubnetManagerState::try_from(sm.state) {
        Ok(pb::SubnetManagerState::Refused) => {
            "the subnet manager refused an apply carrying them (a refusal may still have taken effect)"
        }
        Ok(pb::SubnetManagerState::Unreachable) => "an apply carrying them got no answer",
        _ => "an apply carrying them got no positive answer",
    }
}

/// An event's subnet-manager state in words (`reachable` speaks for events recorded before the
/// state was).
pub fn event_state(state: i32, reachable: bool) -> &'static str {
    match (state_name(state), reachable) {
        ("REACHABLE", _) | (_, true) => "REACHABLE (apply acknowledged)",
        ("REFUSED", _) => "REFUSED (it answered and said no)",
        ("UNREACHABLE", _) => "UNREACHABLE (no answer)",
        _ => "apply failed",
    }
}
