use thiserror::Error;

/// A value that does not satisfy the domain's rules. The message names the field and says why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DomainError {
    /// A field is malformed, empty, oversized or out of range.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field's name as the API spells it.
        field: &'static str,
        /// Why it was rejected.
        reason: String,
    },
}

impl DomainError {
    /// Builds an [`DomainError::Invalid`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        DomainError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}
