//! The `fabric-agent` binary: parse the command line, set up logging, run.

use clap::Parser;
use fabric_agent::cli::{run, Cli, Command};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if matches!(cli.command, Command::Serve) {
        "info"
    } else {
        "warn"
    };
    let filter = EnvFilter::try_from_env("FABRIC_AGENT_LOG")
        .unwrap_or_else(|_| EnvFilter::new(default_level));
    let json_logs = std::env::var_os("FABRIC_AGENT_LOG_JSON").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json_logs {
        builder.json().init();
    } else {
        builder.init();
    }
    run(cli)
}
