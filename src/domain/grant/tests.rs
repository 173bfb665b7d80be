use super::*;
use ed25519_dalek::{Signer, SigningKey};
use proptest::prelude::*;

fn signing(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn grant() -> Grant {
    Grant {
        grant_id: "g-1".into(),
        fabric: "fab2".into(),
        node_id: "node1".into(),
        instance_id: "inst-a".into(),
        partition_id: "ibpart_a".into(),
        pkey: PKey::new(0x0a11).unwrap(),
        membership: Membership::Full,
        issued_at_unix_ms: 1_000,
    }
}

fn signed_with(key: &SigningKey, key_id: &str, bytes: Vec<u8>) -> SignedGrant {
    SignedGrant {
        signature: key.sign(&signed_message(&bytes)).to_bytes().to_vec(),
        bytes,
        key_id: key_id.into(),
        grant: grant(),
    }
}

fn keys() -> GrantKeys {
    let k = GrantKey::from_bytes("cp-1", signing(7).verifying_key().as_bytes()).unwrap();
    GrantKeys::new([k]).unwrap()
}

#[test]
fn a_valid_grant_verifies_and_checks() {
    let s = signed_with(&signing(7), "cp-1", b"grant bytes".to_vec());
    let g = keys().verify(&s).unwrap();
    let fabric = FabricName::parse("fab2").unwrap();
    let node = NodeId::parse("node1").unwrap();
    let usage = GrantUse {
        fabric: &fabric,
        node_id: &node,
        pkey: PKey::new(0x0a11).unwrap(),
        membership: Membership::Full,
    };
    g.check(&usage).unwrap();
}

#[test]
fn each_refusal_names_what_is_wrong() {
    let ks = keys();
    let s = signed_with(&signing(7), "cp-0", b"x".to_vec());
    assert!(matches!(ks.verify(&s), Err(GrantError::UnknownKeyId { key_id }) if key_id == "cp-0"));
    let s = signed_with(&signing(8), "cp-1", b"x".to_vec());
    assert!(matches!(
        ks.verify(&s),
        Err(GrantError::BadSignature { .. })
    ));
    let mut s = signed_with(&signing(7), "cp-1", b"x".to_vec());
    s.signature.truncate(10);
    assert!(matches!(
        ks.verify(&s),
        Err(GrantError::BadSignature { .. })
    ));

    let fabric = FabricName::parse("fab2").unwrap();
    let node = NodeId::parse("node1").unwrap();
    let usage = |pkey: u32, membership| GrantUse {
        fabric: &fabric,
        node_id: &node,
        pkey: PKey::new(pkey).unwrap(),
        membership,
    };
    let g = grant();
    assert!(matches!(
        g.check(&usage(0x0b22, Membership::Full)),
        Err(GrantError::WrongKey { .. })
    ));
    let mut limited = grant();
    limited.membership = Membership::Limited;
    let e = limited.check(&usage(0x0a11, Membership::Full)).unwrap_err();
    assert!(matches!(e, GrantError::WrongMembership { .. }), "{e}");
    let e = g.check(&usage(0x0a11, Membership::Limited)).unwrap_err();
    assert!(matches!(e, GrantError::WrongMembership { .. }), "{e}");
    let mut other = grant();
    other.node_id = "NODE1".into();
    let e = other.check(&usage(0x0a11, Membership::Full)).unwrap_err();
    assert!(e.to_string().contains("\"NODE1\""), "{e}");
    assert!(matches!(e, GrantError::WrongNode { .. }));
    let mut other = grant();
    other.fabric = "fab3".into();
    assert!(matches!(
        other.check(&usage(0x0a11, Membership::Full)),
        Err(GrantError::WrongFabric { .. })
    ));
}

#[test]
fn key_windows_bound_the_issue_time() {
    let mut k = GrantKey::from_bytes("cp-1", signing(7).verifying_key().as_bytes()).unwrap();
    k.not_before_unix_ms = Some(2_000);
    let ks = GrantKeys::new([k.clone()]).unwrap();
    let s = signed_with(&signing(7), "cp-1", b"x".to_vec());
    assert!(matches!(ks.verify(&s), Err(GrantError::KeyNotValid { .. })));
    k.not_before_unix_ms = None;
    k.not_after_unix_ms = Some(999);
    let ks = GrantKeys::new([k.clone()]).unwrap();
    assert!(matches!(ks.verify(&s), Err(GrantError::KeyNotValid { .. })));
    k.not_after_unix_ms = Some(1_000);
    assert!(GrantKeys::new([k.clone()]).unwrap().verify(&s).is_ok());
    assert_eq!(GrantKeys::new([k.clone(), k]).err(), Some("cp-1".into()));
}

#[test]
fn malformed_ids_are_refused_after_the_signature() {
    let mut s = signed_with(&signing(7), "cp-1", b"x".to_vec());
    s.grant.grant_id = String::new();
    assert!(matches!(keys().verify(&s), Err(GrantError::Malformed(_))));
    assert!(GrantKey::from_bytes("k", &[1; 31]).is_none());
}

proptest! {
    #[test]
    fn any_single_bit_flip_is_refused(
        bytes in proptest::collection::vec(any::<u8>(), 1..64),
        in_signature in any::<bool>(),
        pick in any::<usize>(),
        bit in 0u8..8,
    ) {
        let ks = keys();
        let mut s = signed_with(&signing(7), "cp-1", bytes);
        prop_assert!(ks.verify(&s).is_ok());
        let target = if in_signature { &mut s.signature } else { &mut s.bytes };
        let i = pick % target.len();
        target[i] ^= 1 << bit;
        prop_assert!(ks.verify(&s).is_err());
    }
}
