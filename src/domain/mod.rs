//! Domain types: P_Keys, GUIDs, partitions, attachments, ports and events. Pure: no I/O.

mod attachment;
mod condition;
mod error;
mod event;
mod grant;
mod guid;
mod ident;
mod ledger;
mod membership;
mod node;
mod partition;
mod pkey;
mod port;
mod sm_hosts;
mod sm_state;

pub use attachment::{Attachment, AttachmentState, InstanceId, Restored};
pub use condition::{Condition, ConditionKind};
pub use error::DomainError;
pub use event::{Event, EventKind, Evidence, PortReading};
pub use grant::{
    is_grant_id, signed_message, Grant, GrantError, GrantKey, GrantKeys, GrantLifetime,
    GrantPolicy, GrantUse, RetiredKeys, SignedGrant, SIGNING_CONTEXT,
};
pub use guid::Guid;
pub use ident::{validate_label, LabelRules};
pub use ledger::{set_digest, AckedSet, ApplyLedger, SentSet};
pub use membership::{KeySetting, Membership, NodeMemberships};
pub use node::{is_safe_key_name, NodeId, KEY_NAME_MAX};
pub use partition::{FabricName, Partition, PartitionId};
pub use pkey::{PKey, PKeyValue};
pub use port::{AttachmentPort, Inventory, LinkLayer, PortInfo, PortName, PortSelector, PortState};
pub use sm_hosts::{FencedSmHostView, SmHostMiss, SmHostMissKind, SmHostSet};
pub use sm_state::SmState;
