//! Integration tests: who may do what: the fabric side's authority, request floods, grants, local callers, the partitions service and mTLS identities.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod fabric;
mod flood;
mod grant_ledger;
mod grants;
mod local;
mod partitions;
mod quotas;
mod tls;
mod tls_reload;
