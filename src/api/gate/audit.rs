//! The audit trail (tracing target `fabric_agent::audit`, message `audit`): for every mutating
//! call, one line when it is admitted, before it can change anything (`phase="admitted"`), and
//! one when it answers, naming the verified caller, the method, what it asked for and the gRPC
//! code it got (`result=`). A call dropped before it answered (a client deadline, RST_STREAM,
//! a lost connection) gets `result=Abandoned` instead: its effect is unknown, and the admitted
//! line already names it. Calls the call gate refuses get one line (with the peer as the
//! connection shows it). The target sits under `fabric_agent` so that any filter that keeps
//! the agent's own lines keeps the audit trail; `fabric_agent::audit=info` selects it alone.
//! Client-supplied strings are logged in their quoted (escaped) form so they cannot forge lines.
//!
//! An attach or release names its key as every human view does, the 16-bit value with the
//! membership bit (`pkey=0x8a12` full, `pkey=0x0a12` limited), and the base as asked in its own
//! field for machines (`pkey_base=0x0a12`); `-` where the call does not say (a release before
//! it is answered) or the value cannot be formed (membership or base invalid: the base field
//! still shows what was asked).

use super::caller::Caller;
use crate::domain::{Membership, PKey};
use std::fmt;
use tonic::Status;

/// The tracing target of audit lines.
pub const TARGET: &str = "fabric_agent::audit";

/// The caller as the audit line names it.
fn who(caller: Option<&Caller>) -> String {
    caller
        .map(ToString::to_string)
        .unwrap_or_else(|| "unknown (no call gate)".into())
}

/// The gRPC code of a result, in the `Code` enum's spelling ("Ok", "PermissionDenied", ...).
pub fn code_of<T>(result: &Result<T, Status>) -> tonic::Code {
    match result {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// What an attach or release concerned.
#[derive(Debug, Default, Clone)]
pub struct Subject<'a> {
    /// The instance id as sent.
    pub instance: &'a str,
    /// The partition id (from the request, or the stored attachment for a release).
    pub partition: &'a str,
    /// The P_Key base as asked.
    pub pkey: u32,
    /// FULL or LIMITED (empty when unknown, INVALID when the request's value is not one).
    pub membership: &'a str,
}

impl Subject<'_> {
    /// Whether the call says which key it concerns (a release says so only once answered).
    fn names_a_key(&self) -> bool {
        !self.membership.is_empty()
    }

    /// The `pkey` field: the 16-bit value with the membership bit, or `-`.
    fn pkey_value(&self) -> impl fmt::Display {
        let membership = match self.membership {
            "FULL" => Some(Membership::Full),
            "LIMITED" => Some(Membership::Limited),
            _ => None,
        };
        let value = membership.and_then(|m| Some(PKey::new(self.pkey).ok()?.value(m).0));
        Field(value.map(|v| format!("{v:#06x}")))
    }

    /// The `pkey_base` field: the base as asked, or `-` when the call does not name one.
    fn pkey_base(&self) -> impl fmt::Display {
        Field(self.names_a_key().then(|| format!("{:#06x}", self.pkey)))
    }
}

/// A field's text, `-` when absent.
struct Field(Option<String>);

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("-"))
    }
}

/// Records the admission of one FabricAgent mutating call, before its handler runs, and
/// returns the guard that is told when the call answered ([`PendingCall::answered`], then the
/// outcome line) or, when dropped unanswered, records that it was abandoned.
pub fn agent_admitted(
    caller: Option<&Caller>,
    method: &'static str,
    s: &Subject<'_>,
) -> PendingCall {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method,
        instance = ?s.instance,
        partition = ?s.partition,
        pkey = %s.pkey_value(),
        pkey_base = %s.pkey_base(),
        membership = s.membership,
        phase = "admitted",
        "audit"
    );
    PendingCall {
        caller: who(caller),
        method,
        subject: format!("instance {:?}", s.instance),
        answered: false,
    }
}

/// Records the admission of one `fabric.sm.v1` mutating call on the SM host (`what`: the keys
/// asked for, or the instance revoked), before its handler runs; see [`agent_admitted`].
pub fn sm_admitted(
    caller: Option<&Caller>,
    method: &'static str,
    node: &str,
    what: &str,
) -> PendingCall {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method,
        node = ?node,
        what,
        phase = "admitted",
        "audit"
    );
    PendingCall {
        caller: who(caller),
        method,
        subject: format!("node {node:?}"),
        answered: false,
    }
}

/// An admitted call whose outcome is not recorded yet.
#[must_use = "say when the call answered with answered()"]
pub struct PendingCall {
    caller: String,
    method: &'static str,
    subject: String,
    answered: bool,
}

impl PendingCall {
    /// The call answered: its outcome line follows, no abandoned line is written.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if !self.answered {
            tracing::warn!(
                target: TARGET,
                caller = %self.caller,
                method = self.method,
                subject = %self.subject,
                result = "Abandoned",
                "audit: the call was dropped before it answered; its effect is unknown"
            );
        }
    }
}

/// Records one FabricAgent mutating call's outcome.
pub fn agent_call(caller: Option<&Caller>, method: &str, s: &Subject<'_>, code: tonic::Code) {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method,
        instance = ?s.instance,
        partition = ?s.partition,
        pkey = %s.pkey_value(),
        pkey_base = %s.pkey_base(),
        membership = s.membership,
        result = ?code,
        "audit"
    );
}

/// Records one `Partitions.SetNodeMemberships` call on the SM host.
pub fn set_node_memberships(
    caller: Option<&Caller>,
    node: &str,
    keys: &str,
    ports: usize,
    generation: u64,
    code: tonic::Code,
) {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method = "SetNodeMemberships",
        node = ?node,
        keys,
        ports,
        generation,
        result = ?code,
        "audit"
    );
}

/// Records one `Partitions.RevokeInstance` call on the SM host.
pub fn revoke_instance(caller: Option<&Caller>, node: &str, instance: &str, code: tonic::Code) {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method = "RevokeInstance",
        node = ?node,
        instance = ?instance,
        result = ?code,
        "audit"
    );
}

/// Records a mutating call the call gate refused before any handler ran.
pub fn refused(peer: &str, path: &str, code: tonic::Code) {
    let method = path.rsplit('/').next().unwrap_or(path);
    tracing::info!(
        target: TARGET,
        caller = %peer,
        method = ?method,
        result = ?code,
        "audit"
    );
}

#[cfg(test)]
mod tests {
    use super::Subject;

    fn fields(pkey: u32, membership: &str) -> (String, String) {
        let s = Subject {
            instance: "vm-1",
            partition: "ibpart_a",
            pkey,
            membership,
        };
        (s.pkey_value().to_string(), s.pkey_base().to_string())
    }

    #[test]
    fn the_key_is_spelled_with_its_membership_bit_and_the_base_apart() {
        assert_eq!(fields(0x0a12, "FULL"), ("0x8a12".into(), "0x0a12".into()));
        assert_eq!(
            fields(0x0a12, "LIMITED"),
            ("0x0a12".into(), "0x0a12".into())
        );
        // What cannot be formed is not made up; the base says what was asked.
        assert_eq!(fields(0x0a12, "INVALID"), ("-".into(), "0x0a12".into()));
        assert_eq!(fields(0x8a12, "FULL"), ("-".into(), "0x8a12".into()));
        assert_eq!(fields(0x7fff, "FULL"), ("-".into(), "0x7fff".into()));
        // A release before it is answered names no key.
        assert_eq!(fields(0, ""), ("-".into(), "-".into()));
    }
}
