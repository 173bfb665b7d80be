//! Why the UFM broker refused a node's call or could not confirm it.

use crate::domain::{DomainError, GrantError, Guid, NodeId, PKey};
use crate::sm::fabric_side::{FabricSideError, FabricSideErrorKind};
use crate::sm::opensm::NodeStoreError;
use crate::sm::SmError;
use std::sync::Arc;

/// A UFM broker failure, typed; `api::sm_v1` maps it to a status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// Bad node id, GUID, key or name.
    #[error("invalid request: {0}")]
    Invalid(#[source] DomainError),
    /// The broker holds a newer generation of this node's set (or the same generation with a
    /// different set).
    #[error("generation {sent} refused: the broker holds generation {stored} of this node's set")]
    StaleGeneration {
        /// The generation the request carried.
        sent: u64,
        /// The generation stored for the node.
        stored: u64,
    },
    /// A key of the set has no valid, unconsumed grant (or a carried grant is refused).
    #[error("node {node:?}: key {pkey} refused: {error}")]
    GrantRefused {
        /// The node whose set was refused.
        node: NodeId,
        /// The key.
        pkey: PKey,
        /// What is wrong.
        error: Box<GrantError>,
    },
    /// UFM's port inventory does not show the claimed port in the node.
    #[error("port ownership: UFM's port inventory {} port {port} in node {node:?}", match .shown { Some(s) => format!("shows {s}, not"), None => "does not list".to_owned() })]
    PortNotOwned {
        /// The claiming node.
        node: NodeId,
        /// The port.
        port: Guid,
        /// Where UFM shows the port (`system_name` / node description), when it lists it.
        shown: Option<String>,
    },
    /// Another node's stored set holds the port.
    #[error("invalid request: port {port} belongs to node {owner:?}")]
    PortHeld {
        /// The port.
        port: Guid,
        /// The node that holds it.
        owner: NodeId,
    },
    /// UFM's port inventory could not be read: no new port claim is accepted (fail closed).
    #[error("port ownership: UFM's port inventory could not be read: {0}")]
    Inventory(#[source] SmError),
    /// UFM did not take (or could not be shown holding) the set.
    #[error("{0}")]
    Ufm(#[source] SmError),
    /// The broker's store failed.
    #[error("{0}")]
    Store(#[source] NodeStoreError),
    /// A blocking store task failed.
    #[error("the broker's store task failed: {0}")]
    Task(#[source] Arc<tokio::task::JoinError>),
    /// A revocation on a broker that does not require grants: no grant was ever recorded.
    #[error("this broker does not require grants ([grants] require = false), so it records none to revoke")]
    GrantsNotRequired,
    /// A revocation for a node the broker holds no set of.
    #[error("no memberships stored for node {0:?}")]
    NodeNotStored(NodeId),
}

impl From<BrokerError> for SmError {
    fn from(e: BrokerError) -> Self {
        use crate::sm::SmFailure;
        match e {
            BrokerError::StaleGeneration { sent, stored } => {
                SmError::StaleGeneration { sent, stored }
            }
            BrokerError::Ufm(e) | BrokerError::Inventory(e) => e,
            BrokerError::Store(_) | BrokerError::Task(_) => {
                SmError::Unreachable(SmFailure::Broker(Arc::new(e)))
            }
            _ => SmError::Refused(SmFailure::Broker(Arc::new(e))),
        }
    }
}

impl From<BrokerError> for FabricSideError {
    fn from(e: BrokerError) -> Self {
        use FabricSideErrorKind as K;
        let kind = match &e {
            BrokerError::Invalid(_) | BrokerError::PortHeld { .. } => K::Invalid,
            BrokerError::StaleGeneration { sent, stored } => K::StaleGeneration {
                sent: *sent,
                stored: *stored,
            },
            BrokerError::GrantRefused { .. } | BrokerError::PortNotOwned { .. } => K::Denied,
            BrokerError::GrantsNotRequired => K::Precondition,
            BrokerError::NodeNotStored(_) => K::NotFound,
            BrokerError::Ufm(SmError::Refused(_)) | BrokerError::Inventory(SmError::Refused(_)) => {
                K::Precondition
            }
            BrokerError::Ufm(_)
            | BrokerError::Inventory(_)
            | BrokerError::Store(_)
            | BrokerError::Task(_) => K::Unavailable,
        };
        FabricSideError::new(kind, e)
    }
}
