//! Integration tests: the reconciler's deterministic simulation (the harness is in testkit::sim): seeded schedules and several SM hosts.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod clock_steps;
mod seeds;
mod sm_hosts;
