//! Client subcommands and `check-config` / `ports`.

use super::client::{self, Target};
use super::preflight::Preflight;
use super::{output, Command};
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
    /// P_Key base in hex as InfiniBand tools print it: 0x0a12 or 0a12 (0x0001..=0x7ffe; never
    /// decimal). Membership is --limited, not bit 15.
    #[arg(long, value_parser = parse_pkey)]
    pub pkey: u32,
    /// Limited instead of full membership.
    #[arg(long)]
    pub limited: bool,
    /// Wait up to this many seconds (at most 600) for ACTIVE; exit 75 if it is not reached.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=600))]
    pub wait: Option<u32>,
}

/// `release` arguments.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The terminated instance.
    #[arg(long)]
    pub instance: String,
    /// Wait up to this many seconds (at most 600) for RELEASED; exit 75 if it is not reached.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=600))]
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

/// `check-config` arguments.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Only parse and validate the file; skip the checks of this host's paths and PEM files
    /// (for a config written for another host, e.g. a package's example).
    #[arg(long)]
    pub syntax: bool,
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

/// A `--pkey` argument that is not a tenant P_Key base; each says what was understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PKeyArgError {
    /// Not 1-4 hex digits.
    #[error(
        "{0:?} is not a P_Key: give 1-4 hex digits, e.g. 0x0a12 or 0a12 (P_Keys are always hex)"
    )]
    NotHex(String),
    /// Reads as 0.
    #[error("{0:?} read as 0x0000, which is not a valid P_Key")]
    Zero(String),
    /// The default partition's key.
    #[error("{text:?} read as {value:#06x}, the default partition, which no tenant may claim")]
    Default {
        /// The argument.
        text: String,
        /// What it read as.
        value: u32,
    },
    /// The full-membership bit is set.
    #[error(
        "{text:?} read as {value:#06x}, which has the full-membership bit set: give the base {:#06x} \
         (membership is --limited or full by default)",
        .value & 0x7fff
    )]
    MembershipBit {
        /// The argument.
        text: String,
        /// What it read as.
        value: u32,
    },
}

/// Parses a P_Key base the way InfiniBand tools write keys: hex, with or without `0x`, 1-4
/// digits, never decimal. A value with the membership bit set or outside 0x0001..=0x7ffe is
/// refused with what was understood.
pub fn parse_pkey(s: &str) -> Result<u32, PKeyArgError> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(PKeyArgError::NotHex(s.to_owned()));
    }
    let value = u32::from_str_radix(digits, 16).expect("checked hex digits");
    let text = s.to_owned();
    match value {
        0 => Err(PKeyArgError::Zero(text)),
        0x7fff | 0xffff => Err(PKeyArgError::Default { text, value }),
        0x8000.. => Err(PKeyArgError::MembershipBit { text, value }),
        _ => Ok(value),
    }
}

/// `check-config`: loads and validates the file, then runs every check `serve` runs before it
/// binds ([`Preflight`]); exit 64 when anything fails. `--json` prints one object:
/// `{"config", "ok", "error"?, "node"?, "fabric"?, "backend"?, "observer"?, "checks": [{"check", "ok", "detail"}]}`.
pub fn check_config(path: &Path, args: &CheckConfigArgs, json: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            if json {
                output::json(&serde_json::json!({
                    "config": path.display().to_string(), "ok": false, "error": e.to_string(), "checks": [],
                }));
            } else {
                eprintln!("error: {e}");
            }
            return ExitCode::from(super::exit::CONFIG);
        }
    };
    let preflight = if args.syntax {
        Preflight::default()
    } else {
        Preflight::run(&config)
    };
    if json {
        output::json(&serde_json::json!({
            "config": path.display().to_string(),
            "ok": preflight.ok(),
            "node": config.node_id.as_str(),
            "fabric": config.fabric.as_str(),
            "backend": format!("{:?}", config.subnet_manager.backend).to_lowercase(),
            "observer": format!("{:?}", config.observer_kind()).to_lowercase(),
            "checks": preflight.checks,
        }));
    } else if preflight.ok() {
        println!(
            "{}: ok (node {}, fabric {}, backend {:?}, observer {:?}; {})",
            path.display(),
            config.node_id.as_str(),
            config.fabric.as_str(),
            config.subnet_manager.backend,
            config.observer_kind(),
            if args.syntax {
                "syntax only".to_owned()
            } else {
                format!("{} host checks passed", preflight.checks.len())
            }
        );
    } else {
        for c in preflight.failures() {
            eprintln!("error: {}: {}", c.check, c.detail);
        }
    }
    if preflight.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::exit::CONFIG)
    }
}

/// `ports`: reads the ports through the configured observer, without the daemon.
pub async fn ports(path: &Path, json: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::exit::CONFIG);
        }
    };
    match crate::daemon::read_ports_once(&config).await {
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
pub async fn client(command: Command, target: &Target, json: bool) -> ExitCode {
    let mut c = match client::connect(target).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::exit::UNREACHABLE);
        }
    };
    let result = match command {
        Command::Node => node(&mut c, json).await,
        Command::Attach(a) => attach(&mut c, a, json).await,
        Command::Release(r) => release(&mut c, r, json).await,
        Command::Attachments(l) => attachments(&mut c, l, json).await,
        Command::Events(e) => events(&mut c, e, json).await,
        Command::Serve
        | Command::CheckConfig(_)
        | Command::Ports
        | Command::Doctor
        | Command::Man
        | Command::Completions { .. } => {
            unreachable!("handled locally")
        }
    };
    exit_code(result)
}

/// `node`: this node's view.
async fn node(c: &mut client::Client, json: bool) -> Result<Outcome, tonic::Status> {
    let n = c.get_node(pb::GetNodeRequest {}).await?.into_inner();
    output::node(&n, json);
    Ok(Outcome::Done)
}

/// `attach`: the partition's fabric defaults to the node's.
async fn attach(
    c: &mut client::Client,
    a: AttachArgs,
    json: bool,
) -> Result<Outcome, tonic::Status> {
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
    if let Some(attachment) = &r.attachment {
        output::attachment(attachment, json);
    }
    Ok(waited(
        r.attachment.as_ref(),
        a.wait,
        pb::AttachmentState::Active,
    ))
}

/// `release`.
async fn release(
    c: &mut client::Client,
    r: ReleaseArgs,
    json: bool,
) -> Result<Outcome, tonic::Status> {
    let answer = c
        .release_instance(pb::ReleaseInstanceRequest {
            instance_id: r.instance,
            wait_ms: r.wait.map(|s| s.saturating_mul(1000)),
        })
        .await?
        .into_inner();
    if let Some(attachment) = &answer.attachment {
        output::attachment(attachment, json);
    }
    Ok(waited(
        answer.attachment.as_ref(),
        r.wait,
        pb::AttachmentState::Released,
    ))
}

/// `attachments`: every page, filtered.
async fn attachments(
    c: &mut client::Client,
    l: ListArgs,
    json: bool,
) -> Result<Outcome, tonic::Status> {
    let state = match l.state {
        Some(s) => Some(
            pb::AttachmentState::from_str_name(&format!("ATTACHMENT_STATE_{}", s.to_uppercase()))
                .ok_or_else(|| tonic::Status::invalid_argument(format!("unknown state {s:?}")))?
                as i32,
        ),
        None => None,
    };
    let r = c
        .list_attachments(pb::ListAttachmentsRequest {
            state,
            partition_id: l.partition,
            instance_id: l.instance,
            ..Default::default()
        })
        .await?
        .into_inner();
    output::attachments(&r.attachments, json);
    Ok(Outcome::Done)
}

/// `events`: the log after `--after`, then (with `--follow`) live events.
async fn events(
    c: &mut client::Client,
    e: EventsArgs,
    json: bool,
) -> Result<Outcome, tonic::Status> {
    let mut stream = c
        .watch_events(pb::WatchEventsRequest {
            after_seq: e.after,
            no_follow: !e.follow,
            ..Default::default()
        })
        .await
        .map_err(|s| with_cli_cursor(s, e.after))?
        .into_inner();
    output::event_header(json);
    let mut last = e.after;
    while let Some(ev) = stream.next().await {
        let ev = ev.map_err(|s| with_cli_cursor(s, last))?;
        last = ev.seq;
        output::event(&ev, json);
    }
    Ok(Outcome::Done)
}

/// The exit code of a client subcommand and its message on stderr.
fn exit_code(result: Result<Outcome, tonic::Status>) -> ExitCode {
    match result {
        Ok(outcome) => match outcome {
            Outcome::Done => ExitCode::SUCCESS,
            Outcome::Expired { state, reason } => {
                eprintln!(
                    "wait expired: the attachment is {state}{}",
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({reason})")
                    }
                );
                ExitCode::from(super::exit::WAIT_EXPIRED)
            }
            Outcome::Ended { state, reason } => {
                eprintln!("error: the attachment ended {state}: {reason}");
                ExitCode::from(super::exit::REFUSED)
            }
        },
        Err(s) if is_unreachable(&s) => {
            eprintln!("error: the daemon is unreachable: {}", s.message());
            ExitCode::from(super::exit::UNREACHABLE)
        }
        Err(s) if s.code() == tonic::Code::Unavailable => {
            // The daemon answered but cannot serve (starting, or stopping with the wait cut
            // short): unavailable, not refused; the message carries the attachment's state.
            eprintln!("error: {}: {}", code_name(s.code()), s.message());
            ExitCode::from(super::exit::UNREACHABLE)
        }
        Err(s) => {
            eprintln!("error: {}: {}", code_name(s.code()), s.message());
            ExitCode::from(super::exit::REFUSED)
        }
    }
}

/// A WatchEvents status told in the CLI's terms: the API's cursor is `after_seq`, the flag is
/// `--after`.
fn with_cli_cursor(s: tonic::Status, last: u64) -> tonic::Status {
    let hint = match s.code() {
        tonic::Code::OutOfRange => format!(
            "{} (this CLI: `fabric-agent node` shows the log's range; `events --after SEQ` \
             resumes after SEQ)",
            s.message()
        ),
        tonic::Code::Unavailable => format!(
            "{} (this CLI: resume with `fabric-agent events --after {last} --follow`)",
            s.message()
        ),
        _ => return s,
    };
    tonic::Status::new(s.code(), hint)
}

/// How a call that waited for a state ended.
enum Outcome {
    /// The requested state was reached, or no wait was asked.
    Done,
    /// `--wait` ran out while the attachment was still on its way.
    Expired { state: String, reason: String },
    /// The attachment reached a state from which the requested one cannot follow.
    Ended { state: String, reason: String },
}

fn waited(a: Option<&pb::Attachment>, wait: Option<u32>, want: pb::AttachmentState) -> Outcome {
    let (Some(a), Some(_)) = (a, wait) else {
        return Outcome::Done;
    };
    let state = pb::AttachmentState::try_from(a.state).unwrap_or_default();
    let name = state
        .as_str_name()
        .trim_start_matches("ATTACHMENT_STATE_")
        .to_owned();
    let terminal = matches!(
        state,
        pb::AttachmentState::Failed | pb::AttachmentState::Released
    ) || (want == pb::AttachmentState::Active
        && state == pb::AttachmentState::Releasing);
    if state == want {
        Outcome::Done
    } else if terminal {
        Outcome::Ended {
            state: name,
            reason: a.reason.clone(),
        }
    } else {
        Outcome::Expired {
            state: name,
            reason: a.reason.clone(),
        }
    }
}

/// The daemon went away between connecting and answering.
fn is_unreachable(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unavailable && std::error::Error::source(s).is_some()
}

/// A gRPC code as the API documentation spells it (`INVALID_ARGUMENT`).
pub fn code_name(code: tonic::Code) -> String {
    let camel = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkeys_are_hex_as_infiniband_tools_write_them() {
        assert_eq!(parse_pkey("0x0a12"), Ok(0x0a12));
        assert_eq!(parse_pkey("0X0A12"), Ok(0x0a12));
        assert_eq!(parse_pkey("0a12"), Ok(0x0a12));
        assert_eq!(parse_pkey("7ffe"), Ok(0x7ffe));
        assert_eq!(
            parse_pkey("1234"),
            Ok(0x1234),
            "bare digits are hex, never decimal"
        );
        assert_eq!(parse_pkey("012"), Ok(0x12));
        for bad in [
            "", "0x", "12345", "0x1g", "-1", "18z", "1.5", "0", "7fff", "0xffff",
        ] {
            assert!(parse_pkey(bad).is_err(), "{bad:?}");
        }
        let e = parse_pkey("0x8a12").unwrap_err();
        assert_eq!(
            e,
            PKeyArgError::MembershipBit {
                text: "0x8a12".into(),
                value: 0x8a12
            }
        );
        // The message says which base was meant.
        assert!(e.to_string().contains("0x0a12"), "{e}");
    }

    #[test]
    fn codes_are_spelled_as_in_the_api_docs() {
        assert_eq!(code_name(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(tonic::Code::NotFound), "NOT_FOUND");
        assert_eq!(code_name(tonic::Code::Ok), "OK");
    }
}
