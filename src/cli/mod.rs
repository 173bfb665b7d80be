//! The command line: `serve` runs the daemon; the other subcommands talk to it over its unix
//! socket (or `--endpoint`) and print tables, or JSON with `--json`.

mod client;
mod commands;
pub mod exit;
mod output;
mod serve;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// fabric-agent: programs and confirms this node's InfiniBand partition keys.
#[derive(Debug, Parser)]
#[command(name = "fabric-agent", version, about)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, env = "FABRIC_AGENT_CONFIG", default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,
    /// How client subcommands reach the daemon.
    #[command(flatten)]
    pub client: ClientOpts,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Connection options for client subcommands.
#[derive(Debug, Clone, Args)]
pub struct ClientOpts {
    /// The daemon's unix socket.
    #[arg(long, global = true, env = "FABRIC_AGENT_SOCKET", default_value = crate::config::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Reach the daemon over TCP instead, e.g. https://node1:7443 (mTLS) or http://127.0.0.1:7443.
    #[arg(long, global = true)]
    pub endpoint: Option<String>,
    /// CA bundle that the daemon's certificate chains to (https endpoints).
    #[arg(long, global = true)]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS.
    #[arg(long, global = true)]
    pub cert: Option<PathBuf>,
    /// Client private key (PEM) for mTLS.
    #[arg(long, global = true)]
    pub key: Option<PathBuf>,
    /// Server name to verify instead of the endpoint's host.
    #[arg(long, global = true)]
    pub tls_domain: Option<String>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve,
    /// Validate the configuration file and exit (64 when invalid).
    CheckConfig,
    /// Show this node: fabric, ports with their P_Key tables, subnet manager, counts.
    Node,
    /// Read this host's ports directly through the configured observer (no daemon needed).
    Ports,
    /// Attach an instance on this node to a partition.
    Attach(commands::AttachArgs),
    /// Release a terminated instance's partition.
    Release(commands::ReleaseArgs),
    /// List attachments.
    Attachments(commands::ListArgs),
    /// Print events (replayed from the durable log; --follow keeps streaming).
    Events(commands::EventsArgs),
}

/// Runs the command line.
pub fn run(cli: Cli) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(71);
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Serve => serve::run(&cli.config).await,
            Command::CheckConfig => commands::check_config(&cli.config),
            Command::Ports => commands::ports(&cli.config, cli.json).await,
            command => commands::client(command, &cli.client, cli.json).await,
        }
    })
}
