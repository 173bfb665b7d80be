//! An `LD_PRELOAD` interposer for the test rig that gives ibsim's umad2sim shim the kernel's
//! send timeouts.
//!
//! On real hardware the kernel completes every umad send that expects a response
//! (`timeout_ms` > 0): with the response, or after `timeout_ms` × (`retries` + 1) by handing
//! the sent MAD back on `read()` with status `ETIMEDOUT`. umad2sim completes nothing, and
//! ibsim drops every TrapRepress, so an OpenSM's Trap 144 stays outstanding for ever and its
//! sweeper (waiting for zero outstanding MADs) stops (docs/TESTING.md, "Why OpenSM stalls
//! under ibsim"). Loaded before the shim (`LD_PRELOAD=<this>:<umad2sim>`), this library:
//!
//! - tracks the fds `open()` returns for `/dev/infiniband/umad*` until `close()`;
//! - remembers each request written on them with a timeout, and forgets it when `read()`
//!   returns its response (same class and low 32 transaction-id bits) or ibsim's own
//!   completion of it (the request back with a nonzero status, for a MAD ibsim dropped);
//! - at its deadline, returns the request from `read()` with status `ETIMEDOUT`, and wakes a
//!   `poll()` on its fd for it (the shim's poll is called in slices of at most 50 ms).
//!
//! # Layout
//! - [`mad`]: the umad header and MAD fields it reads (pure).
//! - [`table`]: the tracked fds and outstanding requests, matching and deadlines (pure).
//! - `sys`: the exported `open`/`close`/`read`/`write`/`poll` and the next definitions
//!   (`dlsym(RTLD_NEXT)`); the only unsafe code. Left out of unit-test builds, whose test
//!   binary would otherwise interpose on itself.

pub mod mad;
#[cfg(not(test))]
mod sys;
pub mod table;
