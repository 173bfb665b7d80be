//! The subcommands that talk to the daemon (`node`, `attach`, `release`, `attachments`,
//! `events`) through the typed [`AgentClient`], and their exit codes.

use super::client::{self, Target};
use super::commands::{AttachArgs, EventsArgs, GetArgs, ListArgs, ReleaseArgs};
use super::{exit, output, Command, Format};
use crate::api::agent_v1::client::{AgentClient, CallError, StatusCode};
use crate::proto::agent as pb;
use std::process::ExitCode;
use std::time::Duration;

/// Runs a subcommand that talks to the daemon.
pub async fn run(command: Command, target: &Target, format: Format) -> ExitCode {
    let mut c = match client::connect(target).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(connect_exit_code(&e));
        }
    };
    let result = match command {
        Command::Node => node(&mut c, format).await,
        Command::Attach(a) => attach(&mut c, a, format).await,
        Command::Release(r) => release(&mut c, r, format).await,
        Command::Attachments(l) => attachments(&mut c, l, format).await,
        Command::Get(g) => get(&mut c, g, format).await,
        Command::Events(e) => events(&mut c, e, format).await,
        Command::Serve
        | Command::CheckConfig(_)
        | Command::Ports
        | Command::Doctor
        | Command::Man(_)
        | Command::Grant(_)
        | Command::Opensm(_)
        | Command::ResetNodeGeneration { .. }
        | Command::FenceSmHost { .. }
        | Command::Completions { .. } => {
            unreachable!("handled locally")
        }
    };
    exit_code(result)
}

/// `node`: this node's view.
async fn node(c: &mut AgentClient, format: Format) -> Result<Outcome, CallError> {
    output::node(&c.node().await?, format);
    Ok(Outcome::Done)
}

/// `attach`: the partition's fabric defaults to the node's.
async fn attach(c: &mut AgentClient, a: AttachArgs, format: Format) -> Result<Outcome, CallError> {
    let grant = match a
        .grant
        .as_deref()
        .map(super::grant::grant_argument)
        .transpose()
    {
        Ok(g) => g,
        Err(e) => {
            return Err(CallError::local(
                crate::api::agent_v1::client::StatusCode::InvalidArgument,
                format!("--grant: {e}"),
            ))
        }
    };
    let fabric = match a.fabric {
        Some(f) => f,
        None => c.node().await?.fabric,
    };
    let r = c
        .attach(pb::AttachPartitionRequest {
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
            wait_ms: a.wait.map(wait_ms),
            grant,
            ports: a
                .ports
                .iter()
                .map(|p| match p {
                    super::commands::PortArg::Device(device, port_number) => pb::PortName {
                        device: device.clone(),
                        port_number: *port_number,
                        port_guid: String::new(),
                    },
                    super::commands::PortArg::Guid(g) => pb::PortName {
                        port_guid: g.clone(),
                        ..Default::default()
                    },
                })
                .collect(),
        })
        .await?;
    Ok(answered(
        r.attachment.as_ref(),
        a.wait,
        pb::AttachmentState::Active,
        format,
    ))
}

/// `release`.
async fn release(
    c: &mut AgentClient,
    r: ReleaseArgs,
    format: Format,
) -> Result<Outcome, CallError> {
    let answer = c
        .release(pb::ReleaseInstanceRequest {
            instance_id: r.instance,
            wait_ms: r.wait.map(wait_ms),
        })
        .await?;
    Ok(answered(
        answer.attachment.as_ref(),
        r.wait,
        pb::AttachmentState::Released,
        format,
    ))
}

/// Prints the attachment an attach or release answered with, and how its wait ended.
fn answered(
    a: Option<&pb::Attachment>,
    wait: Option<Duration>,
    want: pb::AttachmentState,
    format: Format,
) -> Outcome {
    if let Some(attachment) = a {
        output::attachment(attachment, format);
    }
    waited(a, wait, want)
}

/// `attachments`: every page, filtered.
async fn attachments(
    c: &mut AgentClient,
    l: ListArgs,
    format: Format,
) -> Result<Outcome, CallError> {
    let state = l.state.map(|s| s.to_pb() as i32);
    let list = c
        .list(pb::ListAttachmentsRequest {
            state,
            partition_id: l.partition,
            instance_id: l.instance,
            ..Default::default()
        })
        .await?;
    output::attachments(&list, format);
    Ok(Outcome::Done)
}

/// `get`: one instance's attachment; none is NOT_FOUND (exit 1), as `kubectl get` says.
async fn get(c: &mut AgentClient, g: GetArgs, format: Format) -> Result<Outcome, CallError> {
    match c.get(&g.instance).await {
        Ok(a) => {
            output::attachment(&a, format);
            Ok(Outcome::Done)
        }
        Err(e) if e.code == StatusCode::NotFound => Err(CallError {
            message: format!("attachment {:?} not found", g.instance),
            ..e
        }),
        Err(e) => Err(e),
    }
}

/// A `--wait` as the API's milliseconds.
fn wait_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// The exit code of a connection that could not be opened: 77 when the socket refused this
/// user (EACCES/EPERM: the daemon may be healthy), 69 otherwise.
pub(super) fn connect_exit_code(e: &(dyn std::error::Error + 'static)) -> u8 {
    if permission_denied(e) {
        exit::NO_PERMISSION
    } else {
        exit::UNREACHABLE
    }
}

/// Whether any error in `e`'s source chain is an I/O permission error.
fn permission_denied(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::PermissionDenied {
                return true;
            }
        }
        next = err.source();
    }
    false
}

/// `events`: the log after `--after`, then (with `--follow`) live events.
async fn events(c: &mut AgentClient, e: EventsArgs, format: Format) -> Result<Outcome, CallError> {
    let mut stream = c
        .events(pb::WatchEventsRequest {
            after_seq: e.after,
            no_follow: !e.follow,
            ..Default::default()
        })
        .await
        .map_err(|s| with_cli_cursor(s, e.after))?;
    output::event_header(format);
    let mut last = e.after;
    while let Some(ev) = stream.next().await {
        let ev = ev.map_err(|s| with_cli_cursor(s, last))?;
        last = ev.seq;
        output::event(&ev, format);
    }
    Ok(Outcome::Done)
}

/// The exit code of a client subcommand and its message on stderr.
fn exit_code(result: Result<Outcome, CallError>) -> ExitCode {
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Expired { state, reason }) => {
            eprintln!(
                "wait expired: the attachment is {state}{}",
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                }
            );
            ExitCode::from(exit::WAIT_EXPIRED)
        }
        Ok(Outcome::Ended { state, reason }) => {
            eprintln!("error: the attachment ended {state}: {reason}");
            ExitCode::from(exit::REFUSED)
        }
        Err(e) if e.is_unreachable() => {
            eprintln!("error: the daemon is unreachable: {}", e.message);
            ExitCode::from(exit::UNREACHABLE)
        }
        Err(e) if e.code == StatusCode::Unavailable => {
            // The daemon answered but cannot serve (starting, or stopping with the wait cut
            // short): unavailable, not refused; the message carries the attachment's state.
            eprintln!("error: {e}");
            ExitCode::from(exit::UNREACHABLE)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::REFUSED)
        }
    }
}

/// A WatchEvents error told in the CLI's terms: the API's cursor is `after_seq`, the flag is
/// `--after`.
fn with_cli_cursor(e: CallError, last: u64) -> CallError {
    let hint = match e.code {
        StatusCode::OutOfRange => "(this CLI: `fabric-agent node` shows the log's range; \
                                   `events --after SEQ` resumes after SEQ)"
            .to_owned(),
        StatusCode::Unavailable => {
            format!("(this CLI: resume with `fabric-agent events --after {last} --follow`)")
        }
        _ => return e,
    };
    CallError {
        message: format!("{} {hint}", e.message),
        ..e
    }
}

/// How a call that waited for a state ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The requested state was reached, or no wait was asked.
    Done,
    /// `--wait` ran out while the attachment was still on its way.
    Expired { state: String, reason: String },
    /// The attachment reached a state from which the requested one cannot follow.
    Ended { state: String, reason: String },
}

fn waited(
    a: Option<&pb::Attachment>,
    wait: Option<Duration>,
    want: pb::AttachmentState,
) -> Outcome {
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
    let reason = a.reason.clone();
    if state == want {
        Outcome::Done
    } else if terminal {
        Outcome::Ended {
            state: name,
            reason,
        }
    } else {
        Outcome::Expired {
            state: name,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(state: pb::AttachmentState) -> pb::Attachment {
        pb::Attachment {
            state: state as i32,
            reason: "why".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_wait_ends_where_the_wanted_state_cannot_follow() {
        use pb::AttachmentState as S;
        let a = attachment(S::Releasing);
        assert_eq!(waited(Some(&a), None, S::Active), Outcome::Done);
        let five = Some(Duration::from_secs(5));
        assert!(matches!(
            waited(Some(&a), five, S::Active),
            Outcome::Ended { .. }
        ));
        assert!(matches!(
            waited(Some(&a), five, S::Released),
            Outcome::Expired { .. }
        ));
        let a = attachment(S::Active);
        assert_eq!(waited(Some(&a), five, S::Active), Outcome::Done);
    }

    #[test]
    fn cursor_errors_name_the_cli_flag() {
        let e = CallError::local(StatusCode::Unavailable, "stream ended");
        let e = with_cli_cursor(e, 42);
        assert_eq!(e.code, StatusCode::Unavailable);
        assert!(e.message.starts_with("stream ended ("), "{}", e.message);
        assert!(e.message.contains("--after 42 --follow"), "{}", e.message);
        let e = CallError::local(StatusCode::NotFound, "x");
        assert_eq!(with_cli_cursor(e.clone(), 1), e);
    }
}
