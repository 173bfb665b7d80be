//! Integration tests: the host's observers without a fabric: the sysfs observer and the verbs (libibverbs) host view.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod sysfs_observer;
mod verbs_host;
