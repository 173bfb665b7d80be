//! Who may call what on `fabric.sm.v1.Partitions`, decided before the backend sees a call:
//! a certificate may write and read only the node it maps to ([`NodeMapping`]); an operator
//! certificate may read every node and call the operator-only methods; local privileged callers
//! and a plaintext test rig may do anything; a call without a verified caller is refused.

use crate::api::gate::{Caller, ClientId, NodeMapping};
use crate::domain::NodeId;

/// What a call does with a node's memberships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads them.
    Read,
    /// Replaces them.
    Write,
}

/// Why the Partitions service refuses a call before the backend sees it. Mapped to a status
/// in [`super::convert`], the one place for `fabric.sm.v1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionsRefusal {
    /// The request carries no memberships at all.
    #[error("memberships missing")]
    MembershipsMissing,
    /// No caller was verified: the service runs without the call gate.
    #[error("no verified caller: Partitions is only served behind the call gate")]
    NoVerifiedCaller,
    /// A local caller without privilege tried to write.
    #[error("unix uid={uid} may not write node memberships")]
    UidMayNotWrite {
        /// The caller's uid.
        uid: u32,
    },
    /// A certificate that does not map to the node (and, for a read, is not an operator's).
    #[error(
        "{client} may not {verb} the memberships of node \"{node}\": its certificate does not map to that node{hint}",
        verb = if *.access == Access::Write { "write" } else { "read" },
        hint = if *.access == Access::Write { "" } else { " (only operator_clients may read every node)" }
    )]
    NodeNotMapped {
        /// The certificate name that matched the allowlist.
        client: ClientId,
        /// The node asked about.
        node: NodeId,
        /// What the call does.
        access: Access,
    },
    /// The SM host stores no memberships for the node.
    #[error("no memberships stored for node \"{0}\"")]
    NotStored(NodeId),
    /// A call only the control plane or an operator may make (`operator_clients`).
    #[error(
        "{caller} may not call {method}: only operator_clients (the control plane, operators) may"
    )]
    NotOperator {
        /// The caller as the audit names it.
        caller: String,
        /// The method.
        method: &'static str,
    },
    /// A carried grant does not decode.
    #[error("{0}")]
    Grant(String),
}

/// Whether `caller` may call an operator-only method (`RevokeInstance`, `ListPartitionMembers`):
/// a certificate on `operator_clients`, a privileged local caller (root, the agent's user), or
/// the plaintext test rig. A node's certificate is refused.
pub fn authorise_operator(
    caller: Option<&Caller>,
    method: &'static str,
    write: bool,
) -> Result<(), PartitionsRefusal> {
    match caller {
        None => Err(PartitionsRefusal::NoVerifiedCaller),
        Some(Caller::InsecureTest) => Ok(()),
        Some(Caller::Local { privileged, .. }) if *privileged || !write => Ok(()),
        Some(Caller::Cert { operator: true, .. }) => Ok(()),
        Some(c) => Err(PartitionsRefusal::NotOperator {
            caller: c.to_string(),
            method,
        }),
    }
}

/// Whether `caller` may write (or read) `node`'s memberships.
pub fn authorise(
    caller: Option<&Caller>,
    nodes: &NodeMapping,
    node: &NodeId,
    access: Access,
) -> Result<(), PartitionsRefusal> {
    let write = access == Access::Write;
    match caller {
        None => Err(PartitionsRefusal::NoVerifiedCaller),
        Some(Caller::InsecureTest) => Ok(()),
        Some(Caller::Local { privileged, uid }) => {
            if write && !privileged {
                Err(PartitionsRefusal::UidMayNotWrite { uid: *uid })
            } else {
                Ok(())
            }
        }
        Some(Caller::Cert {
            identity,
            matched,
            operator,
        }) => {
            if nodes.maps(identity, node.as_str()) || (!write && *operator) {
                Ok(())
            } else {
                Err(PartitionsRefusal::NodeNotMapped {
                    client: matched.clone(),
                    node: node.clone(),
                    access,
                })
            }
        }
    }
}
