//! `fabric-agent reset-node-generation NODE`: recovers a node stranded at the generation bound
//! on this SM host (see [`crate::sm::opensm::generation_bound`]). Run it on every SM host with
//! the agent stopped there (the store is opened exclusively): the node's stored generation, when
//! above the adoption ceiling, becomes 0; its set, grants and revocations and every other node
//! stay as they are, so the partitions file does not change.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | reset |
//! | 64   | configuration: invalid, or not an OpenSM SM host |
//! | 65   | refused: the node is unknown here, or not stranded; nothing changed |
//! | 71   | the store cannot be opened (is the agent still running?) or written |

use super::exit;
use crate::config::Backend;
use crate::daemon::{StoredSmNodes, STORE_FILE};
use crate::sm::opensm::generation_bound::{reset_stranded, ResetError};
use crate::store::Store;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Resets `node`'s stored generation on the SM host `config_path` configures.
pub fn run(node: &str, config_path: &Path) -> ExitCode {
    let config = match super::loaded::load(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if config.subnet_manager.backend != Backend::Opensm {
        eprintln!(
            "error: {} is not an OpenSM SM host's config (subnet_manager.backend = \"opensm\")",
            config_path.display()
        );
        return ExitCode::from(exit::CONFIG);
    }
    let path = config.state_dir.join(STORE_FILE);
    let store = match Store::open(&path, config.events.retain) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!(
                "error: cannot open {}: {e} (stop the agent on this host first)",
                path.display()
            );
            return ExitCode::from(exit::OS_ERROR);
        }
    };
    match reset_stranded(&StoredSmNodes(store), node) {
        Ok(before) => {
            println!(
                "node {node}: stored generation {before} reset to 0 on this SM host; its set is \
                 kept. Reset it on every other SM host too, then start the agents."
            );
            ExitCode::SUCCESS
        }
        Err(e @ ResetError::Store(_)) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::OS_ERROR)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::DATA_ERROR)
        }
    }
}
