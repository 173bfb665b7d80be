//! One SM host's answer to a node's apply, and what an error status from it means (an answer
//! or no answer): shared by the client that folds the answers and the view of the SM-host set.

use super::convert::sm_error_of;
use crate::proto::sm as pb;
use crate::sm::SmError;

/// What one host's error status means. A status the SM host's agent sent (no transport error
/// behind it) is its answer: UNAVAILABLE ("OpenSM has not confirmed"), ABORTED and the like
/// from a reachable host are refusals, never "no answer"; only a failure of the connection or
/// the call itself (tonic puts the transport error behind the status: refused or reset
/// connection, timeout) is [`SmError::Unreachable`].
pub(super) fn classify(status: &tonic::Status, generation: u64) -> SmError {
    let answered = std::error::Error::source(status).is_none()
        && !matches!(
            status.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        );
    match sm_error_of(status, generation) {
        SmError::Unreachable(failure) if answered => SmError::Refused(failure),
        other => other,
    }
}

/// One SM host's answer to an apply.
pub struct HostAnswer<'a> {
    /// The endpoint as configured.
    pub endpoint: &'a str,
    /// The name TLS verifies for it (https: `domain_name`, else the URL's host).
    pub verified: Option<String>,
    /// On plaintext: the name it stated in an earlier answer.
    pub remembered: Option<String>,
    /// What it answered.
    pub answer: Result<pb::SetNodeMembershipsResponse, tonic::Status>,
}
