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
mod generation_bound;
mod generation_reset_cli;
mod grant_ledger;
mod grants;
mod ha;
mod ha_evidence;
mod ha_fence;
mod ha_fence_command;
mod ha_opensm_only;
mod ha_sync;
mod ha_three;
mod host_set;
mod isolation;
mod isolation_backend;
mod log_check;
mod log_forgery;
mod members_sa;
mod name_only;
mod node_pace;
mod node_restore;
mod operator;
mod ownership;
mod ownership_backend;
mod parser;
mod peers;
mod ports;
mod ready_order;
mod real;
mod rejection;
mod remote;
mod repair;
mod restart_running;
mod restore_start;
mod running_restore;
mod running_restore_ha;
mod shutdown;
mod sm_host_add;
mod sminfo;
mod umad_shared;
