//! The configuration as the local subcommands (`serve`, `ports`, `doctor`, `check-config`) load
//! it: a file that does not load is said on stderr and is exit 64.

use super::exit;
use crate::config::Config;
use std::path::Path;
use std::process::ExitCode;

/// Loads and validates the file; on failure prints `error: ...` and answers exit 64.
pub fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(exit::CONFIG)
    })
}

/// What the configuration makes of this host, in one line: `node N, fabric F, backend B,
/// observer O` (the backend and observer as their `Debug` names, e.g. `Embedded`).
pub fn summary(config: &Config) -> String {
    format!(
        "node {}, fabric {}, backend {:?}, observer {:?}",
        config.node_id.as_str(),
        config.fabric.as_str(),
        config.subnet_manager.backend,
        config.observer_kind()
    )
}
