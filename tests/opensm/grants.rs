//! Grant enforcement in the SM host's OpenSM backend, in process (no OpenSM: reloads accepted):
//! consumption survives a restart and holds for every node; a revocation keeps a key another
//! grant of the node still justifies; a release needs no grant but a membership change does; an
//! SM host that does not require grants has nothing to revoke. The fabric-level cases (smpquery,
//! mTLS, audit) are in tests/trust/grants.rs.

use testkit::common;

use common::grants::{grant, GrantSigner};
use common::sm_host::AcceptingReloader;
use fabric_agent::api::grant_v1::signed_grant_from_proto;
use fabric_agent::domain::{
    FabricName, GrantKey, GrantKeys, GrantPolicy, Guid, KeySetting, Membership, NodeId,
    NodeMemberships, PKey, SignedGrant,
};
use fabric_agent::sm::opensm::{
    InMemoryNodeStore, NodeMembershipStore, OpenSmBackend, OpenSmConfig, OpenSmError,
    OwnershipConfig,
};
use std::path::Path;
use std::sync::Arc;

const KEY: u32 = 0x0a11;

fn backend(
    file: &Path,
    store: Arc<InMemoryNodeStore>,
    signer: &GrantSigner,
    require: bool,
) -> OpenSmBackend {
    let key = fabric_agent::config::decode_public_key(&signer.id, &signer.public_b64()).unwrap();
    let keys: GrantKeys = GrantKeys::new([key as GrantKey]).unwrap();
    OpenSmBackend::with_reloader(
        OpenSmConfig {
            partitions_file: file.to_owned(),
            pid: Some(12345),
            ownership: OwnershipConfig::disabled(),
            grants: Some(GrantPolicy {
                require,
                fabric: FabricName::parse("fab1").unwrap(),
                keys,
            }),
            ..OpenSmConfig::default()
        },
        "smhost".into(),
        store as Arc<dyn NodeMembershipStore>,
        Arc::new(AcceptingReloader),
    )
    .unwrap()
}

fn set(node: &str, guid: u64, keys: &[(u32, Membership)]) -> NodeMemberships {
    NodeMemberships {
        node_id: NodeId::parse(node).unwrap(),
        port_guids: vec![Guid(guid)],
        keys: keys
            .iter()
            .map(|(k, m)| {
                (
                    PKey::new(*k).unwrap(),
                    KeySetting {
                        membership: *m,
                        name: format!("t{k:x}"),
                        ports: None,
                    },
                )
            })
            .collect(),
    }
}

fn signed(s: &GrantSigner, id: &str, node: &str, instance: &str, m: Membership) -> SignedGrant {
    signed_grant_from_proto(&s.sign(&grant(id, "fab1", node, instance, KEY, m))).unwrap()
}

fn consumed(e: OpenSmError) -> bool {
    matches!(&e, OpenSmError::GrantRefused { error, .. } if error.to_string().contains("consumed"))
}

#[tokio::test]
async fn grants_are_consumed_durably_and_revocation_keeps_other_grants() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("partitions.conf");
    std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let store = Arc::new(InMemoryNodeStore::default());
    let cp = GrantSigner::new("cp");
    let full = [(KEY, Membership::Full)];
    let sm = backend(&file, store.clone(), &cp, true);

    // Two instances of one partition on node1: two grants justify the key.
    let (g1, g2) = (
        signed(&cp, "g1", "node1", "i-1", Membership::Full),
        signed(&cp, "g2", "node1", "i-2", Membership::Full),
    );
    sm.set_node_granted(set("node1", 1, &full), &[g1.clone(), g2.clone()], 1)
        .await
        .unwrap();
    // Revoking i-1 consumes g1 and keeps the key (g2 still justifies it).
    let r = sm
        .revoke_instance(&NodeId::parse("node1").unwrap(), "i-1")
        .await
        .unwrap();
    assert_eq!(r.revoked_grant_ids, vec!["g1".to_owned()]);
    assert!(r.removed_pkeys.is_empty());
    assert!(std::fs::read_to_string(&file).unwrap().contains("0x0a11"));
    let e = sm
        .set_node_granted(set("node1", 1, &full), &[g1.clone(), g2.clone()], 2)
        .await
        .unwrap_err();
    assert!(consumed(e));
    // The node drops i-2's grant with its key (a release): no grant needed, g2 consumed.
    sm.set_node_granted(set("node1", 1, &[]), &[], 3)
        .await
        .unwrap();
    assert!(!std::fs::read_to_string(&file).unwrap().contains("0x0a11"));

    // After a restart on the same store, both stay consumed, for every node.
    drop(sm);
    let sm = backend(&file, store.clone(), &cp, true);
    let e = sm
        .set_node_granted(set("node1", 1, &full), std::slice::from_ref(&g2), 4)
        .await
        .unwrap_err();
    assert!(consumed(e));
    let reused = signed(&cp, "g2", "node2", "i-3", Membership::Full);
    let e = sm
        .set_node_granted(set("node2", 2, &full), &[reused], 1)
        .await
        .unwrap_err();
    assert!(consumed(e));
    // A grant naming the revoked instance is refused even with a fresh id.
    let fresh = signed(&cp, "g9", "node1", "i-1", Membership::Full);
    assert!(consumed(
        sm.set_node_granted(set("node1", 1, &full), &[fresh], 5)
            .await
            .unwrap_err()
    ));

    // Changing a held key's membership needs a grant for the new membership.
    let g4 = signed(&cp, "g4", "node3", "i-4", Membership::Full);
    sm.set_node_granted(set("node3", 3, &full), &[g4], 1)
        .await
        .unwrap();
    let e = sm
        .set_node_granted(set("node3", 3, &[(KEY, Membership::Limited)]), &[], 2)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no grant for key"), "{e}");
    // The same set again without grants (still held, same membership) is served.
    sm.set_node_granted(set("node3", 3, &full), &[], 3)
        .await
        .unwrap();
}

#[tokio::test]
async fn without_required_grants_there_is_nothing_to_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("partitions.conf");
    std::fs::write(&file, "Default=0x7fff : ALL=limited, SELF=full ;\n").unwrap();
    let cp = GrantSigner::new("cp");
    let sm = backend(&file, Arc::new(InMemoryNodeStore::default()), &cp, false);
    sm.set_node_granted(set("node1", 1, &[(KEY, Membership::Full)]), &[], 1)
        .await
        .unwrap();
    let e = sm
        .revoke_instance(&NodeId::parse("node1").unwrap(), "i-1")
        .await
        .unwrap_err();
    assert!(matches!(e, OpenSmError::GrantsNotRequired), "{e}");
}
