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
/// observer O` (backend and observer as the config file spells them, e.g. `embedded`).
pub fn summary(config: &Config) -> String {
    format!(
        "node {}, fabric {}, backend {}, observer {}",
        config.node_id.as_str(),
        config.fabric.as_str(),
        backend_name(config),
        observer_name(config)
    )
}

/// The backend as the config file spells it (`embedded`, `opensm`, `remote`, `ufm`).
pub fn backend_name(config: &Config) -> String {
    format!("{:?}", config.subnet_manager.backend).to_lowercase()
}

/// The observer in effect as the config file spells it (`auto`, `sysfs`, ...).
pub fn observer_name(config: &Config) -> String {
    format!("{:?}", config.observer_kind()).to_lowercase()
}
