//! Grants the way the control plane makes them: an Ed25519 key pair, a `fabric.grant.v1.Grant`
//! encoded and signed over `"fabric.grant.v1\n" || bytes`, and the `[grants]` config section
//! that trusts the public key.

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey};
use fabric_agent::api::grant_v1::encode_grant;
use fabric_agent::domain::{signed_message, Grant, Membership, PKey};
use fabric_agent::proto::grant as gpb;

/// A signing key with its id.
pub struct GrantSigner {
    /// The key id grants name.
    pub id: String,
    key: SigningKey,
}

impl GrantSigner {
    /// A fresh key pair (random seed).
    pub fn new(id: &str) -> GrantSigner {
        let seed: [u8; 32] = rand::random();
        GrantSigner {
            id: id.to_owned(),
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// The public key, base64.
    pub fn public_b64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.key.verifying_key().as_bytes())
    }

    /// A `[[grants.keys]]` entry trusting this key (plus `extra` lines, e.g. `not_after`).
    pub fn config_entry(&self, extra: &str) -> String {
        format!(
            "[[grants.keys]]\nid = \"{}\"\npublic_key = \"{}\"\n{extra}",
            self.id,
            self.public_b64()
        )
    }

    /// Signs `grant` as this key.
    pub fn sign(&self, grant: &Grant) -> gpb::SignedGrant {
        self.sign_as(grant, &self.id)
    }

    /// Signs `grant` with this key but names `key_id` (a forgery when that id is another key).
    pub fn sign_as(&self, grant: &Grant, key_id: &str) -> gpb::SignedGrant {
        let bytes = encode_grant(grant);
        gpb::SignedGrant {
            signature: self.key.sign(&signed_message(&bytes)).to_bytes().to_vec(),
            grant: bytes,
            key_id: key_id.to_owned(),
        }
    }
}

/// Milliseconds since the Unix epoch now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A grant for `node`/`instance` of key `pkey` with `membership`, on `fabric`, issued now.
pub fn grant(
    id: &str,
    fabric: &str,
    node: &str,
    instance: &str,
    pkey: u32,
    membership: Membership,
) -> Grant {
    Grant {
        grant_id: id.into(),
        fabric: fabric.into(),
        node_id: node.into(),
        instance_id: instance.into(),
        partition_id: format!("ibpart_{pkey:04x}"),
        pkey: PKey::new(pkey).unwrap(),
        membership,
        issued_at_unix_ms: now_ms(),
    }
}
