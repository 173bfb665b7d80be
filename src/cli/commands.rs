//! Client subcommands and `check-config` / `ports`.

use super::{client, output, ClientOpts, Command};
use crate::config::Config;
use crate::proto::agent as pb;
use clap::Args;
use std::path::Path;
use std::process::ExitCode;
use tokio_stream::StreamExt;

/// `attach` arguments.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The instance on this node.
    #[arg(long)]
    pub instance: String,
    /// Partition id (`ibpart_...`).
    #[arg(long)]
    pub partition: String,
    /// Partition name.
    #[arg(long)]
    pub name: String,
    /// Owning workspace.
    #[arg(long)]
    pub workspace: String,
    /// Owning account.
    #[arg(long)]
    pub account: String,
    /// The partition's fabric (default: this node's fabric).
    #[arg(long)]
    pub fabric: Option<String>,
    /// P_Key base, e.g. 0x0012 or 18 (0x0001..=0x7ffe).
    #[arg(long, value_parser = parse_u32)]
    pub pkey: u32,
    /// Limited instead of full membership.
    #[arg(long)]
    pub limited: bool,
    /// Wait up to this many seconds for ACTIVE.
    #[arg(long)]
    pub wait: Option<u32>,
}

/// `release` arguments.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The terminated instance.
    #[arg(long)]
    pub instance: String,
    /// Wait up to this many seconds for RELEASED.
    #[arg(long)]
    pub wait: Option<u32>,
}

/// `attachments` filters.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this state (e.g. ACTIVE).
    #[arg(long)]
    pub state: Option<String>,
    /// Only this partition id.
    #[arg(long)]
    pub partition: Option<String>,
    /// Only this instance.
    #[arg(long)]
    pub instance: Option<String>,
}

/// `events` arguments.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Start after this sequence number.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep streaming live events.
    #[arg(long)]
    pub follow: bool,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

/// `check-config`.
pub fn check_config(path: &Path) -> ExitCode {
    match Config::load(path) {
        Ok(c) => {
            println!(
                "{}: ok (node {}, fabric {}, backend {:?}, observer {:?})",
                path.display(),
                c.node_id(),
                c.fabric,
                c.subnet_manager.backend,
                c.observer_kind()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(super::serve::EXIT_CONFIG)
        }
    }
}

/// `ports`: reads the ports through the configured observer, without the daemon.
pub async fn ports(path: &Path, json: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::serve::EXIT_CONFIG);
        }
    };
    match crate::agent::read_ports_once(&config).await {
        Ok((kind, inventory)) => {
            let ports: Vec<pb::Port> = inventory
                .ports
                .iter()
                .map(crate::api::convert::port_to_pb)
                .collect();
            output::ports(kind, &ports, json);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a subcommand that talks to the daemon.
pub async fn client(command: Command, opts: &ClientOpts, json: bool) -> ExitCode {
    let mut c = match client::connect(opts).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(69);
        }
    };
    let result: Result<(), tonic::Status> = async {
        match command {
            Command::Node => {
                let n = c.get_node(pb::GetNodeRequest {}).await?.into_inner();
                output::node(&n, json);
            }
            Command::Attach(a) => {
                let fabric = match a.fabric {
                    Some(f) => f,
                    None => c.get_node(pb::GetNodeRequest {}).await?.into_inner().fabric,
                };
                let r = c
                    .attach_partition(pb::AttachPartitionRequest {
                        partition: Some(pb::Partition {
                            id: a.partition,
                            name: a.name,
                            workspace: a.workspace,
                            account: a.account,
                            fabric,
                            pkey: a.pkey,
                        }),
                        instance_id: a.instance,
                        membership: if a.limited {
                            pb::Membership::Limited
                        } else {
                            pb::Membership::Full
                        } as i32,
                        wait_ms: a.wait.map(|s| s.saturating_mul(1000)),
                    })
                    .await?
                    .into_inner();
                output::attachments(r.attachment.as_slice(), json);
            }
            Command::Release(r) => {
                let r = c
                    .release_instance(pb::ReleaseInstanceRequest {
                        instance_id: r.instance,
                        wait_ms: r.wait.map(|s| s.saturating_mul(1000)),
                    })
                    .await?
                    .into_inner();
                output::attachments(r.attachment.as_slice(), json);
            }
            Command::Attachments(l) => {
                let state = match l.state {
                    Some(s) => Some(
                        pb::AttachmentState::from_str_name(&format!(
                            "ATTACHMENT_STATE_{}",
                            s.to_uppercase()
                        ))
                        .ok_or_else(|| {
                            tonic::Status::invalid_argument(format!("unknown state {s:?}"))
                        })? as i32,
                    ),
                    None => None,
                };
                let r = c
                    .list_attachments(pb::ListAttachmentsRequest {
                        state,
                        partition_id: l.partition,
                        instance_id: l.instance,
                    })
                    .await?
                    .into_inner();
                output::attachments(&r.attachments, json);
            }
            Command::Events(e) => {
                let mut stream = c
                    .watch_events(pb::WatchEventsRequest {
                        after_seq: e.after,
                        no_follow: !e.follow,
                    })
                    .await?
                    .into_inner();
                while let Some(ev) = stream.next().await {
                    output::event(&ev?, json);
                }
            }
            Command::Serve
            | Command::CheckConfig
            | Command::Ports
            | Command::Man
            | Command::Completions { .. } => {
                unreachable!("handled locally")
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(s) => {
            eprintln!("error: {:?}: {}", s.code(), s.message());
            ExitCode::FAILURE
        }
    }
}
