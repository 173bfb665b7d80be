//! Subnet-manager backends: how a node's desired P_Key memberships reach the fabric.
//!
//! Every backend is declarative: [`SubnetManager::apply`] receives the node's complete desired
//! set and computes the difference itself, so retrying an apply is always safe.

pub mod blocking;
pub mod embedded;
pub mod fabric_side;
pub mod grant_judge;
pub mod opensm;
pub mod remote;
pub mod ufm;

use crate::domain::SignedGrant;
pub use fabric_side::{
    FabricSide, FabricSideError, FabricSideErrorKind, PartitionMember, PartitionMembers,
};
pub use opensm::{OpenSmBackend, OpenSmError, StoredNode};

use crate::domain::{Condition, NodeId, NodeMemberships, SmState};
use crate::embedded_fabric::SimError;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Why an apply did not go through.
#[derive(Debug, Clone, Error)]
pub enum SmError {
    /// The subnet manager could not be reached or did not answer in time: retry with backoff.
    #[error("subnet manager unavailable: {0}")]
    Unreachable(#[source] SmFailure),
    /// The subnet manager refused the request for a reason retrying will not fix (bad
    /// credentials, the operator's file does not parse, a table would overflow). The agent keeps
    /// retrying slowly, since an operator may fix it, and shows the reason.
    #[error("subnet manager refused: {0}")]
    Refused(#[source] SmFailure),
    /// The subnet manager already holds a newer generation of this node's set and refused this
    /// one (fencing: an older set must never overwrite a newer one). The node moves its
    /// generation counter past `stored` and sends its current set again.
    #[error("subnet manager holds generation {stored} of this node's set, newer than {sent}")]
    StaleGeneration {
        /// The generation this apply carried.
        sent: u64,
        /// The generation the subnet manager holds.
        stored: u64,
    },
}

impl SmError {
    /// Whether retrying soon may help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SmError::Unreachable(_) | SmError::StaleGeneration { .. }
        )
    }

    /// What this failure says about the subnet manager: it answered and refused (a refusal, or
    /// a newer generation it holds), or it did not answer (no connection, timeout, lost reply).
    pub fn state(&self) -> SmState {
        match self {
            SmError::Unreachable(_) => SmState::Unreachable,
            SmError::Refused(_) | SmError::StaleGeneration { .. } => SmState::Refused,
        }
    }
}

/// What failed in an apply, as the backend saw it, with its cause.
#[derive(Debug, Clone, Error)]
pub enum SmFailure {
    /// The OpenSM backend (this host is the SM host).
    #[error(transparent)]
    OpenSm(OpenSmError),
    /// The UFM backend.
    #[error(transparent)]
    Ufm(ufm::UfmError),
    /// The UFM broker (this host serves a UFM fabric's nodes).
    #[error(transparent)]
    Broker(Arc<ufm::broker::BrokerError>),
    /// The SM host's `fabric.sm.v1` answer, or the failure to get one; the source is the
    /// protocol's own error value (the api layer's status).
    #[error("SM host: {message}")]
    SmHost {
        /// What the SM host (or the transport) said.
        message: String,
        /// The protocol error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The apply did not finish within the agent's deadline; its keys stay in doubt.
    #[error("apply timed out after {0:?}; its keys stay in doubt")]
    TimedOut(Duration),
    /// The simulated fabric could not program the tables.
    #[error(transparent)]
    Sim(Arc<SimError>),
    /// A fault injected into a simulated subnet manager (the embedded backend's fault file, a
    /// test's model).
    #[error("{backend}: {fault}")]
    Injected {
        /// Which simulated subnet manager.
        backend: &'static str,
        /// The fault.
        fault: InjectedFault,
    },
}

/// A fault a simulated subnet manager was told to show.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InjectedFault {
    /// No answer.
    #[error("injected outage")]
    Outage,
    /// The set was applied but the reply was lost.
    #[error("injected lost reply (the set was applied)")]
    LostReply,
    /// A refusal with the given reason.
    #[error("{0}")]
    Refusal(String),
}

/// What an apply achieved, for status output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// One line for humans, e.g. "partitions file written, heavy sweep requested".
    pub detail: String,
    /// The SM hosts whose acknowledgement counted, by identity (the remote backend: the name
    /// TLS verified for each, on plaintext the name it stated, else its endpoint), sorted.
    /// Empty for a backend without separate SM hosts (embedded, opensm, ufm, simulated); the
    /// remote backend reaching a UFM broker names the broker.
    pub acknowledged_by: Vec<String>,
}

/// One fabric-side host's answer to "what do you store for this node" ([`SubnetManager::stored_sets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStoredSet {
    /// The host as configured (its endpoint).
    pub host: String,
    /// Its answer.
    pub answer: StoredSetAnswer,
}

/// What one fabric-side host said about a node's stored set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredSetAnswer {
    /// It stores this generation of the node's set.
    Stored(u64, NodeMemberships),
    /// It stores no set for the node.
    NotStored,
    /// It refused to tell (the node's identity may not read that node's set): it refuses the
    /// node's sets by the same rule, so it cannot take a key from the node either. Why.
    Refused(String),
    /// No answer (unreachable, timed out, an answer that does not convert): why.
    NoAnswer(String),
}

/// A subnet-manager backend.
#[async_trait]
pub trait SubnetManager: Send + Sync + 'static {
    /// Backend name: "embedded", "opensm", "remote" or "ufm".
    fn backend(&self) -> &'static str;

    /// Makes the fabric give exactly `desired.keys` to `desired.port_guids` (plus the default
    /// partition), removing keys this node no longer wants. Idempotent.
    ///
    /// `generation` orders this node's sets: the node persists it and gives every apply a
    /// higher one than any before (never a clock). A backend that stores sets (the SM host)
    /// refuses an older generation with [`SmError::StaleGeneration`]; it never answers Ok to a
    /// set it ignored. Ok means the subnet manager positively took this set; any error leaves
    /// the outcome unknown (the set may still have reached it).
    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError>;

    /// [`SubnetManager::apply`] with the control plane's grants that justify `desired.keys`
    /// (one per desired attachment that carries one). Backends that enforce or forward grants
    /// (the SM host, the remote backend) override it; the others ignore the grants.
    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let _ = grants;
        self.apply(desired, generation).await
    }
    /// Resolves when something that may change the answer to the last apply changed (the
    /// embedded backend's fault file): the reconciler then retries at once instead of waiting
    /// out a refusal's backoff. Default: never (the backoff runs its course).
    async fn cause_changed(&self) {
        std::future::pending::<()>().await
    }

    /// What each fabric-side host stores for `node` now (the remote backend: every configured
    /// SM host's `GetNodeMemberships`), for the check a node makes at every start before it
    /// adds a key (`agent::start_check`). `None`: this backend keeps no per-node sets, so there
    /// is nothing to check. Default: None.
    async fn stored_sets(&self, node: &NodeId) -> Option<Vec<HostStoredSet>> {
        let _ = node;
        None
    }

    /// Standing conditions the backend sees now (e.g. OpenSM rejected a file, the operator's
    /// Default grants full membership to all). The reconciler reads them after every apply and
    /// reports changes as events. Default: none.
    fn conditions(&self) -> Vec<Condition> {
        Vec::new()
    }

    /// The fabric's SM-host set as the last finished apply saw it (the remote backend; None
    /// before its first apply finished, and for backends without separate SM hosts). The
    /// reconciler copies it into `GetNode` after every apply. Default: None.
    fn sm_hosts(&self) -> Option<crate::domain::SmHostSet> {
        None
    }

    /// Moves on whenever the set of SM hosts this backend sends to changed in place (a SIGHUP
    /// that changed the remote backend's `endpoints`, `sm::remote::reload`): an acknowledgement
    /// taken before a change does not count after it. Default: 0, never changes.
    fn host_set_epoch(&self) -> u64 {
        0
    }
}
