//! A test-only switch that turns ONE truth rule off, to prove that the chaos campaign's checker
//! catches a broken rule (`tests/chaos`: `a_switched_off_truth_rule_fails_the_smoke`). It is
//! not a feature: nothing in a running fleet sets it, and a release build has no switch at all.
//!
//! - Read once, from the environment variable [`ENV`] (`FABRIC_AGENT_TEST_MUTATION=<name>`),
//!   and only in debug builds (`cfg(debug_assertions)`): in a release build [`active`] is the
//!   constant `false` and [`announce`] only says that the variable is ignored.
//! - Unset (the default), or set to a name that is not a [`Mutation`], nothing changes: every
//!   rule is decided as without this module (an unknown name is logged as an error and ignored).
//! - Set, the daemon says so at start ([`announce`], a WARN naming the switched-off rule).
//!
//! The one call site per mutation is named on its variant. The chaos campaign catches
//! [`Mutation::LogKeepsEpoch`] (`event-stream-gap`); it did not catch
//! [`Mutation::ReleasedWithoutPortRead`] in 150 s (the SM hosts' acknowledgement already
//! follows the sweep that programs the ports there), which is kept to reproduce that finding
//! (`CHAOS_MUTATION`, tests/chaos).

/// The environment variable that names the mutation.
pub const ENV: &str = "FABRIC_AGENT_TEST_MUTATION";

/// A truth rule switched off on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// `released-without-port-read`: RELEASING becomes RELEASED as soon as the subnet manager
    /// acknowledged a set without the key (truth rule RELEASED (1)), without (2), a port read
    /// started after that acknowledgement in which no covered port holds the key. Decided in
    /// `plan::step` (`src/agent/plan.rs`).
    ReleasedWithoutPortRead,
    /// `log-keeps-epoch`: a log that may have gone back in time keeps its epoch and continues
    /// from its newest seq, so a state directory put back hands out (epoch, seq) pairs the
    /// control plane already received, with other events. The rule ("no (epoch, seq) names two
    /// events": TRUTH-RULES.md, Clean stops and new epochs; Store rollbacks) has two triggers,
    /// both switched off: a start without the clean-stop marker (`Store::begin_life`,
    /// `src/store/life.rs`) and a rollback the start check found (`Batch::restart_log` in
    /// `Store::commit`, `src/store/mod.rs`; the live attachments are still marked restored). A
    /// rollback the mirror shows at open still starts its new epoch.
    LogKeepsEpoch,
    /// `ufm-watch-not-rearmed`: a UFM backend that loads its ledger keeps the stored unix-ms
    /// deadlines of its late-write watches and compares them with a fresh reading of the wall
    /// clock, so a wall-clock step across an agent restart ends a watch early (forward) or
    /// stretches it (back) (TRUTH-RULES.md, the late-write window across restarts). Decided in
    /// `UfmSm::rearm` (`src/sm/ufm/ledger_io.rs`); the deterministic simulation's clock steps
    /// catch it (`tests/simulation`, docs/SIMULATION.md "Clock steps").
    UfmWatchNotRearmed,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 3] = [
        Mutation::ReleasedWithoutPortRead,
        Mutation::LogKeepsEpoch,
        Mutation::UfmWatchNotRearmed,
    ];

    /// The name [`ENV`] gives it.
    pub fn name(self) -> &'static str {
        match self {
            Mutation::ReleasedWithoutPortRead => "released-without-port-read",
            Mutation::LogKeepsEpoch => "log-keeps-epoch",
            Mutation::UfmWatchNotRearmed => "ufm-watch-not-rearmed",
        }
    }

    /// The rule it switches off, for the start-up warning.
    fn rule(self) -> &'static str {
        match self {
            Mutation::ReleasedWithoutPortRead => {
                "RELEASED is said without a port read showing the key gone"
            }
            Mutation::LogKeepsEpoch => {
                "a log that may have gone back keeps its epoch (an (epoch, seq) may name two events)"
            }
            Mutation::UfmWatchNotRearmed => {
                "UFM late-write watches keep their stored deadlines across a restart (a wall-clock step may end one early)"
            }
        }
    }

    /// The mutation named `name`, if any.
    pub fn parse(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name.trim())
    }
}

/// Whether `mutation` is switched on in this process (always false in a release build).
pub fn active(mutation: Mutation) -> bool {
    #[cfg(debug_assertions)]
    {
        current() == Some(mutation)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = mutation;
        false
    }
}

/// The mutation [`ENV`] names, read once.
#[cfg(debug_assertions)]
fn current() -> Option<Mutation> {
    static CURRENT: std::sync::OnceLock<Option<Mutation>> = std::sync::OnceLock::new();
    *CURRENT.get_or_init(|| std::env::var(ENV).ok().as_deref().and_then(Mutation::parse))
}

/// Says at start what [`ENV`] does in this process: a WARN naming the switched-off rule, an
/// error for a name that is not a mutation (ignored), or (release build) that it is ignored.
/// Silent when the variable is unset.
pub fn announce() {
    let Ok(name) = std::env::var(ENV) else {
        return;
    };
    if cfg!(not(debug_assertions)) {
        tracing::warn!(
            "{ENV}={name:?} is ignored: a release build has no test mutations; every truth rule holds"
        );
        return;
    }
    match Mutation::parse(&name) {
        Some(m) if active(m) => tracing::warn!(
            "TEST MUTATION {:?} ({ENV}): a truth rule is switched off on purpose: {}. This build must never serve a fabric; it exists only to prove the chaos checker catches a broken rule",
            m.name(),
            m.rule()
        ),
        _ => tracing::error!(
            "{ENV}={name:?} names no test mutation (known: {}); ignored, every truth rule holds",
            Mutation::ALL.map(Mutation::name).join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_none() {
        for m in Mutation::ALL {
            assert_eq!(Mutation::parse(m.name()), Some(m));
        }
        assert_eq!(Mutation::parse("released-without-every-host"), None);
        assert_eq!(Mutation::parse(""), None);
    }

    #[test]
    fn unset_switches_nothing_on() {
        // The unit tests never set the variable.
        assert!(std::env::var(ENV).is_err());
        assert!(Mutation::ALL.into_iter().all(|m| !active(m)));
    }
}
