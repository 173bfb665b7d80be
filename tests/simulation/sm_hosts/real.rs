//! The node's start check (`agent::start_check`: `judge`, `removals_only`, `ThisLife`, `BOUND`),
//! compiled into this binary from the library's own source: the library keeps the module
//! private, so `real/start_check.rs` and `real/start_check/` are links to
//! `src/agent/start_check.rs` and its directory (its unit tests come along and run here too),
//! and `tests/simulation/main.rs` gives its `crate::domain` and `crate::sm` imports. Not a copy:
//! an edit of the source is what runs here.

#[allow(dead_code)]
pub mod start_check;
