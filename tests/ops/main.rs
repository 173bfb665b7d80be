//! Integration tests: what an operator and a host see: alert rules, the Debian package, a stock gRPC client, journald, metrics, secret files and systemd.
//!
//! One test binary per area (a link per binary is the slow step on a small CI machine); the
//! shared helpers, the ibsim rig, the fake UFM and the simulation harness are in `testkit`.

mod alert_rules;
mod deb;
mod grpcio;
mod journald;
mod metrics;
mod secret_files;
mod systemd;
