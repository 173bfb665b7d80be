//! The `fabric-agent` binary: parse the command line, set up logging, run.

mod logging;

use fabric_agent::cli::{run, Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let default_level = if matches!(cli.command, Command::Serve) {
        fabric_agent::cli::reload::DEFAULT_FILTER
    } else {
        "warn"
    };
    let log = logging::init(default_level);
    run(cli, log)
}
