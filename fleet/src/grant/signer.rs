//! The control plane's grant signer: several Ed25519 keys by id (rotation), one active.
//!
//! A grant is encoded once; `SignedGrant.grant` carries exactly the signed bytes, and the
//! signature covers `"fabric.grant.v1\n" || grant` (see `proto/fabric/grant/v1/grant.proto`).

use super::key::{load_seed, KeyError, SigningKeyFile};
use crate::proto::grant::{Grant, Membership, SignedGrant};
use ed25519_dalek::{Signer as _, SigningKey, Verifier as _, VerifyingKey};
use prost::Message;
use std::collections::BTreeMap;

/// The domain separation prefix of every grant signature.
pub const DOMAIN: &[u8] = b"fabric.grant.v1\n";

/// Why a grant could not be signed, or a signer not built.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// A key file failed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// No keys, a duplicate id, or the active id is not among the keys.
    #[error("signing keys: {0}")]
    Keys(String),
    /// A grant field is malformed; nothing was signed.
    #[error("grant field {field}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The signature does not verify (or the key id is unknown).
    #[error("grant signature does not verify: {0}")]
    Verify(String),
}

/// Signs grants with the active key; holds every configured key so it can also verify.
pub struct Signer {
    keys: BTreeMap<String, SigningKey>,
    active: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .field("active", &self.active)
            .finish()
    }
}

fn valid_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

impl Signer {
    /// A signer from seeds by id; `active` signs.
    pub fn new(seeds: Vec<(String, [u8; 32])>, active: &str) -> Result<Signer, GrantError> {
        let mut keys = BTreeMap::new();
        for (id, seed) in seeds {
            if !valid_id(&id) {
                return Err(GrantError::Keys(format!(
                    "key id {id:?} must be 1-128 characters [A-Za-z0-9._:-]"
                )));
            }
            if keys
                .insert(id.clone(), SigningKey::from_bytes(&seed))
                .is_some()
            {
                return Err(GrantError::Keys(format!("key id {id:?} appears twice")));
            }
        }
        if !keys.contains_key(active) {
            return Err(GrantError::Keys(format!(
                "active key {active:?} is not among the configured keys"
            )));
        }
        Ok(Signer {
            keys,
            active: active.to_owned(),
        })
    }

    /// A signer from key files (mode-checked).
    pub fn from_files(files: &[SigningKeyFile], active: &str) -> Result<Signer, GrantError> {
        let mut seeds = Vec::new();
        for f in files {
            seeds.push((f.id.clone(), load_seed(&f.file)?));
        }
        Signer::new(seeds, active)
    }

    /// The active key's id.
    pub fn active(&self) -> &str {
        &self.active
    }

    /// Every key's public half by id (what verifiers are configured with).
    pub fn public_keys(&self) -> BTreeMap<String, [u8; 32]> {
        self.keys
            .iter()
            .map(|(id, k)| (id.clone(), k.verifying_key().to_bytes()))
            .collect()
    }

    /// Checks and signs a grant with the active key.
    pub fn sign(&self, grant: &Grant) -> Result<SignedGrant, GrantError> {
        check(grant)?;
        let bytes = grant.encode_to_vec();
        let key = &self.keys[&self.active];
        let signature = key.sign(&message(&bytes));
        Ok(SignedGrant {
            grant: bytes,
            key_id: self.active.clone(),
            signature: signature.to_bytes().to_vec(),
        })
    }

    /// Verifies a signed grant against this signer's keys and decodes it.
    pub fn verify(&self, signed: &SignedGrant) -> Result<Grant, GrantError> {
        let key = self
            .keys
            .get(&signed.key_id)
            .ok_or_else(|| GrantError::Verify(format!("unknown key id {:?}", signed.key_id)))?;
        verify_with(&key.verifying_key(), signed)
    }
}

/// Verifies a signed grant with one public key and decodes it.
pub fn verify_with(key: &VerifyingKey, signed: &SignedGrant) -> Result<Grant, GrantError> {
    let sig = ed25519_dalek::Signature::from_slice(&signed.signature)
        .map_err(|e| GrantError::Verify(e.to_string()))?;
    key.verify(&message(&signed.grant), &sig)
        .map_err(|e| GrantError::Verify(e.to_string()))?;
    Grant::decode(signed.grant.as_slice()).map_err(|e| GrantError::Verify(e.to_string()))
}

fn message(grant: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + grant.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(grant);
    m
}

fn check(g: &Grant) -> Result<(), GrantError> {
    let field = |field, reason: &str| {
        Err(GrantError::Field {
            field,
            reason: reason.to_owned(),
        })
    };
    if !valid_id(&g.grant_id) {
        return field("grant_id", "must be 1-128 characters [A-Za-z0-9._:-]");
    }
    for (name, value) in [
        ("fabric", &g.fabric),
        ("node_id", &g.node_id),
        ("instance_id", &g.instance_id),
    ] {
        if value.is_empty() || value.len() > 128 {
            return field(name, "must be 1-128 characters");
        }
    }
    if !g.partition_id.starts_with("ibpart_") {
        return field("partition_id", "must start with ibpart_");
    }
    if !(1..=0x7FFE).contains(&g.pkey) {
        return field("pkey", "must be a P_Key base 0x0001..=0x7FFE");
    }
    if Membership::try_from(g.membership).unwrap_or(Membership::Unspecified)
        == Membership::Unspecified
    {
        return field("membership", "must be FULL or LIMITED");
    }
    if g.issued_at_unix_ms == 0 {
        return field("issued_at_unix_ms", "must be set");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            grant_id: "g-1".into(),
            fabric: "fab1".into(),
            node_id: "node1".into(),
            instance_id: "i-1".into(),
            partition_id: "ibpart_a".into(),
            pkey: 0x10,
            membership: Membership::Full as i32,
            issued_at_unix_ms: 1,
        }
    }

    #[test]
    fn signs_with_the_active_key_and_verifies_domain_separated() {
        let s = Signer::new(vec![("k1".into(), [1; 32]), ("k2".into(), [2; 32])], "k2").unwrap();
        let signed = s.sign(&grant()).unwrap();
        assert_eq!(signed.key_id, "k2");
        assert_eq!(s.verify(&signed).unwrap(), grant());
        // The signature is over the domain-separated message, not the bare bytes.
        let pk = VerifyingKey::from_bytes(&s.public_keys()["k2"]).unwrap();
        let sig = ed25519_dalek::Signature::from_slice(&signed.signature).unwrap();
        assert!(pk.verify(&signed.grant, &sig).is_err());
        let mut tampered = signed.clone();
        tampered.grant[0] ^= 1;
        assert!(s.verify(&tampered).is_err());
        let mut wrong_key = signed;
        wrong_key.key_id = "k1".into();
        assert!(s.verify(&wrong_key).is_err());
    }

    #[test]
    fn bad_grants_and_key_sets_are_refused() {
        let s = Signer::new(vec![("k1".into(), [1; 32])], "k1").unwrap();
        let mut g = grant();
        g.pkey = 0x7FFF;
        assert!(matches!(
            s.sign(&g),
            Err(GrantError::Field { field: "pkey", .. })
        ));
        let mut g = grant();
        g.membership = 0;
        assert!(matches!(
            s.sign(&g),
            Err(GrantError::Field {
                field: "membership",
                ..
            })
        ));
        assert!(Signer::new(vec![("k1".into(), [1; 32])], "k9").is_err());
        assert!(Signer::new(vec![("k1".into(), [1; 32]), ("k1".into(), [2; 32])], "k1").is_err());
    }
}
