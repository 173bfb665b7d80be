//! Integration tests: the OpenSM SM-host side: the backend, the partitions parser, and the ibsim + OpenSM rig tests (confirmation, faults, grants, several SM hosts, isolation, ownership, ports, repair, the fleet client).
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod backend;
mod confirm;
mod differential;
mod e2e;
mod faults;
mod fleet;
mod grants;
mod ha;
mod ha_sync;
mod isolation;
mod isolation_backend;
mod log_check;
mod members_sa;
mod node_restore;
mod operator;
mod ownership;
mod ownership_backend;
mod parser;
mod peers;
mod ports;
mod real;
mod rejection;
mod remote;
mod repair;
mod restore_start;
mod shutdown;
mod sminfo;
