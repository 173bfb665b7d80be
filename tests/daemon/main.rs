//! Integration tests: the daemon through its public gRPC API: attach/release, bounds on requests, durability across restarts, in-doubt keys, ports, sysfs, TLS and the UFM backend.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod api;
mod bounds;
mod clean_stop;
mod durability;
mod in_doubt;
mod ports;
mod sysfs;
mod tls;
mod ufm;
mod watch_lagging_cursor;
