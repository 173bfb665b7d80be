//! Test support shared by the integration tests, one purpose a file: the daemon harness
//! ([`daemon`]), the one process guard ([`process`]), request builders ([`requests`]), one-line
//! API calls ([`calls`]), the event log ([`events`]), waits with deadlines ([`wait`]), loopback
//! ports ([`net`]), a test CA ([`pki`]), an in-process SM host's parts ([`sm_host`]) and fixture
//! trees ([`fixtures`]).

#![allow(dead_code, unused_imports)]

pub mod calls;
pub mod daemon;
pub mod events;
pub mod fixtures;
pub mod net;
pub mod pki;
pub mod process;
pub mod requests;
pub mod sm_host;
pub mod wait;

pub use calls::*;
pub use daemon::*;
pub use events::*;
pub use fixtures::*;
pub use net::*;
pub use process::BIN;
pub use requests::*;
pub use wait::*;
