//! Request builders of the SM host's `fabric.sm.v1.Partitions` service.

use fabric_agent::proto::sm as smpb;

/// SetNodeMemberships for `node`: its ports `guids`, each key in `keys` a full member (named
/// `t<key>`), at `generation`.
pub fn set_memberships(
    node: &str,
    guids: &[u64],
    keys: &[u32],
    generation: u64,
) -> smpb::SetNodeMembershipsRequest {
    smpb::SetNodeMembershipsRequest {
        memberships: Some(smpb::NodeMemberships {
            node_id: node.into(),
            port_guids: guids.iter().map(|g| format!("0x{g:016x}")).collect(),
            keys: keys
                .iter()
                .map(|k| smpb::KeyMembership {
                    pkey: *k,
                    full: true,
                    name: format!("t{k:x}"),
                    port_guids: Vec::new(),
                })
                .collect(),
            generation,
            grants: Vec::new(),
        }),
    }
}
