//! Integration tests: the SMP (umad) observer and agent on the ibsim rig.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod agent;
mod observer;
mod rig;
