//! Exit codes a script can trust.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | done: the requested end state was reached (or no `--wait` was asked) |
//! | 1    | refused: the daemon answered with an error (its gRPC code and message are printed), or the attachment ended in a state the wait cannot reach (FAILED, RELEASED) |
//! | 2    | usage: bad arguments (clap) |
//! | 64   | configuration: the config file is missing or invalid |
//! | 69   | unavailable: the daemon cannot be reached, or it is stopping (a cut-short `--wait` prints the state reached) |
//! | 75   | wait expired: `--wait` ran out; the current state and reason are printed |

/// The daemon refused the call, or the attachment ended elsewhere.
pub const REFUSED: u8 = 1;
/// Bad command-line usage (clap's own code).
pub const USAGE: u8 = 2;
/// The configuration is invalid (sysexits EX_USAGE).
pub const CONFIG: u8 = 64;
/// The daemon cannot be reached (sysexits EX_UNAVAILABLE).
pub const UNREACHABLE: u8 = 69;
/// `--wait` expired before the requested state (sysexits EX_TEMPFAIL).
pub const WAIT_EXPIRED: u8 = 75;
