//! The `fabric.grant.v1` boundary: a carried `SignedGrant` -> the domain's [`SignedGrant`] (its
//! bytes decoded once into a [`Grant`], never re-encoded), and back for the wire.

use crate::domain::{Grant, GrantError, Membership, PKey, SignedGrant};
use crate::proto::grant as pb;
use prost::Message;

/// Decodes a carried grant. The signature is not checked here
/// ([`crate::domain::GrantKeys::verify`] does).
pub fn signed_grant_from_proto(g: &pb::SignedGrant) -> Result<SignedGrant, GrantError> {
    let m = pb::Grant::decode(g.grant.as_slice())
        .map_err(|e| GrantError::Malformed(format!("the grant bytes do not decode: {e}")))?;
    let pkey = PKey::new(m.pkey)
        .map_err(|e| GrantError::Malformed(format!("grant {:?}: {e}", m.grant_id)))?;
    let membership = match pb::Membership::try_from(m.membership) {
        Ok(pb::Membership::Full) => Membership::Full,
        Ok(pb::Membership::Limited) => Membership::Limited,
        _ => {
            return Err(GrantError::Malformed(format!(
                "grant {:?}: membership must be FULL or LIMITED",
                m.grant_id
            )))
        }
    };
    Ok(SignedGrant {
        bytes: g.grant.clone(),
        key_id: g.key_id.clone(),
        signature: g.signature.clone(),
        grant: Grant {
            grant_id: m.grant_id,
            fabric: m.fabric,
            node_id: m.node_id,
            instance_id: m.instance_id,
            partition_id: m.partition_id,
            pkey,
            membership,
            issued_at_unix_ms: m.issued_at_unix_ms,
        },
    })
}

/// The wire form of a carried grant (its original bytes).
pub fn signed_grant_to_proto(g: &SignedGrant) -> pb::SignedGrant {
    pb::SignedGrant {
        grant: g.bytes.clone(),
        key_id: g.key_id.clone(),
        signature: g.signature.clone(),
    }
}

/// Encodes a grant for signing (what the control plane, or `fabric-agent grant sign`, does).
pub fn encode_grant(g: &Grant) -> Vec<u8> {
    pb::Grant {
        grant_id: g.grant_id.clone(),
        fabric: g.fabric.clone(),
        node_id: g.node_id.clone(),
        instance_id: g.instance_id.clone(),
        partition_id: g.partition_id.clone(),
        pkey: u32::from(g.pkey.base()),
        membership: match g.membership {
            Membership::Full => pb::Membership::Full as i32,
            Membership::Limited => pb::Membership::Limited as i32,
        },
        issued_at_unix_ms: g.issued_at_unix_ms,
    }
    .encode_to_vec()
}

/// Parses the base64 text of an encoded `SignedGrant` (what `fabric-agent grant sign` prints).
pub fn signed_grant_from_base64(text: &str) -> Result<pb::SignedGrant, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("the grant is not base64: {e}"))?;
    pb::SignedGrant::decode(bytes.as_slice())
        .map_err(|e| format!("the grant is not an encoded fabric.grant.v1.SignedGrant: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{signed_message, GrantKey, GrantKeys};
    use ed25519_dalek::{Signer, SigningKey};
    use proptest::prelude::*;

    fn grant() -> Grant {
        Grant {
            grant_id: "g-1".into(),
            fabric: "fab2".into(),
            node_id: "node1".into(),
            instance_id: "i-1".into(),
            partition_id: "ibpart_1".into(),
            pkey: PKey::new(0x0a11).unwrap(),
            membership: Membership::Limited,
            issued_at_unix_ms: 42,
        }
    }

    fn signed() -> (pb::SignedGrant, GrantKeys) {
        let sk = SigningKey::from_bytes(&[3; 32]);
        let bytes = encode_grant(&grant());
        let wire = pb::SignedGrant {
            signature: sk.sign(&signed_message(&bytes)).to_bytes().to_vec(),
            grant: bytes,
            key_id: "k".into(),
        };
        let keys =
            GrantKeys::new([GrantKey::from_bytes("k", sk.verifying_key().as_bytes()).unwrap()])
                .unwrap();
        (wire, keys)
    }

    #[test]
    fn round_trips_and_verifies() {
        let (wire, keys) = signed();
        let g = signed_grant_from_proto(&wire).unwrap();
        assert_eq!(g.grant, grant());
        assert_eq!(keys.verify(&g).unwrap(), &grant());
        assert_eq!(signed_grant_to_proto(&g), wire);
    }

    proptest! {
        #[test]
        fn any_single_bit_flip_of_the_wire_grant_is_refused(
            in_signature in any::<bool>(), pick in any::<usize>(), bit in 0u8..8,
        ) {
            let (mut wire, keys) = signed();
            let target = if in_signature { &mut wire.signature } else { &mut wire.grant };
            let i = pick % target.len();
            target[i] ^= 1 << bit;
            let refused = match signed_grant_from_proto(&wire) {
                Err(_) => true,
                Ok(g) => keys.verify(&g).is_err(),
            };
            prop_assert!(refused);
        }
    }
}
