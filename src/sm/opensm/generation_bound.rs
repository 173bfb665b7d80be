//! How far a generation learned from a peer SM host may go. A node's generations are its own
//! persisted counter, and an SM host refuses any above [`NODE_GENERATION_MAX`] (2^53): a set
//! adopted from a peer near that bound would leave the node unable to send a newer one, refused
//! for ever. So a peer's set for a node is adopted only if its generation is
//!
//! - at most [`ADOPT_CEILING`] (`NODE_GENERATION_MAX - HEADROOM`): the node can always send
//!   [`HEADROOM`] (2^32) more generations after any set a peer gave this host; and
//! - at most [`PEER_LEAD`] (2^20: a thousand of the node's reserved blocks of 1024) above the
//!   generation this host stores for the node, when it stores one: a peer is ahead of this host
//!   only by the applies this host missed.
//!
//! A set refused here stays with the peer; the node's own requests are judged as ever (the node
//! sends to every SM host). A node already stranded (a generation above the ceiling stored
//! before this rule, or sent by the node itself) is reset by [`reset_stranded`] on every SM host,
//! the agent stopped there (`fabric-agent reset-node-generation`): its stored generation becomes
//! 0, its set, grants and revocations are kept (the partitions file does not change), and no
//! other node is touched. The hosts may be reset one at a time: a host already reset refuses the
//! others' generation above the ceiling.

use super::peer_state::PeerSet;
use super::store::{NodeMembershipStore, NodeStoreError};
use thiserror::Error;

/// The highest generation an SM host accepts from a node (`fabric.sm.v1`'s `MAX_GENERATION`).
pub const NODE_GENERATION_MAX: u64 = 1 << 53;

/// Generations a node can always still send after a set adopted from a peer.
pub const HEADROOM: u64 = 1 << 32;

/// The highest generation adopted from a peer.
pub const ADOPT_CEILING: u64 = NODE_GENERATION_MAX - HEADROOM;

/// How far above this host's stored generation of a node a peer's may be.
pub const PEER_LEAD: u64 = 1 << 20;

/// Why a peer's generation for a node is not adopted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BoundRefusal {
    /// Past the ceiling: the node could not send enough newer generations after it.
    #[error(
        "generation {generation} is above {ADOPT_CEILING} (2^53 - 2^32): adopting it would leave \
         the node too few generations before the bound of 2^53"
    )]
    AboveCeiling {
        /// The peer's generation.
        generation: u64,
    },
    /// Too far ahead of this host's stored generation.
    #[error(
        "generation {generation} is more than {PEER_LEAD} above this host's {stored} for the node"
    )]
    TooFarAhead {
        /// The peer's generation.
        generation: u64,
        /// This host's stored generation.
        stored: u64,
    },
}

/// Whether a peer's `generation` for a node may be adopted by a host that stores `stored` for
/// it (`None`: none).
pub fn check(generation: u64, stored: Option<u64>) -> Result<(), BoundRefusal> {
    if generation > ADOPT_CEILING {
        return Err(BoundRefusal::AboveCeiling { generation });
    }
    match stored {
        Some(stored) if generation > stored.saturating_add(PEER_LEAD) => {
            Err(BoundRefusal::TooFarAhead { generation, stored })
        }
        _ => Ok(()),
    }
}

/// [`check`] for a set from the peer `peer`, against what `stored` gives for its node; a refusal
/// is logged with its reason.
pub fn admits(peer: &str, set: &PeerSet, stored: impl FnOnce(&str) -> Option<u64>) -> bool {
    let node = set.memberships.node_id.as_str();
    match check(set.generation, stored(node)) {
        Ok(()) => true,
        Err(why) => {
            tracing::warn!(peer, node_id = node, reason = %why, "refused a peer's set for the node: its generation is out of bounds");
            false
        }
    }
}

/// Why a node's generation could not be reset.
#[derive(Debug, Error)]
pub enum ResetError {
    /// This host stores nothing for the node.
    #[error("this SM host stores no set for node {0}")]
    Unknown(String),
    /// The node is not stranded: its generation leaves it room.
    #[error(
        "node {node} is not stranded: its stored generation {generation} is at most {ADOPT_CEILING}; \
         nothing changed"
    )]
    NotStranded {
        /// The node.
        node: String,
        /// Its stored generation.
        generation: u64,
    },
    /// The store failed.
    #[error("the SM host's store: {0}")]
    Store(#[from] NodeStoreError),
}

/// Resets a stranded node on this SM host: its stored generation, above [`ADOPT_CEILING`],
/// becomes 0, in one transaction that leaves its set, grants and revocations and every other
/// node as they are. Returns the generation it replaced.
pub fn reset_stranded(store: &dyn NodeMembershipStore, node: &str) -> Result<u64, ResetError> {
    let mut stored = store
        .load_all()?
        .into_iter()
        .find(|n| n.memberships.node_id.as_str() == node)
        .ok_or_else(|| ResetError::Unknown(node.to_owned()))?;
    let before = stored.generation;
    if before <= ADOPT_CEILING {
        return Err(ResetError::NotStranded {
            node: node.to_owned(),
            generation: before,
        });
    }
    stored.generation = 0;
    store.put_group(&[stored], None)?;
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::opensm::store::{InMemoryNodeStore, StoredNode};

    #[test]
    fn the_bound_is_the_protocols_own() {
        assert_eq!(
            NODE_GENERATION_MAX,
            crate::api::sm_v1::convert::MAX_GENERATION
        );
    }

    #[test]
    fn peers_generations_are_bounded_by_the_ceiling_and_the_lead() {
        assert_eq!(check(7, None), Ok(()));
        assert_eq!(check(ADOPT_CEILING, None), Ok(()));
        assert_eq!(
            check(NODE_GENERATION_MAX, None),
            Err(BoundRefusal::AboveCeiling {
                generation: NODE_GENERATION_MAX
            })
        );
        assert_eq!(check(100 + PEER_LEAD, Some(100)), Ok(()));
        assert_eq!(
            check(101 + PEER_LEAD, Some(100)),
            Err(BoundRefusal::TooFarAhead {
                generation: 101 + PEER_LEAD,
                stored: 100
            })
        );
        assert!(check(u64::MAX, Some(u64::MAX)).is_err());
    }

    fn node(id: &str, generation: u64) -> StoredNode {
        let m = crate::domain::NodeMemberships {
            node_id: crate::domain::NodeId::try_from(id.to_owned()).unwrap(),
            port_guids: vec![],
            keys: Default::default(),
        };
        StoredNode::new(m, generation)
    }

    #[test]
    fn a_reset_lowers_only_the_stranded_nodes_generation() {
        let store = InMemoryNodeStore::default();
        store
            .put_group(&[node("n1", NODE_GENERATION_MAX), node("n2", 42)], None)
            .unwrap();
        assert!(matches!(
            reset_stranded(&store, "n2"),
            Err(ResetError::NotStranded { generation: 42, .. })
        ));
        assert!(matches!(
            reset_stranded(&store, "n3"),
            Err(ResetError::Unknown(_))
        ));
        assert_eq!(reset_stranded(&store, "n1").unwrap(), NODE_GENERATION_MAX);
        let after = store.load_all().unwrap();
        let g = |id: &str| {
            after
                .iter()
                .find(|n| n.memberships.node_id.as_str() == id)
                .unwrap()
                .generation
        };
        assert_eq!((g("n1"), g("n2")), (0, 42));
        // Any generation the node sends is newer now.
        let n1 = after
            .iter()
            .find(|n| n.memberships.node_id.as_str() == "n1")
            .unwrap();
        assert_eq!(n1.fence(&n1.memberships, 1), Ok(false));
    }
}
