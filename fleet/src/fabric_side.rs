//! What the control plane tells the fabric side itself, on every SM host of a fabric, rather
//! than trusting a node to do it: revoke an instance when it is released (a rooted node that
//! ignores its release still loses the key, and its grants are consumed), and retire a P_Key
//! when its partition is deleted (no grant of the old partition is accepted again, so the key
//! can go to another tenant). Both calls are idempotent: on a failure, call again.

use crate::proto::sm::partitions_client::PartitionsClient;
use crate::proto::sm::{RetirePartitionKeyRequest, RevokeInstanceRequest};
use std::time::Duration;
use tonic::transport::Channel;

/// One SM host that did not do what it was asked (the call may still have taken effect there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmHostFailure {
    /// The SM host's endpoint.
    pub endpoint: String,
    /// Its status code, or "no answer in time".
    pub message: String,
}

impl std::fmt::Display for SmHostFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.endpoint, self.message)
    }
}

/// Joins failures for an error message.
pub fn describe(failures: &[SmHostFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether a refusal means the SM host has nothing of this kind to act on: it does not require
/// grants (so it records none to revoke and no key to retire), or (a revocation) it holds no
/// set of the node.
fn nothing_to_do(s: &tonic::Status, revoke: bool) -> bool {
    (s.code() == tonic::Code::FailedPrecondition && s.message().contains("does not require grants"))
        || (revoke && s.code() == tonic::Code::NotFound)
}

async fn each<F, Fut>(hosts: &[(String, Channel)], limit: Duration, call: F) -> Vec<SmHostFailure>
where
    F: Fn(PartitionsClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let calls = hosts.iter().map(|(endpoint, ch)| {
        let fut = call(PartitionsClient::new(ch.clone()));
        async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(Ok(())) => None,
                Ok(Err(s)) => Some(SmHostFailure {
                    endpoint: endpoint.clone(),
                    message: format!("{:?}: {}", s.code(), s.message()),
                }),
                Err(_) => Some(SmHostFailure {
                    endpoint: endpoint.clone(),
                    message: "no answer in time".into(),
                }),
            }
        }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// RevokeInstance on every one of `hosts` (concurrently, each within `limit`): the failures.
/// A host that holds no set of the node, or does not require grants, has nothing to revoke.
pub async fn revoke_everywhere(
    hosts: &[(String, Channel)],
    limit: Duration,
    node_id: &str,
    instance_id: &str,
) -> Vec<SmHostFailure> {
    each(hosts, limit, |mut c| async move {
        let r = c
            .revoke_instance(RevokeInstanceRequest {
                node_id: node_id.to_owned(),
                instance_id: instance_id.to_owned(),
            })
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(s) if nothing_to_do(&s, true) => Ok(()),
            Err(s) => Err(s),
        }
    })
    .await
}

/// RetirePartitionKey on every one of `hosts` (concurrently, each within `limit`), as of
/// `retired_at_unix_ms` (this client's clock, the one its grants are stamped with): the
/// failures. A host that does not require grants has nothing to retire.
pub async fn retire_everywhere(
    hosts: &[(String, Channel)],
    limit: Duration,
    partition_id: &str,
    pkey: u32,
    retired_at_unix_ms: u64,
) -> Vec<SmHostFailure> {
    each(hosts, limit, |mut c| async move {
        let r = c
            .retire_partition_key(RetirePartitionKeyRequest {
                pkey,
                retired_at_unix_ms,
                partition_id: partition_id.to_owned(),
            })
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(s) if nothing_to_do(&s, false) => Ok(()),
            Err(s) => Err(s),
        }
    })
    .await
}
