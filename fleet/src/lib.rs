//! `fabric-fleet`: the control plane's client of fabric-agent.
//!
//! It signs grants ([`grant::Signer`]), follows every node's event stream resumably
//! ([`Fleet::follow`]: cursor = log epoch + seq, persisted with the view it summarises; a full
//! resync through ListAttachments when the cursor is refused or the epoch changed), aggregates
//! per partition ([`view::View`]) and answers whether a partition may be deleted
//! ([`Fleet::may_delete`], rules in [`guard`]). It depends on the gRPC contract in `proto/`
//! only, never on the agent crate.
//!
//! # Layout
//! - `proto`    generated code of `fabric.agent.v1`, `fabric.sm.v1`, `fabric.grant.v1`
//! - `grant`    key files and the rotating Ed25519 signer
//! - `registry` the nodes file: nodes, SM hosts, signing keys, follower tuning
//! - `connect`  channels: unix, loopback plaintext, mTLS with the expected identity
//! - `backoff`  capped jittered reconnect delays
//! - `sm_state` a node's subnet-manager state: reachable, refused, unreachable, unknown
//! - `view`     the aggregated view and the rules for applying events (pure)
//! - `store`    redb: node records (cursor + view) and the attach ledger
//! - `follower` one node's resumable follower
//! - `guard`    the delete guard's rules (pure) and blockers
//! - `fabric_side` revocations and P_Key retirements sent to every SM host
//! - `fleet`    the composition: followers, store writer, attach/release helpers, the guard's I/O
//! - `cli`      the `fabric-fleet` binary's subcommands and exit codes

#![forbid(unsafe_code)]
pub mod backoff;
pub mod cli;
pub mod connect;
pub mod fabric_side;
pub mod fleet;
mod follower;
pub mod grant;
pub mod guard;
pub mod proto;
pub mod registry;
pub mod sm_state;
pub mod store;
pub mod view;

pub use fleet::{AttachSpec, Deleted, Fleet, FleetError};
pub use guard::{Blocker, Decision, GuardError};
