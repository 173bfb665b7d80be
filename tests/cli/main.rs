//! Integration tests: the command line: the client subcommands against a daemon, the CLI's output contract, the operator's commands and `doctor`.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod client;
mod contract;
mod doctor;
mod operator;
