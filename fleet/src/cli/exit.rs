//! Exit codes, in one place.

/// Success; for `may-delete`: the partition may be deleted.
pub const OK: u8 = 0;
/// `may-delete`: not yet (blockers printed).
pub const NO: u8 = 1;
/// Bad arguments, nodes file or key file (sysexits EX_USAGE).
pub const USAGE: u8 = 64;
/// A node or SM host could not be asked, or the guard cannot decide (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// The store failed (EX_SOFTWARE would hide it; EX_IOERR).
pub const IO: u8 = 74;
