//! How long a grant may wait before its first admission. The control plane signs a grant when
//! it decides (attach); the node presents it at once. A grant that was never used within its
//! lifetime is refused: an old grant left on a node (its instance long gone, its partition
//! deleted, its P_Key perhaps given to another tenant since) cannot be played later. A grant
//! already admitted for its node is not judged again by age: expiry only gates first admission.
//!
//! The lifetime is the verifier's (the SM host's `[grants] max_age`), not a signed field: it
//! bounds every grant whatever signed it (the control plane, or `openssl` by hand), and an
//! operator can shorten it without the control plane. Issue times are the control plane's clock,
//! "now" the SM host's: both bounds allow `max_clock_skew` of disagreement between them.

use super::{Grant, GrantError};

/// The first-admission lifetime of a grant and the clock skew tolerated between the signer's
/// clock (the grant's issue time) and the verifier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantLifetime {
    /// A grant is admitted for the first time only while `now <= issued_at + max_age + skew`.
    pub max_age_ms: u64,
    /// The clock disagreement tolerated; a grant issued more than this after the verifier's
    /// "now" is refused (it would otherwise live longer than `max_age`).
    pub max_clock_skew_ms: u64,
}

impl GrantLifetime {
    /// Checks `grant`'s issue time against `now_unix_ms` (the verifier's clock).
    pub fn check(&self, grant: &Grant, now_unix_ms: u64) -> Result<(), GrantError> {
        let issued = grant.issued_at_unix_ms;
        let skew = self.max_clock_skew_ms;
        if issued > now_unix_ms.saturating_add(skew) {
            return Err(GrantError::FromTheFuture {
                grant_id: grant.grant_id.clone(),
                issued_at_unix_ms: issued,
                ahead_ms: issued - now_unix_ms,
                skew_ms: skew,
            });
        }
        let age = now_unix_ms.saturating_sub(issued);
        if age > self.max_age_ms.saturating_add(skew) {
            return Err(GrantError::Expired {
                grant_id: grant.grant_id.clone(),
                issued_at_unix_ms: issued,
                age_ms: age,
                max_age_ms: self.max_age_ms,
                skew_ms: skew,
            });
        }
        Ok(())
    }
}
