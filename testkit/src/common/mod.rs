//! Test support shared by the integration tests, one purpose a file: the daemon harness
//! ([`daemon`]), the one process guard ([`process`]), request builders ([`requests`]), the CLI
//! ([`cli`](mod@cli)), one-line API calls ([`calls`]), the event log ([`events`](mod@events)),
//! waits with deadlines ([`wait`]), loopback ports ([`net`]), a test CA ([`pki`]), an in-process
//! SM host's parts ([`sm_host`]), `fabric.sm.v1` requests ([`sm_requests`]), a node's desired
//! memberships ([`memberships`](mod@memberships)), a UFM credential file ([`cred`]), signed grants
//! ([`grants`]), fixture trees ([`fixtures`]) and the one way to skip ([`skip`](mod@skip)).

pub mod calls;
pub mod cli;
pub mod cred;
pub mod daemon;
pub mod events;
pub mod fixtures;
pub mod grants;
pub mod memberships;
pub mod net;
pub mod pki;
pub mod process;
pub mod requests;
pub mod skip;
pub mod sm_host;
pub mod sm_requests;
pub mod wait;

pub use calls::*;
pub use cli::*;
pub use daemon::*;
pub use events::*;
pub use fixtures::*;
pub use memberships::memberships;
pub use net::*;
pub use process::BIN;
pub use requests::*;
pub use skip::skip;
pub use wait::*;
