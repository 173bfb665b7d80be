//! Table definitions. Values are JSON so the schema can grow with `#[serde(default)]` fields.

use redb::TableDefinition;

/// instance id -> Attachment.
pub const ATTACHMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("attachments");
/// seq -> Event.
pub const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// Small named values: the last event seq, the simulated fabric's tables.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// node id -> that node's desired memberships (SM-host service).
pub const SM_NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_nodes");
/// Index: instance ids of attachments that are not RELEASED (what the reconciler works on), so
/// its cost does not grow with the node's history.
pub const LIVE: TableDefinition<&str, ()> = TableDefinition::new("live_attachments");
/// Index: (updated_unix_ns, instance id) of RELEASED attachments, oldest first, for pruning on
/// time.
pub const RELEASED_AT: TableDefinition<(i64, &str), ()> = TableDefinition::new("released_at");
