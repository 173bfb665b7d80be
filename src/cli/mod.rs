//! The command line: `serve` runs the daemon; the other subcommands talk to it over its unix
//! socket (or `--endpoint`) and print tables, or JSON with `--json`.

mod client;
mod commands;
mod doctor;
mod doctor_sm_host;
pub mod exit;
mod fence_sm_host;
mod generate;
mod grant;
mod loaded;
mod opensm;
mod output;
pub mod preflight;
pub mod reload;
mod remote;
mod reset_generation;
pub mod secret_file;
mod serve;
mod sm_hosts_view;
mod sm_view;
mod timestamp;
mod verdict;

pub use reload::LogControl;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// fabric-agent: programs and confirms this node's InfiniBand partition keys.
#[derive(Debug, Parser)]
#[command(name = "fabric-agent", version, about, after_help = exit::help())]
pub struct Cli {
    /// Configuration file. Client commands take the daemon's socket from it unless --socket or
    /// --endpoint is given.
    #[arg(long, global = true, env = "FABRIC_AGENT_CONFIG", default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,
    /// How client subcommands reach the daemon.
    #[command(flatten)]
    pub client: ClientOpts,
    /// Print JSON instead of tables (the same as `-o json`).
    #[arg(long, global = true, help_heading = "Output")]
    pub json: bool,
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        help_heading = "Output"
    )]
    pub output: Option<Format>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Which options were given explicitly (filled in by [`Cli::parse_args`]).
    #[arg(skip)]
    pub given: Given,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable tables that fit 100 columns; long text wraps, never cut.
    Table,
    /// Tables with every column (GUIDs, link layers, timestamps), as `kubectl -o wide`.
    Wide,
    /// JSON: one object (node, attach, release, check-config), one array (attachments) or one
    /// object per line (events).
    Json,
}

/// Options the user gave on the command line or in the environment, not by default.
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// `--config` or `FABRIC_AGENT_CONFIG`.
    pub config: bool,
    /// The connection options given on the command line (`--socket`, `--endpoint`, ...).
    pub connection: Vec<&'static str>,
}

/// The connection options, by argument id.
const CONNECTION_ARGS: [&str; 6] = ["socket", "endpoint", "ca", "cert", "key", "tls_domain"];

impl Cli {
    /// Parses `std::env::args`, exiting with 2 (usage) on bad arguments, and records which
    /// options were given explicitly.
    pub fn parse_args() -> Cli {
        let matches = Cli::definition().get_matches();
        let mut cli = match Cli::from_arg_matches(&matches) {
            Ok(c) => c,
            Err(e) => e.exit(),
        };
        cli.given = given(&matches);
        cli
    }

    /// Whether output is JSON (`--json` or `-o json`).
    pub fn json(&self) -> bool {
        self.json || self.output == Some(Format::Json)
    }

    /// The output format: `--json` is `-o json`; the default is a table.
    pub fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else {
            self.output.unwrap_or(Format::Table)
        }
    }

    /// The command line's definition as `--help`, the man pages and the completions show it:
    /// the connection options, global for the client commands, are hidden from the commands
    /// that take their socket from the config file (they refuse them with exit 2).
    pub fn definition() -> clap::Command {
        let mut command = Cli::command();
        // A subcommand's own argument with a global's id takes its place there: the local
        // commands get hidden copies, so their help omits them and a given one still reaches
        // `run`, which refuses it by name.
        let hidden: Vec<clap::Arg> = command
            .get_arguments()
            .filter(|a| CONNECTION_ARGS.contains(&a.get_id().as_str()))
            .map(|a| a.clone().global(false).hide(true))
            .collect();
        for name in LOCAL_COMMANDS {
            command = command.mut_subcommand(name, |sub| sub.args(hidden.clone()));
        }
        command
    }
}

/// The subcommands that run locally and take their socket from the config file.
const LOCAL_COMMANDS: [&str; 4] = ["serve", "check-config", "ports", "doctor"];

fn given(matches: &ArgMatches) -> Given {
    // Global options are recorded on the subcommand's matches too.
    let sub = matches.subcommand().map(|(_, m)| m);
    let source = |id: &str| {
        sub.and_then(|m| m.value_source(id))
            .into_iter()
            .chain(matches.value_source(id))
            .find(|s| *s != ValueSource::DefaultValue)
    };
    Given {
        config: source("config").is_some(),
        connection: CONNECTION_ARGS
            .into_iter()
            .filter(|id| source(id) == Some(ValueSource::CommandLine))
            .collect(),
    }
}

/// Connection options for client subcommands.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection (client commands)")]
pub struct ClientOpts {
    /// The daemon's unix socket [default: the config's `[listen] unix_socket`, else
    /// /run/fabric-agent/agent.sock].
    #[arg(long, global = true, env = "FABRIC_AGENT_SOCKET")]
    pub socket: Option<PathBuf>,
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
    /// Run the daemon (its socket, listeners and state come from the config file).
    #[command(
        after_help = "Examples:\n  fabric-agent --config /etc/fabric-agent/config.toml serve\n\n\
        Signals: SIGTERM/SIGINT drain and exit 0; SIGHUP reloads the log filter, the TLS material, the mTLS allowlists, the SM hosts (remote backend) and the peer SM hosts (opensm_ha)."
    )]
    Serve,
    /// Validate the configuration file as `serve` would before binding, and exit (64 when
    /// invalid).
    #[command(
        after_help = "Examples:\n  fabric-agent check-config --config /etc/fabric-agent/config.toml\n  \
        fabric-agent check-config --json | jq '.checks[] | select(.ok | not)'\n  \
        fabric-agent check-config --syntax --config config.toml.example"
    )]
    CheckConfig(commands::CheckConfigArgs),
    /// Show this node: fabric, ports with their P_Key tables, subnet manager, counts.
    #[command(
        after_help = "Examples:\n  fabric-agent node\n  fabric-agent node -o json | jq '.ports[].pkeys'"
    )]
    Node,
    /// Read this host's ports directly through the configured observer (no daemon needed).
    #[command(after_help = "Examples:\n  fabric-agent ports\n  fabric-agent ports --json")]
    Ports,
    /// Check this host: ports, default-partition membership, table space, the daemon, the
    /// subnet manager, conditions, clock and store; exit 1 when something blocks ACTIVE or
    /// RELEASED.
    #[command(after_help = "Examples:\n  fabric-agent doctor\n  fabric-agent doctor --json")]
    Doctor,
    /// Attach an instance on this node to a partition.
    #[command(after_help = "Examples:\n  \
        fabric-agent attach --instance vm-42 --partition ibpart_7f3k2 --name train-a \\\n      \
        --workspace ml-team --account acme --pkey 0a12 --wait 30s\n\n\
        Exit 0 when ACTIVE (or no --wait), 75 when --wait expired, 1 when refused.")]
    Attach(commands::AttachArgs),
    /// Release a terminated instance's partition.
    #[command(
        after_help = "Examples:\n  fabric-agent release --instance vm-42 --wait 1m\n\n\
        Exit 0 when RELEASED (or no --wait), 75 when --wait expired, 1 when refused."
    )]
    Release(commands::ReleaseArgs),
    /// List attachments.
    #[command(
        after_help = "Examples:\n  fabric-agent attachments --state releasing\n  \
        fabric-agent attachments --partition ibpart_7f3k2 -o json\n  \
        fabric-agent attachments -o wide"
    )]
    Attachments(commands::ListArgs),
    /// Show one instance's attachment (exit 1 with "not found" when it has none).
    #[command(
        after_help = "Examples:\n  fabric-agent get vm-42\n  fabric-agent get vm-42 -o json | jq .state"
    )]
    Get(commands::GetArgs),
    /// Print events (replayed from the durable log; --follow keeps streaming).
    #[command(
        after_help = "Examples:\n  fabric-agent events --after 120 --follow\n  \
        fabric-agent events -o json | jq 'select(.kind == \"attachment\")'"
    )]
    Events(commands::EventsArgs),
    /// Make a grant-signing key pair or sign a grant (the control plane's side, for labs and
    /// demos; no daemon needed).
    #[command(
        subcommand,
        after_help = "Examples:\n  fabric-agent grant keygen --out /etc/fabric-agent/grant-keys\n  \
        fabric-agent grant sign --key grant-signing.key --key-id lab-1 --fabric fab1 \\\n      \
        --node node1 --instance vm-42 --partition ibpart_7f3k2 --pkey 0a12 > vm-42.grant\n  \
        fabric-agent attach ... --grant @vm-42.grant"
    )]
    Grant(grant::GrantCommand),
    /// The SM host's partitions file: validate an operator's file, or install the configured
    /// operator_file (exit 0 done, 65 refused with its line, 1 rejected by OpenSM, 69
    /// unconfirmed, 64 config).
    #[command(
        subcommand,
        after_help = "Examples:\n  fabric-agent opensm check /etc/opensm/partitions.operator.conf\n  \
        fabric-agent opensm apply"
    )]
    Opensm(opensm::OpensmCommand),
    /// SM host, agent stopped: recover a node stranded at the generation bound (its stored
    /// generation above 2^53 - 2^32 becomes 0, its set kept). Run on every SM host (exit 0
    /// reset, 65 unknown or not stranded, 71 store busy or failed, 64 config).
    #[command(after_help = "Example:
  systemctl stop fabric-agent &&         fabric-agent reset-node-generation gpu-a17 && systemctl start fabric-agent")]
    ResetNodeGeneration {
        /// The stranded node's id.
        node: String,
    },
    /// SM host, agent running: fence peer SM host NAME after the physical check (its agent
    /// silent, its SM port not answering SMInfo); the nodes' applies then go on without it. Run
    /// on every live SM host (exit 0 fenced, 65 refused: its agent or SM answers, 64 no peers,
    /// 69 agent unreachable, 71 not stored, 77 not permitted).
    #[command(after_help = "Example (smhost2's OpenSM stopped, its agent dead):
  fabric-agent fence-sm-host smhost2.fab1.example")]
    FenceSmHost {
        /// The peer's name (as it states it) or its endpoint as in `peers`.
        host: String,
    },
    /// Print the man page (roff), or with --dir write every page, for packaging.
    #[command(hide = true)]
    Man(generate::ManArgs),
    /// Print a shell completion script, for packaging.
    #[command(hide = true)]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: generate::Shell,
    },
}

/// Runs the command line.
pub fn run(cli: Cli, log: LogControl) -> ExitCode {
    match cli.command {
        Command::Man(m) => return generate::man(&m),
        Command::Completions { shell } => return generate::completions(shell),
        Command::Grant(g) => return grant::run(g),
        Command::Opensm(o) => return opensm::run(o, &cli.config),
        Command::ResetNodeGeneration { node } => return reset_generation::run(&node, &cli.config),
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::OS_ERROR);
        }
    };
    let json = cli.json();
    let format = cli.format();
    let local = match &cli.command {
        Command::Serve => Some("serve"),
        Command::CheckConfig(_) => Some("check-config"),
        Command::Ports => Some("ports"),
        Command::Doctor => Some("doctor"),
        _ => None,
    };
    if let (Some(name), Some(flag)) = (local, cli.given.connection.first()) {
        eprintln!(
            "error: --{} is for client commands; {name} takes its socket and listeners from the \
             config file ({})",
            flag.replace('_', "-"),
            cli.config.display()
        );
        return ExitCode::from(exit::USAGE);
    }
    runtime.block_on(async move {
        match cli.command {
            Command::Serve => serve::run(&cli.config, log).await,
            Command::CheckConfig(a) => commands::check_config(&cli.config, &a, json),
            Command::Ports => commands::ports(&cli.config, format).await,
            Command::Doctor => doctor::doctor(&cli.config, json).await,
            Command::FenceSmHost { host } => {
                match client::Target::resolve(&cli.client, &cli.config, cli.given.config) {
                    Ok(target) => fence_sm_host::run(&host, &target).await,
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::from(exit::CONFIG)
                    }
                }
            }
            command => {
                let target =
                    match client::Target::resolve(&cli.client, &cli.config, cli.given.config) {
                        Ok(t) => t,
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::from(exit::CONFIG);
                        }
                    };
                remote::run(command, &target, format).await
            }
        }
    })
}
