use crate::domain::DomainError;
use crate::store::StoreError;
use thiserror::Error;

/// Why the agent refused or could not carry out a command. `api::convert` maps each variant to
/// exactly one gRPC status code.
#[derive(Debug, Clone, Error)]
pub enum AgentError {
    /// Malformed input (INVALID_ARGUMENT).
    #[error(transparent)]
    Invalid(#[from] DomainError),
    /// The request conflicts with the node's state (FAILED_PRECONDITION).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request conflicts with an existing attachment or partition (ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
    /// The ports cannot hold another key (RESOURCE_EXHAUSTED).
    #[error("{0}")]
    ResourceExhausted(String),
    /// No such attachment (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The agent cannot serve yet or any more (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// The event log no longer holds what was asked (OUT_OF_RANGE).
    #[error("{0}")]
    OutOfRange(String),
    /// The store failed (INTERNAL); nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}
