//! OpenSM backend (SM host): the agent owns one marked region of OpenSM's `partitions.conf`.
//!
//! # Layout
//! - [`model`]   — typed `partitions.conf`: entries, members, warnings, fatal errors
//! - [`parse`]   — strict reader that walks the file exactly as OpenSM 3.3 does
//! - [`render`]  — typed entries to text that parses back unchanged
//! - [`region`]  — the agent's marked region: split, render, compose, final checks
//! - [`mod@file`] — atomic replace (temp file + fsync + rename + directory fsync)
//! - [`reload`]  — forcing a heavy sweep (SIGHUP or console) and reading OpenSM's log
//! - [`log_check`] — that the configured log is the one OpenSM writes (checked at start)
//! - [`log_line`] — OpenSM's log lines read by structure: the only lines whose verdict (SUBNET UP, rejection, state) is trusted
//! - [`mkey_check`] — OpenSM's M_Key settings (`doctor`): without M_Key protection a host can write its own P_Key table
//! - [`repair`]  — what is kept so a rejection is repaired whenever it happened
//! - [`store`]   — persistence of every node's desired memberships
//! - [`sa_client`] — the local port and SA NodeRecords over umad (who owns a port GUID)
//! - [`operator`] — the operator's own file (`operator_file`), `opensm apply`, the live file's lock
//! - [`ownership`] — whether a claimed port GUID is the node's: fabric, inventory, holders
//! - [`isolation`] — one node's problem stays that node's: refused ports, releases, quarantine
//! - [`members`] — the ports the accepted partitions file puts in one key (`ListPartitionMembers`'s fallback)
//! - [`sa_members`] — the ports the SA's P_KeyTableRecords show holding one key (`ListPartitionMembers`)
//! - [`config`]  — `[subnet_manager.opensm]` settings
//! - [`error`]   — why a request was not applied, what OpenSM rejected and what was restored
//! - [`admission`] — what of a node's set is admitted: the fencing check, claims, validation
//! - [`group_commit`] — requests arriving during a commit share the next one (knows no OpenSM)
//! - [`file_commit`] — one write of the file: paths, health, confirmation, restore, repair; `outcome` what an accepted or rejected write does, `log_watch` the log watch
//! - [`backend`] — the glue: admission, group commit and file commit as [`crate::sm::SubnetManager`]
//! - [`fabric_side`] — the backend as [`crate::sm::FabricSide`] (what `fabric.sm.v1.Partitions` calls)
//! - [`peers`]   — `[subnet_manager.opensm_ha]`: the fabric's other SM hosts (several SM hosts)
//! - [`sync`]    — anti-entropy with the peers and the catch-up gate (highest generation wins)
//! - [`host_conditions`] — an SM host's start and own-OpenSM conditions (not caught up, OpenSM not running)
//! - [`running_start`] — a start beside a running OpenSM: held-back sets keep the keys the running file holds
//! - [`standby`] — confirming a write to a standby OpenSM's file (it reads it when it takes over)
//! - [`opensm_state`] — OpenSM's SM state (master, standby, ...) and what its log last announced
//! - [`sminfo`]  — this host's OpenSM role from the SM's own SMInfo (OpenSM's log as the fallback)

pub mod admission;
pub mod backend;
pub mod config;
pub mod error;
pub mod fabric_side;
pub mod fence;
pub mod fenced_host;
pub mod file;
pub mod file_commit;
pub mod generation_bound;
pub mod group_commit;
pub mod host_conditions;
pub mod isolation;
pub mod log_check;
pub mod log_line;
pub mod members;
pub mod mkey_check;
pub mod model;
pub mod opensm_state;
pub mod operator;
pub mod ownership;
pub mod parse;
pub mod peer_state;
pub mod peers;
pub mod region;
pub mod reload;
pub mod render;
pub mod repair;
pub mod running_start;
pub mod sa_client;
pub mod sa_members;
pub mod sminfo;
pub mod standby;
pub mod state;
pub mod store;
pub mod sync;

pub use backend::{OpenSmBackend, Retirement, Revocation, SetOutcome};
pub use config::{OpenSmConfig, OpenSmConfigError, ReloadMethod};
pub use error::{OpenSmError, Rejection, Restored};
pub use ownership::OwnershipConfig;
pub use region::{FullDefault, TableOverflow};
pub use store::{
    AcceptedGrant, CommitState, InMemoryNodeStore, LogMark, NodeMembershipStore, NodeStoreError,
    OperatorRejected, StoredNode,
};
