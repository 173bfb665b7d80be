use serde::{Deserialize, Serialize};
use std::fmt;

/// A standing condition: something wrong with the node's or the fabric's posture that stays
/// reported (GetNode, systemd STATUS=, an event when it is raised and when it clears) until
/// its cause is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConditionKind {
    /// A fabric port is a full member of the default partition (0xFFFF): every tenant on the
    /// fabric can reach this node through it. Tenant keys are not reported ACTIVE until the
    /// operator acknowledges it (`allow_full_default = true`).
    FullDefaultMembership,
    /// The operator's part of OpenSM's partitions file gives every port full membership of the
    /// default partition (`Default=0x7fff : ALL=full`). The SM host serves no tenant key until
    /// the operator acknowledges it (`allow_full_default = true`).
    OperatorDefaultAllFull,
    /// OpenSM rejected a partitions file the agent wrote (PARSE ERROR): OpenSM is then
    /// fail-open. The last file it accepted was restored.
    PartitionsFileRejected,
    /// OpenSM was not yet seen re-reading the last file the agent wrote; the write is
    /// re-signalled and re-checked until it is.
    PartitionsFileUnconfirmed,
    /// The store is not the one the agent last wrote (restored from a copy or replaced): the
    /// event log got a new epoch and the apply generation moved above every one the old store
    /// may have sent. Stands until an apply of the restarted agent was acknowledged.
    StoreRolledBack,
    /// UFM executed an add of this node after the client had given up on it (a late write): a
    /// GUID re-appeared in a released key. It was removed; stands until the key's watch ends.
    UfmLateWrite,
    /// The last port read failed (no device, no permission, the observer's root is gone): no
    /// attachment changes state until the ports are read again. Clears at the next good read.
    PortsUnreadable,
    /// An SM host among several: a peer SM host held another generation of some node's set than
    /// this host in two pulls in a row (they should converge within one pull).
    SmHostsDisagree,
    /// SM host: a node's stored set no longer passes the whole-file checks against the
    /// operator's part of OpenSM's partitions file (a key the operator now defines, a port
    /// table the operator's entries now fill). It is left out of the file (its ports hold none
    /// of its keys), the other nodes' sets are written; the detail names the node. Stands until
    /// the node's set passes again.
    NodeSetQuarantined,
    /// Attachments found live in a store restored from a copy, or after an unclean stop that
    /// left a change unsent, whose keys the ports did not hold at the first read after the
    /// start (the store may predate their release): their
    /// keys are withheld from the node's sets until the control plane sends their attach again
    /// (or releases them). The detail names them. Stands while any is withheld.
    RestoredUnconfirmed,
    /// An SM host with peers has not caught up with every peer since it started (its first
    /// pull timed out or a peer did not answer): the sets it holds back stay out of its file
    /// until the node or a peer confirms them. The detail names the peers it waits for.
    SmHostNotCaughtUp,
    /// An SM host's own OpenSM is not running (no SMInfo answer on its port, or its pid is
    /// gone). Proven (no SMInfo answer after the write *and* the pid gone), this host still
    /// confirms its writes and nothing waits on it; not proven, its acknowledgements are missing
    /// from every node's applies, so releases and attaches wait on it. The detail says which.
    OpenSmNotRunning,
    /// An SM host holds a peer fenced: the peer's agent stopped answering pulls and its SM port
    /// did not answer SMInfo (or was down). The nodes' applies go on without it; it rejoins once
    /// its agent answers again, caught up. The detail names it and the evidence.
    SmHostFenced,
    /// A peer SM host's agent does not answer but its SM answers SMInfo (it could become master
    /// with a stale file): it is not fenced, so releases and attaches wait on it. The detail
    /// says what the operator can do (stop that OpenSM, or `fabric-agent fence-sm-host`).
    SmHostAgentSilent,
    /// A node (remote backend): the SM hosts' answers name a host set its `endpoints` do not
    /// cover (a known host missing, two endpoints answering as one host, a stated name that is
    /// not the TLS-verified one): its applies are not acknowledged until they do.
    SmHostSetIncomplete,
    /// A node's start check (what each SM host stores for it, asked before any apply that adds
    /// a key) got no answer from some SM host within its bound: the node then sends its sets
    /// again without that host's evidence that its store did not go back in time. The detail
    /// names the hosts; cleared when every host answered or an apply was acknowledged.
    StartCheckIncomplete,
    /// The agent's last stop was not clean (no clean-stop marker in its store: a crash,
    /// SIGKILL, power loss, or its state directory put back from a copy of a running agent):
    /// the event log continues under a new epoch, so no (epoch, seq) is handed out twice and a
    /// control plane resumes only after resynchronising. Stands until an apply of the
    /// restarted agent was acknowledged.
    UncleanStop,
}

impl ConditionKind {
    /// The wire and log name, e.g. `FULL_DEFAULT_MEMBERSHIP`.
    pub fn name(self) -> &'static str {
        match self {
            ConditionKind::FullDefaultMembership => "FULL_DEFAULT_MEMBERSHIP",
            ConditionKind::OperatorDefaultAllFull => "OPERATOR_DEFAULT_ALL_FULL",
            ConditionKind::PartitionsFileRejected => "PARTITIONS_FILE_REJECTED",
            ConditionKind::PartitionsFileUnconfirmed => "PARTITIONS_FILE_UNCONFIRMED",
            ConditionKind::StoreRolledBack => "STORE_ROLLED_BACK",
            ConditionKind::UfmLateWrite => "UFM_LATE_WRITE",
            ConditionKind::PortsUnreadable => "PORTS_UNREADABLE",
            ConditionKind::SmHostsDisagree => "SM_HOSTS_DISAGREE",
            ConditionKind::NodeSetQuarantined => "NODE_SET_QUARANTINED",
            ConditionKind::RestoredUnconfirmed => "RESTORED_UNCONFIRMED",
            ConditionKind::SmHostNotCaughtUp => "SM_HOST_NOT_CAUGHT_UP",
            ConditionKind::OpenSmNotRunning => "OPENSM_NOT_RUNNING",
            ConditionKind::SmHostFenced => "SM_HOST_FENCED",
            ConditionKind::SmHostAgentSilent => "SM_HOST_AGENT_SILENT",
            ConditionKind::SmHostSetIncomplete => "SM_HOST_SET_INCOMPLETE",
            ConditionKind::StartCheckIncomplete => "START_CHECK_INCOMPLETE",
            ConditionKind::UncleanStop => "UNCLEAN_STOP",
        }
    }
}

impl fmt::Display for ConditionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One standing condition with what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Which condition.
    pub kind: ConditionKind,
    /// What was seen, for humans (ports, file lines, ...).
    pub detail: String,
}
