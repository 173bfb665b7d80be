//! Grants: what the control plane signs (`fabric.grant.v1`) so that the fabric side accepts a
//! key in a node's set only when the control plane, not the node, asked for it.
//!
//! A [`SignedGrant`] keeps the grant's encoded bytes exactly as signed (protobuf encoding is not
//! canonical, so a verifier never re-encodes) beside the decoded [`Grant`] (decoded once, in the
//! protocol boundary). [`GrantKeys::verify`] checks the Ed25519 signature (pure, strict) over
//! `"fabric.grant.v1\n" || bytes` with the key named by `key_id`, and that the grant's issue time
//! falls inside that key's validity window. [`Grant::check`] then compares the grant with what
//! it is used for (fabric, node, key, membership). Every refusal is a typed [`GrantError`]
//! naming exactly what is wrong. Pure: no I/O.

use super::{FabricName, Membership, NodeId, PKey};
use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

mod lifetime;
mod retired;

pub use lifetime::GrantLifetime;
pub use retired::RetiredKeys;

/// The domain separation prefix of the signed message.
pub const SIGNING_CONTEXT: &[u8] = b"fabric.grant.v1\n";

/// Longest grant id, key id or instance id.
pub const GRANT_ID_MAX: usize = 128;

/// The message an Ed25519 signature covers: [`SIGNING_CONTEXT`] followed by the grant's bytes.
pub fn signed_message(grant_bytes: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNING_CONTEXT.len() + grant_bytes.len());
    m.extend_from_slice(SIGNING_CONTEXT);
    m.extend_from_slice(grant_bytes);
    m
}

/// Whether `s` is a valid grant or key id: 1-128 characters `[A-Za-z0-9._:-]`.
pub fn is_grant_id(s: &str) -> bool {
    (1..=GRANT_ID_MAX).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// One decoded grant: this instance on this node may be a member of this partition with
/// exactly this key and membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Unique per grant; what gets consumed.
    pub grant_id: String,
    /// The fabric the partition lives on.
    pub fabric: String,
    /// The node whose ports may join (exact, case-sensitive).
    pub node_id: String,
    /// The tenant instance on that node.
    pub instance_id: String,
    /// The control plane's partition id.
    pub partition_id: String,
    /// The P_Key base.
    pub pkey: PKey,
    /// The membership granted, exactly.
    pub membership: Membership,
    /// When the control plane signed it (ms since the Unix epoch).
    pub issued_at_unix_ms: u64,
}

/// A grant as carried: the signed bytes, the signing key's id, the signature, and the grant
/// those bytes decode to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedGrant {
    /// The encoded `fabric.grant.v1.Grant`, exactly as signed.
    pub bytes: Vec<u8>,
    /// The id of the signing key.
    pub key_id: String,
    /// The Ed25519 signature (64 bytes).
    pub signature: Vec<u8>,
    /// What `bytes` decode to (decoded in the protocol boundary).
    pub grant: Grant,
}

/// What a grant is presented for: compared field by field by [`Grant::check`].
#[derive(Debug, Clone, Copy)]
pub struct GrantUse<'a> {
    /// The verifier's fabric.
    pub fabric: &'a FabricName,
    /// The node the set or attachment is for (exact).
    pub node_id: &'a NodeId,
    /// The key asked for.
    pub pkey: PKey,
    /// The membership asked for.
    pub membership: Membership,
}

/// Why a grant is refused. Each names the grant (or key) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// The grant's bytes or fields do not decode or are out of range.
    #[error("malformed grant: {0}")]
    Malformed(String),
    /// The key id is not in the verifier's key set (never configured, or retired).
    #[error(
        "grant signed with key id {key_id:?}, which is not configured here (unknown or retired)"
    )]
    UnknownKeyId {
        /// The key id the grant names.
        key_id: String,
    },
    /// The signature does not verify with the named key.
    #[error("grant {grant_id:?}: the signature does not verify with key {key_id:?}")]
    BadSignature {
        /// The grant's id as its bytes say (unverified).
        grant_id: String,
        /// The key id.
        key_id: String,
    },
    /// The grant was issued outside the key's validity window.
    #[error("grant {grant_id:?} was issued at {issued_at_unix_ms} ms, outside the validity of key {key_id:?} ({window})")]
    KeyNotValid {
        /// The grant id.
        grant_id: String,
        /// The key id.
        key_id: String,
        /// The grant's issue time.
        issued_at_unix_ms: u64,
        /// The key's window, for humans.
        window: String,
    },
    /// The grant is for another fabric.
    #[error("grant {grant_id:?} is for fabric {granted:?}, not {expected:?}")]
    WrongFabric {
        /// The grant id.
        grant_id: String,
        /// The fabric granted.
        granted: String,
        /// This verifier's fabric.
        expected: String,
    },
    /// The grant is for another node.
    #[error("grant {grant_id:?} is for node {granted:?}, not {expected:?}")]
    WrongNode {
        /// The grant id.
        grant_id: String,
        /// The node granted.
        granted: String,
        /// The node the grant was presented for.
        expected: String,
    },
    /// The grant is for another key.
    #[error("grant {grant_id:?} is for key {granted}, not {expected}")]
    WrongKey {
        /// The grant id.
        grant_id: String,
        /// The key granted.
        granted: PKey,
        /// The key asked for.
        expected: PKey,
    },
    /// The grant is for the other membership.
    #[error("grant {grant_id:?} grants {granted} membership of {pkey}, not {expected}")]
    WrongMembership {
        /// The grant id.
        grant_id: String,
        /// The key.
        pkey: PKey,
        /// The membership granted.
        granted: Membership,
        /// The membership asked for.
        expected: Membership,
    },
    /// The grant is for another instance or partition than the request names.
    #[error("grant {grant_id:?} is for {field} {granted:?}, not {expected:?}")]
    WrongSubject {
        /// The grant id.
        grant_id: String,
        /// `instance_id` or `partition_id`.
        field: &'static str,
        /// What the grant names.
        granted: String,
        /// What the request names.
        expected: String,
    },
    /// The grant was consumed (released or revoked) and is never accepted again.
    #[error("grant {grant_id:?} was consumed (its instance was released or revoked) and is not accepted again")]
    Consumed {
        /// The grant id.
        grant_id: String,
    },
    /// A key asked for carries no grant.
    #[error("no grant for key {pkey}")]
    Missing {
        /// The key.
        pkey: PKey,
    },
    /// The grant is older than the verifier's lifetime allows for a first admission (a grant
    /// already admitted for the node keeps working).
    #[error("grant {grant_id:?} expired: issued at {issued_at_unix_ms} ms, {age_ms} ms before now; a grant is admitted for the first time only within {max_age_ms} ms (plus {skew_ms} ms clock skew) of its issue; ask the control plane for a new grant")]
    Expired {
        /// The grant id.
        grant_id: String,
        /// The grant's issue time.
        issued_at_unix_ms: u64,
        /// How old it is by the verifier's clock.
        age_ms: u64,
        /// The lifetime.
        max_age_ms: u64,
        /// The clock skew allowed.
        skew_ms: u64,
    },
    /// The grant's issue time lies further in the future than the clock skew allows.
    #[error("grant {grant_id:?} was issued at {issued_at_unix_ms} ms, {ahead_ms} ms after this host's clock (more than the {skew_ms} ms clock skew allowed): refused")]
    FromTheFuture {
        /// The grant id.
        grant_id: String,
        /// The grant's issue time.
        issued_at_unix_ms: u64,
        /// How far ahead of the verifier's clock.
        ahead_ms: u64,
        /// The clock skew allowed.
        skew_ms: u64,
    },
    /// The grant's key was retired (its partition deleted) after the grant was issued.
    #[error("grant {grant_id:?} is for key {pkey}, which was retired at {retired_at_unix_ms} ms (its partition was deleted); grants issued before then ({issued_at_unix_ms} ms) are not accepted again")]
    Retired {
        /// The grant id.
        grant_id: String,
        /// The key.
        pkey: PKey,
        /// The grant's issue time.
        issued_at_unix_ms: u64,
        /// When the control plane retired the key.
        retired_at_unix_ms: u64,
    },
}

impl Grant {
    /// Checks the grant against what it is presented for: fabric, node (exact, never
    /// case-folded), key and membership (exact: limited never stands for full nor full for
    /// limited).
    pub fn check(&self, usage: &GrantUse<'_>) -> Result<(), GrantError> {
        let id = || self.grant_id.clone();
        if self.fabric != usage.fabric.as_str() {
            return Err(GrantError::WrongFabric {
                grant_id: id(),
                granted: self.fabric.clone(),
                expected: usage.fabric.as_str().to_owned(),
            });
        }
        if self.node_id != usage.node_id.as_str() {
            return Err(GrantError::WrongNode {
                grant_id: id(),
                granted: self.node_id.clone(),
                expected: usage.node_id.as_str().to_owned(),
            });
        }
        if self.pkey != usage.pkey {
            return Err(GrantError::WrongKey {
                grant_id: id(),
                granted: self.pkey,
                expected: usage.pkey,
            });
        }
        if self.membership != usage.membership {
            return Err(GrantError::WrongMembership {
                grant_id: id(),
                pkey: self.pkey,
                granted: self.membership,
                expected: usage.membership,
            });
        }
        Ok(())
    }

    /// Checks the field values a decoder cannot: ids well formed.
    pub fn validate(&self) -> Result<(), GrantError> {
        for (field, value) in [
            ("grant_id", &self.grant_id),
            ("node_id", &self.node_id),
            ("instance_id", &self.instance_id),
            ("partition_id", &self.partition_id),
            ("fabric", &self.fabric),
        ] {
            if !is_grant_id(value) {
                return Err(GrantError::Malformed(format!(
                    "{field} {value:?} is not 1-128 characters [A-Za-z0-9._:-]"
                )));
            }
        }
        Ok(())
    }
}

/// One public key of the control plane, with its optional validity window (inclusive, ms since
/// the Unix epoch) checked against a grant's issue time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantKey {
    /// The key id grants name.
    pub id: String,
    /// The Ed25519 public key.
    pub public: VerifyingKey,
    /// Grants issued before this are refused.
    pub not_before_unix_ms: Option<u64>,
    /// Grants issued after this are refused.
    pub not_after_unix_ms: Option<u64>,
}

impl GrantKey {
    /// A key from its 32 public-key bytes; `None` when they are not a valid Ed25519 point.
    pub fn from_bytes(id: &str, bytes: &[u8]) -> Option<GrantKey> {
        let bytes: &[u8; 32] = bytes.try_into().ok()?;
        let public = VerifyingKey::from_bytes(bytes).ok()?;
        Some(GrantKey {
            id: id.to_owned(),
            public,
            not_before_unix_ms: None,
            not_after_unix_ms: None,
        })
    }

    fn window(&self) -> String {
        let b = self
            .not_before_unix_ms
            .map(|t| t.to_string())
            .unwrap_or_else(|| "-inf".into());
        let a = self
            .not_after_unix_ms
            .map(|t| t.to_string())
            .unwrap_or_else(|| "+inf".into());
        format!("{b}..={a} ms")
    }
}

/// The control plane's public keys by id: several at a time, so keys rotate without a flag day.
///
/// With a [`GrantLifetime`] ([`GrantKeys::with_lifetime`]; `[grants]` always sets one) a grant is
/// admitted for the first time only within that lifetime of its issue ([`GrantKeys::fresh`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantKeys {
    keys: BTreeMap<String, GrantKey>,
    lifetime: Option<GrantLifetime>,
}

impl fmt::Display for GrantKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.keys().map(String::as_str).collect();
        write!(f, "[{}]", ids.join(", "))
    }
}

impl GrantKeys {
    /// A key set; `Err(id)` names a key id given twice.
    pub fn new(keys: impl IntoIterator<Item = GrantKey>) -> Result<GrantKeys, String> {
        let mut map = BTreeMap::new();
        for k in keys {
            if let Some(dup) = map.insert(k.id.clone(), k) {
                return Err(dup.id);
            }
        }
        Ok(GrantKeys {
            keys: map,
            lifetime: None,
        })
    }

    /// The same keys, with grants admitted for the first time only within `lifetime`.
    pub fn with_lifetime(self, lifetime: GrantLifetime) -> GrantKeys {
        GrantKeys {
            lifetime: Some(lifetime),
            ..self
        }
    }

    /// The lifetime of a grant for its first admission (`None`: unbounded, only for key sets
    /// built without `[grants]`, in tests).
    pub fn lifetime(&self) -> Option<GrantLifetime> {
        self.lifetime
    }

    /// Whether `grant` may be admitted for the first time at `now_unix_ms` (the verifier's
    /// clock): within the lifetime of its issue, and not issued in the future beyond the clock
    /// skew. Always Ok without a lifetime.
    pub fn fresh(&self, grant: &Grant, now_unix_ms: u64) -> Result<(), GrantError> {
        match &self.lifetime {
            Some(l) => l.check(grant, now_unix_ms),
            None => Ok(()),
        }
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Verifies the signature and the key's validity window; returns the grant on success.
    pub fn verify<'a>(&self, signed: &'a SignedGrant) -> Result<&'a Grant, GrantError> {
        let key = self
            .keys
            .get(&signed.key_id)
            .ok_or_else(|| GrantError::UnknownKeyId {
                key_id: signed.key_id.clone(),
            })?;
        let bad = || GrantError::BadSignature {
            grant_id: signed.grant.grant_id.clone(),
            key_id: signed.key_id.clone(),
        };
        let signature = Signature::from_slice(&signed.signature).map_err(|_| bad())?;
        key.public
            .verify_strict(&signed_message(&signed.bytes), &signature)
            .map_err(|_| bad())?;
        let t = signed.grant.issued_at_unix_ms;
        if key.not_before_unix_ms.is_some_and(|nb| t < nb)
            || key.not_after_unix_ms.is_some_and(|na| t > na)
        {
            return Err(GrantError::KeyNotValid {
                grant_id: signed.grant.grant_id.clone(),
                key_id: key.id.clone(),
                issued_at_unix_ms: t,
                window: key.window(),
            });
        }
        signed.grant.validate()?;
        Ok(&signed.grant)
    }
}

/// The `[grants]` policy: the switch, the fabric grants must name and the key set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantPolicy {
    /// Whether grants are required.
    pub require: bool,
    /// The fabric grants must name.
    pub fabric: FabricName,
    /// The control plane's public keys.
    pub keys: GrantKeys,
}

impl GrantPolicy {
    /// Grants not required, no keys (tests and labs).
    pub fn off(fabric: FabricName) -> GrantPolicy {
        GrantPolicy {
            require: false,
            fabric,
            keys: GrantKeys::default(),
        }
    }
}

#[cfg(test)]
mod tests;
