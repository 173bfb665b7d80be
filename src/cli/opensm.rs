//! `fabric-agent opensm`: the operator's side of the SM host's partitions file, the `visudo`
//! habit. `check FILE` validates an operator's file with the strict parser; `apply` validates
//! the configured `operator_file`, composes it with the agent's region of the live file, writes
//! it atomically under the live file's lock, makes OpenSM sweep and confirms by the sweep fence.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | valid (`check`); installed and confirmed by OpenSM (`apply`) |
//! | 1    | `apply`: OpenSM rejected the composed file; the previous live file was put back |
//! | 64   | configuration: the config is invalid, not an OpenSM SM host, or has no `operator_file` |
//! | 65   | the operator's file is refused (OpenSM would reject it): its line and reason; nothing written |
//! | 66   | the file to check cannot be read |
//! | 69   | `apply`: written, but OpenSM could not be signalled or was not seen confirming it |

use super::exit;
use crate::config::Backend;
use crate::sm::opensm::operator::{apply, load_operator_file, ApplyError, OperatorFileError};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `opensm` subcommands.
#[derive(Debug, Subcommand)]
pub enum OpensmCommand {
    /// Validate an operator's partitions file as OpenSM would read it (exit 0 valid, 65 refused
    /// with its line and reason, 66 unreadable).
    Check {
        /// The operator's file (e.g. /etc/opensm/partitions.operator.conf).
        file: PathBuf,
    },
    /// Install the configured operator_file into the live partitions file: validate, compose
    /// with the agent's region, write atomically, sweep, confirm (exit 0; 65 refused, nothing
    /// written; 1 rejected by OpenSM, previous file restored; 69 unconfirmed; 64 config).
    Apply,
}

/// Runs an `opensm` subcommand.
pub fn run(command: OpensmCommand, config_path: &Path) -> ExitCode {
    match command {
        OpensmCommand::Check { file } => check(&file),
        OpensmCommand::Apply => apply_configured(config_path),
    }
}

fn check(file: &Path) -> ExitCode {
    match load_operator_file(file) {
        Ok((_, conf)) => {
            println!(
                "{}: valid ({} entries, {} warnings)",
                file.display(),
                conf.entries.len(),
                conf.warnings.len()
            );
            for w in &conf.warnings {
                println!("warning: {w}");
            }
            ExitCode::SUCCESS
        }
        Err(e @ OperatorFileError::Read { .. }) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::NO_INPUT)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::DATA_ERROR)
        }
    }
}

fn apply_configured(config_path: &Path) -> ExitCode {
    let config = match super::loaded::load(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let opensm = match (
        &config.subnet_manager.backend,
        &config.subnet_manager.opensm,
    ) {
        (Backend::Opensm, Some(o)) => o.clone(),
        _ => {
            eprintln!(
                "error: {} is not an OpenSM SM host's config (subnet_manager.backend = \"opensm\")",
                config_path.display()
            );
            return ExitCode::from(exit::CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::OS_ERROR);
        }
    };
    match runtime.block_on(apply(&opensm)) {
        Ok(a) => {
            println!(
                "{} installed into {} ({} bytes{}); OpenSM swept and accepted it",
                opensm
                    .operator_file
                    .as_deref()
                    .unwrap_or(Path::new("?"))
                    .display(),
                opensm.partitions_file.display(),
                a.bytes,
                if a.unchanged { ", unchanged" } else { "" }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(apply_exit_code(&e))
        }
    }
}

/// The exit code `opensm apply` ends with, from the table in [`exit`].
fn apply_exit_code(e: &ApplyError) -> u8 {
    match e {
        ApplyError::NotConfigured(_) => exit::CONFIG,
        ApplyError::Operator(_) | ApplyError::Live { .. } => exit::DATA_ERROR,
        ApplyError::Io(_) | ApplyError::Unconfirmed(_) => exit::UNREACHABLE,
        ApplyError::Rejected { .. } => exit::REFUSED,
    }
}
