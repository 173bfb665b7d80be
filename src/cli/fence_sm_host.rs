//! `fabric-agent fence-sm-host NAME`: run on a live SM host, fences peer SM host `NAME` there
//! after the same physical check as the automatic fence (`sm::opensm::fence`): the running
//! agent (reached on its socket, `fabric.sm.v1.Partitions/FenceSmHost`) checks that the peer's
//! agent has not answered its pulls for `fence_after_ms` and that the peer's SM port does not
//! answer SMInfo (or is not in the fabric), stores the fence durably and from then on states it
//! to the nodes. Run it on every live SM host: a node excuses a host only when every SM host
//! that answers holds it fenced.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | fenced (or already fenced) |
//! | 64   | configuration: this host has no peer SM hosts |
//! | 65   | refused: not a peer, its agent answers, its SM answers SMInfo, or it cannot be checked; nothing changed |
//! | 69   | the agent cannot be reached |
//! | 71   | the fence could not be stored |
//! | 77   | the caller may not fence (not a privileged local caller or an operator) |

use super::client::Target;
use super::exit;
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use std::process::ExitCode;

/// Asks the agent at `target` to fence `host`.
pub async fn run(host: &str, target: &Target) -> ExitCode {
    let channel = match target {
        Target::Unix(path) => crate::api::client::unix(path).await,
        Target::Tcp(url, tls) => crate::api::client::tcp(url, tls).await,
    };
    let channel = match channel {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(exit::UNREACHABLE);
        }
    };
    let answer = PartitionsClient::new(channel)
        .fence_sm_host(pb::FenceSmHostRequest {
            host: host.to_owned(),
        })
        .await;
    match answer {
        Ok(f) => {
            let f = f.into_inner();
            println!(
                "SM host {} is fenced on this host since {} (unix ms): {}. Fence it on every other live SM host too; it rejoins when its agent answers again, caught up.",
                f.host, f.since_unix_ms, f.evidence
            );
            ExitCode::SUCCESS
        }
        Err(s) => {
            eprintln!("error: {}", s.message());
            ExitCode::from(code_of(&s))
        }
    }
}

/// The exit code of a refusal.
fn code_of(s: &tonic::Status) -> u8 {
    use tonic::Code;
    let transport = std::error::Error::source(s).is_some();
    match s.code() {
        _ if transport => exit::UNREACHABLE,
        Code::NotFound => exit::DATA_ERROR,
        Code::FailedPrecondition if s.message().contains("no peer SM hosts") => exit::CONFIG,
        Code::FailedPrecondition => exit::DATA_ERROR,
        Code::Unavailable => exit::OS_ERROR,
        Code::PermissionDenied | Code::Unauthenticated => exit::NO_PERMISSION,
        Code::Unimplemented => exit::CONFIG,
        _ => exit::UNREACHABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    #[test]
    fn refusals_have_their_codes() {
        assert_eq!(code_of(&Status::not_found("x")), exit::DATA_ERROR);
        assert_eq!(
            code_of(&Status::failed_precondition("its SM answers SMInfo")),
            exit::DATA_ERROR
        );
        assert_eq!(
            code_of(&Status::failed_precondition(
                "this host has no peer SM hosts ([subnet_manager.opensm_ha])"
            )),
            exit::CONFIG
        );
        assert_eq!(code_of(&Status::unavailable("store")), exit::OS_ERROR);
        assert_eq!(
            code_of(&Status::permission_denied("no")),
            exit::NO_PERMISSION
        );
    }
}
