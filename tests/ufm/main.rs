//! Integration tests: the UFM backend against the fake UFM: the backend, the broker, a fleet of nodes, the ledger of late writes, store restores and TLS.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod backend;
mod broker;
mod fleet;
mod late_write_ports;
mod ledger;
mod ownership;
mod restore;
mod tls;
