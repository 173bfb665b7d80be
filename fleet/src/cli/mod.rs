//! The `fabric-fleet` subcommands. Output goes to stdout, diagnostics to stderr; exit codes are
//! in [`exit`].

pub mod exit;
mod grant_cmd;
mod ports;
mod report;

use crate::fleet::{AttachSpec, Fleet, FleetError};
use crate::grant::Signer;
use crate::guard::Decision;
use crate::proto::agent::{Membership, Partition, PortName};
use crate::registry::Registry;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The control plane's client of fabric-agent: follow nodes, attach and release with signed
/// grants, and decide whether a partition may be deleted.
#[derive(Debug, Parser)]
#[command(name = "fabric-fleet", version)]
pub struct Cli {
    /// The nodes file (TOML; see the crate docs of `registry`).
    #[arg(long, env = "FABRIC_FLEET_NODES", global = true)]
    pub nodes: Option<PathBuf>,
    /// The fleet store (redb file: cursors, view, attach ledger).
    #[arg(
        long,
        env = "FABRIC_FLEET_STORE",
        global = true,
        default_value = "fleet.redb"
    )]
    pub store: PathBuf,
    /// How long one-shot commands follow the nodes before answering (seconds).
    #[arg(long, global = true, default_value_t = 15)]
    pub sync_secs: u64,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The shape of a command's answer on stdout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Tab-separated lines for people.
    #[default]
    Text,
    /// One JSON document.
    Json,
}

/// A subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per node: reachable, subnet manager (REACHABLE, REFUSED, UNREACHABLE, UNKNOWN), epoch,
    /// cursor, lag, conditions.
    Status {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// A partition's instances and their states across nodes.
    Partition {
        /// The partition id (`ibpart_...`).
        partition_id: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Exit 0 when the partition may be deleted, 1 with the blockers when not, 69 when it
    /// cannot be decided.
    MayDelete {
        /// The partition id.
        partition_id: String,
        /// Output format (`json`: one document with `may_delete` true, false or null when it
        /// cannot be decided, the blockers, and `settled`: every node caught up or failed at least once within `--sync-secs`).
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Prints every node's events, merged, until interrupted.
    Watch {
        /// Output format (`json`: one JSON object per line).
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Attaches an instance with a freshly signed grant (recorded in the ledger first).
    Attach {
        /// The node.
        #[arg(long)]
        node: String,
        /// The instance on it.
        #[arg(long)]
        instance: String,
        /// Partition id (`ibpart_...`).
        #[arg(long)]
        partition_id: String,
        /// Partition name.
        #[arg(long)]
        name: String,
        /// Workspace.
        #[arg(long)]
        workspace: String,
        /// Account.
        #[arg(long)]
        account: String,
        /// Fabric.
        #[arg(long)]
        fabric: String,
        /// P_Key base (decimal or 0x hex).
        #[arg(long, value_parser = parse_pkey)]
        pkey: u32,
        /// Limited membership (default full).
        #[arg(long)]
        limited: bool,
        /// Wait up to this many milliseconds for ACTIVE.
        #[arg(long)]
        wait_ms: Option<u32>,
        /// A port of the instance (repeat for each): DEVICE/PORT (`mlx5_0/1`) or a port GUID
        /// (`0x0002c903000e0b72`). None: every fabric port of the node.
        #[arg(long = "port", value_parser = ports::parse_port)]
        ports: Vec<PortName>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Releases an instance (the instance was terminated).
    Release {
        /// The node.
        #[arg(long)]
        node: String,
        /// The instance.
        #[arg(long)]
        instance: String,
        /// Wait up to this many milliseconds for RELEASED.
        #[arg(long)]
        wait_ms: Option<u32>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Grant keys and one-off signing.
    #[command(subcommand)]
    Grant(grant_cmd::GrantCommand),
}

/// Parses a P_Key base, decimal or `0x` hex.
pub fn parse_pkey(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))?;
    if (1..=0x7FFE).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s}: a P_Key base is 0x0001..=0x7FFE"))
    }
}

/// Runs the command line; returns the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Grant(cmd) = &cli.command {
        return ExitCode::from(grant_cmd::run(cmd));
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    ExitCode::from(runtime.block_on(run(cli)))
}

async fn run(cli: Cli) -> u8 {
    let Some(nodes) = &cli.nodes else {
        eprintln!("fabric-fleet: --nodes (or FABRIC_FLEET_NODES) is required");
        return exit::USAGE;
    };
    let registry = match Registry::load(nodes) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fabric-fleet: {e}");
            return exit::USAGE;
        }
    };
    let signing = registry.signing.clone();
    let mut fleet = match Fleet::open(registry, &cli.store) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("fabric-fleet: {e}");
            return match e {
                FleetError::Store(_) => exit::IO,
                _ => exit::USAGE,
            };
        }
    };
    let sync = Duration::from_secs(cli.sync_secs);
    match cli.command {
        Command::Status { output } => {
            fleet.follow();
            fleet.wait_settled(sync).await;
            match output {
                Format::Text => print!(
                    "{}",
                    fleet.with_view(|v| report::status(fleet.registry(), v))
                ),
                Format::Json => println!(
                    "{}",
                    fleet.with_view(|v| report::status_json(fleet.registry(), v))
                ),
            }
            fleet.shutdown().await;
            exit::OK
        }
        Command::Partition {
            partition_id,
            output,
        } => {
            fleet.follow();
            fleet.wait_settled(sync).await;
            let ledger = fleet.attaches(&partition_id).unwrap_or_default();
            match output {
                Format::Text => print!(
                    "{}",
                    fleet.with_view(|v| report::partition(&partition_id, &ledger, v))
                ),
                Format::Json => println!(
                    "{}",
                    fleet.with_view(|v| report::partition_json(&partition_id, &ledger, v))
                ),
            }
            fleet.shutdown().await;
            exit::OK
        }
        Command::MayDelete {
            partition_id,
            output,
        } => {
            fleet.follow();
            let settled = fleet.wait_settled(sync).await;
            let decision = fleet.may_delete(&partition_id).await;
            let code = match &decision {
                Ok(Decision::Yes) => exit::OK,
                Ok(Decision::No(_)) => exit::NO,
                Err(_) => exit::UNAVAILABLE,
            };
            match (output, decision) {
                (Format::Text, Ok(Decision::Yes)) => {
                    println!("yes: {partition_id} may be deleted")
                }
                (Format::Text, Ok(Decision::No(blockers))) => {
                    println!("no: {partition_id} may not be deleted yet");
                    for b in blockers {
                        println!("  {b}");
                    }
                }
                (Format::Text, Err(e)) => {
                    eprintln!("fabric-fleet: cannot decide for {partition_id}: {e}")
                }
                (Format::Json, decision) => {
                    let (may_delete, blockers, error) = match decision {
                        Ok(Decision::Yes) => (Some(true), Vec::new(), None),
                        Ok(Decision::No(b)) => (
                            Some(false),
                            b.iter().map(report::blocker_json).collect(),
                            None,
                        ),
                        Err(e) => (None, Vec::new(), Some(e.to_string())),
                    };
                    println!(
                        "{}",
                        serde_json::json!({
                            "partition_id": partition_id,
                            "may_delete": may_delete,
                            "blockers": blockers,
                            "error": error,
                            "settled": settled,
                        })
                    );
                }
            }
            if !settled {
                eprintln!("fabric-fleet: not every node was heard from within {sync:?}");
            }
            fleet.shutdown().await;
            code
        }
        Command::Watch { output } => {
            let mut rx = fleet.subscribe();
            fleet.follow();
            loop {
                tokio::select! {
                    got = rx.recv() => match got {
                        Ok((node, ev)) => match output {
                            Format::Text => println!("{}", report::event_line(&node, &ev)),
                            Format::Json => println!("{}", report::event_json(&node, &ev)),
                        },
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            eprintln!("fabric-fleet: watch fell behind, {n} events not printed \
                                       (they were applied)");
                        }
                        Err(_) => break,
                    },
                    _ = tokio::signal::ctrl_c() => break,
                }
            }
            fleet.shutdown().await;
            exit::OK
        }
        Command::Attach {
            node,
            instance,
            partition_id,
            name,
            workspace,
            account,
            fabric,
            pkey,
            limited,
            wait_ms,
            ports,
            output,
        } => {
            let Some(signing) = signing else {
                eprintln!("fabric-fleet: the nodes file has no [signing] section");
                return exit::USAGE;
            };
            let signer = match Signer::from_files(&signing.keys, &signing.active) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("fabric-fleet: {e}");
                    return exit::USAGE;
                }
            };
            let fleet = fleet.with_signer(signer);
            let spec = AttachSpec {
                node_id: node,
                instance_id: instance,
                partition: Partition {
                    id: partition_id,
                    name,
                    workspace,
                    account,
                    fabric,
                    pkey,
                },
                membership: if limited {
                    Membership::Limited
                } else {
                    Membership::Full
                },
                wait_ms,
                ports,
            };
            helper_result(fleet.attach(spec).await.map(|r| r.attachment), output)
        }
        Command::Release {
            node,
            instance,
            wait_ms,
            output,
        } => helper_result(
            fleet
                .release(&node, &instance, wait_ms)
                .await
                .map(|r| r.attachment),
            output,
        ),
        Command::Grant(_) => unreachable!("handled before the runtime starts"),
    }
}

fn helper_result(
    r: Result<Option<crate::proto::agent::Attachment>, FleetError>,
    output: Format,
) -> u8 {
    match r {
        Ok(Some(a)) => {
            match output {
                Format::Text => println!("{}", report::attachment_line(&a)),
                Format::Json => println!("{}", report::attachment_json(&a)),
            }
            exit::OK
        }
        Ok(None) => exit::OK,
        Err(e) => {
            eprintln!("fabric-fleet: {e}");
            match e {
                FleetError::Node {
                    code:
                        tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::AlreadyExists
                        | tonic::Code::NotFound,
                    ..
                }
                | FleetError::UnknownNode(_)
                | FleetError::Grant(_) => exit::USAGE,
                FleetError::Store(_) => exit::IO,
                _ => exit::UNAVAILABLE,
            }
        }
    }
}
