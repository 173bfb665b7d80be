//! The audit trail (tracing target `fabric_agent::audit`, message `audit`): for every mutating
//! call, one line when it is admitted, before it can change anything (`phase="admitted"`), and
//! one when it answers, naming the verified caller, the method, what it asked for and the gRPC
//! code it got (`result=`). A call dropped before it answered (a client deadline, RST_STREAM,
//! a lost connection) gets `result=Abandoned` instead: its effect is unknown, and the admitted
//! line already names it. Calls the call gate refuses get one line (with the peer as the
//! connection shows it). The target sits under `fabric_agent` so that any filter that keeps
//! the agent's own lines keeps the audit trail; `fabric_agent::audit=info` selects it alone.
//! Client-supplied strings are logged in their quoted (escaped) form so they cannot forge lines.

use super::caller::Caller;
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
    /// The P_Key base.
    pub pkey: u32,
    /// FULL or LIMITED (empty when unknown).
    pub membership: &'a str,
}

/// Records the admission of one FabricAgent mutating call, before its handler runs, and
/// returns the guard that records its outcome ([`Admitted::answered`]) or, when dropped
/// unanswered, that it was abandoned.
pub fn agent_admitted(caller: Option<&Caller>, method: &'static str, s: &Subject<'_>) -> Admitted {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method,
        instance = ?s.instance,
        partition = ?s.partition,
        pkey = %format_args!("{:#06x}", s.pkey),
        membership = s.membership,
        phase = "admitted",
        "audit"
    );
    Admitted {
        caller: who(caller),
        method,
        instance: s.instance.to_owned(),
        answered: false,
    }
}

/// An admitted call whose outcome is not recorded yet.
#[must_use = "record the call's outcome with answered()"]
pub struct Admitted {
    caller: String,
    method: &'static str,
    instance: String,
    answered: bool,
}

impl Admitted {
    /// Records the outcome line of an agent call.
    pub fn answered(mut self, caller: Option<&Caller>, s: &Subject<'_>, code: tonic::Code) {
        self.answered = true;
        agent_call(caller, self.method, s, code);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.answered {
            tracing::warn!(
                target: TARGET,
                caller = %self.caller,
                method = self.method,
                instance = ?self.instance,
                result = "Abandoned",
                "audit: the call was dropped before it answered; its effect is unknown"
            );
        }
    }
}

/// Records one FabricAgent mutating call's outcome.
fn agent_call(caller: Option<&Caller>, method: &str, s: &Subject<'_>, code: tonic::Code) {
    tracing::info!(
        target: TARGET,
        caller = %who(caller),
        method,
        instance = ?s.instance,
        partition = ?s.partition,
        pkey = %format_args!("{:#06x}", s.pkey),
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
