//! Whether a port this node no longer reads is still in the fabric, by the subnet manager's
//! word. A covered port missing from the port read blocks RELEASED (it may still hold the key)
//! unless the subnet administrator, asked through one of this node's ports that is still in the
//! fabric, answers that it has no NodeRecord for the port's GUID: then the port is not in the
//! subnet, and should it come back the SM sweeps it in and programs its table from the current
//! partitions before it passes traffic (as for a DOWN port).
//!
//! The SA hides from a requester every port that shares no partition with it, so that answer
//! counts only when the asking port is a full member of the default partition (see
//! [`super::smp::SmpObserver::presence`]). Any other outcome (no SA path, no master SM, an asking port that
//! is a limited member, a timeout, an error status) is [`Presence::Unknown`] and the port stays
//! blocking.

use crate::domain::Guid;

/// What the subnet manager says of one port GUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// The SA has a NodeRecord for it: the port is in the subnet.
    Shown,
    /// The SA answered "no records": the port is not in the subnet.
    Gone,
    /// The SA could not be asked or gave no usable answer (why).
    Unknown(String),
}

/// Every answer [`Presence::Unknown`] for `why`.
pub fn unknown(guids: &[Guid], why: &str) -> Vec<Presence> {
    guids
        .iter()
        .map(|_| Presence::Unknown(why.to_owned()))
        .collect()
}
