//! The simulation's fixed shape: the partitions and fabric a run attaches to, the node's model
//! ports and their P_Key tables.

/// The partitions a run attaches to: (id, name, P_Key base).
pub const PARTITIONS: [(&str, &str, u16); 4] = [
    ("ibpart_p0", "p0", 0x0012),
    ("ibpart_p1", "p1", 0x0034),
    ("ibpart_p2", "p2", 0x0056),
    ("ibpart_p3", "p3", 0x0078),
];

/// The fabric every partition and the node are on.
pub const FABRIC: &str = "fab1";

/// Model fabric ports of the node.
pub const PORTS: usize = 2;

/// P_Key table size of every model port (default partition included).
pub const TABLE_SIZE: usize = 8;
/// Model port `i`'s GUID is this plus `i`.
pub const PORT_GUID_BASE: u64 = 0x0002_c903_0000_1000;
/// The default partition entry every port holds (limited member: a well-run fabric).
pub const DEFAULT_ENTRY: u16 = 0x7FFF;
