//! The fabric's SM-host set as a node's last apply saw it (the remote backend with OpenSM SM
//! hosts): the hosts the answers name, the ones they hold fenced, which acknowledged the apply
//! and which did not, and why. `GetNode` shows it; nothing here is persisted.

/// Why an SM host did not acknowledge an apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmHostMissKind {
    /// No answer: the connection failed or was reset, or the call timed out.
    Unreachable,
    /// It answered and said no (a refusal, or it holds a newer generation of the node's set).
    Refused,
    /// It answered yes, but the node does not count the answer (the name it states is not the
    /// one TLS verified for it).
    NotCounted,
    /// The answers name it as an SM host of the fabric, but it is not among the node's
    /// endpoints, so the node cannot hear it (`SM_HOST_SET_INCOMPLETE`).
    NotListed,
}

impl SmHostMissKind {
    /// The API's name: `UNREACHABLE`, `REFUSED`, `NOT_COUNTED` or `NOT_LISTED`.
    pub fn name(self) -> &'static str {
        match self {
            SmHostMissKind::Unreachable => "UNREACHABLE",
            SmHostMissKind::Refused => "REFUSED",
            SmHostMissKind::NotCounted => "NOT_COUNTED",
            SmHostMissKind::NotListed => "NOT_LISTED",
        }
    }
}

/// An SM host that did not acknowledge the last apply and was not excused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmHostMiss {
    /// The host's identity (the name TLS verified, else the name it stated, else its endpoint).
    pub host: String,
    /// The node's endpoint for it (empty for a host not among the endpoints).
    pub endpoint: String,
    /// Why it did not acknowledge.
    pub kind: SmHostMissKind,
    /// The error or refusal, in words.
    pub detail: String,
}

/// An SM host some answering host holds fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedSmHostView {
    /// The fenced host's name.
    pub host: String,
    /// The answering hosts that hold it fenced (when every answering host does, it is excused).
    pub fenced_by: Vec<String>,
    /// When it was fenced (ms since the Unix epoch, the earliest of the fencing hosts' clocks).
    pub since_unix_ms: u64,
    /// The physical evidence, as the first fencing host states it.
    pub evidence: String,
}

/// The fabric's SM-host set as the node's last finished apply saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmHostSet {
    /// The apply's generation.
    pub generation: u64,
    /// When its answers were all in, Unix nanoseconds.
    pub answered_unix_ns: i64,
    /// Every SM host the answers name (the answering hosts and the peers they know), sorted.
    pub known: Vec<String>,
    /// The hosts some answering host holds fenced.
    pub fenced: Vec<FencedSmHostView>,
    /// The hosts whose acknowledgement the node counted.
    pub acknowledged: Vec<String>,
    /// Hosts that did not acknowledge and need not: every answering host holds them fenced.
    pub excused: Vec<String>,
    /// Hosts that did not acknowledge and were not excused, each with why.
    pub not_acknowledged: Vec<SmHostMiss>,
    /// Why the host set is not covered (`SM_HOST_SET_INCOMPLETE`), empty when it is.
    pub problems: Vec<String>,
    /// Why the answering hosts have not fenced a silent peer, and what the operator can do.
    pub not_fenced: Vec<String>,
}

impl SmHostSet {
    /// Whether the apply counted as acknowledged by the whole set.
    pub fn complete(&self) -> bool {
        !self.acknowledged.is_empty()
            && self.not_acknowledged.is_empty()
            && self.problems.is_empty()
    }
}
