//! The `fabric-agent` binary: parse the command line, set up logging, run.

mod logging;

use clap::Parser;
use fabric_agent::cli::{run, Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if matches!(cli.command, Command::Serve) {
        "info"
    } else {
        "warn"
    };
    logging::init(default_level);
    run(cli)
}
