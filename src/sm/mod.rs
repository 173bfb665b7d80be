//! Subnet-manager backends: how a node's desired P_Key memberships reach the fabric.
//!
//! Every backend is declarative: [`SubnetManager::apply`] receives the node's complete desired
//! set and computes the difference itself, so retrying an apply is always safe.

pub mod embedded;
pub mod opensm;
pub mod remote;
pub mod ufm;

use crate::domain::NodeMemberships;
use async_trait::async_trait;
use thiserror::Error;

/// Why an apply did not go through.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SmError {
    /// The subnet manager could not be reached or did not answer in time: retry with backoff.
    #[error("subnet manager unavailable: {0}")]
    Unavailable(String),
    /// The subnet manager refused the request for a reason retrying will not fix (bad
    /// credentials, the operator's file does not parse, a table would overflow). The agent keeps
    /// retrying slowly, since an operator may fix it, and shows the reason.
    #[error("subnet manager refused: {0}")]
    Refused(String),
}

impl SmError {
    /// Whether retrying soon may help.
    pub fn is_transient(&self) -> bool {
        matches!(self, SmError::Unavailable(_))
    }
}

/// What an apply achieved, for status output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// One line for humans, e.g. "partitions file written, heavy sweep requested".
    pub detail: String,
}

/// A subnet-manager backend.
#[async_trait]
pub trait SubnetManager: Send + Sync + 'static {
    /// Backend name: "embedded", "opensm", "remote" or "ufm".
    fn backend(&self) -> &'static str;

    /// Makes the fabric give exactly `desired.keys` to `desired.port_guids` (plus the default
    /// partition), removing keys this node no longer wants. Idempotent.
    async fn apply(&self, desired: &NodeMemberships) -> Result<ApplyOutcome, SmError>;
}
