//! The remote subnet-manager backend's gRPC client: sends a node's desired set to the SM host's
//! agent (`fabric.sm.v1.Partitions`) over mTLS, or plaintext to a loopback address. Settings
//! and their rules are `sm::remote`'s; conversion and error mapping are [`super::convert`]'s.
//!
//! Several SM hosts: every apply goes to all of them at once, and is acknowledged only when
//! every one acknowledged that generation. Otherwise the apply fails naming each host that did
//! not: [`SmError::StaleGeneration`] when any host holds a newer generation (the highest one,
//! so the node moves past every host's), else [`SmError::Refused`] when any host answered with
//! a refusal, else [`SmError::Unreachable`]. The keys stay in doubt (the reconciler's rules).

use super::convert::{memberships_to_proto, sm_error_of};
use crate::api::grant_v1::signed_grant_to_proto;
use crate::domain::{NodeMemberships, SignedGrant};
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::sm::remote::{RemoteConfig, RemoteConfigError};
use crate::sm::{ApplyOutcome, SmError, SmFailure, SubnetManager};
use async_trait::async_trait;
use std::path::PathBuf;
use thiserror::Error;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Why the remote backend could not be built.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// A setting is missing or inconsistent.
    #[error("invalid subnet_manager.remote: {0}")]
    Config(#[from] RemoteConfigError),
    /// A certificate or key file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// tonic refused the endpoint or TLS settings.
    #[error("endpoint: {0}")]
    Endpoint(#[from] tonic::transport::Error),
}

fn read(path: &PathBuf) -> Result<Vec<u8>, RemoteError> {
    std::fs::read(path).map_err(|source| RemoteError::Read {
        path: path.clone(),
        source,
    })
}

/// One SM host's agent.
struct SmHostClient {
    /// The endpoint as configured (names the host in errors).
    endpoint: String,
    client: PartitionsClient<Channel>,
}

/// The remote subnet manager: one client per configured SM host.
pub struct RemoteSm {
    hosts: Vec<SmHostClient>,
}

/// Builds a lazily connecting channel to `url` with `config`'s timeouts and TLS material.
pub fn sm_host_channel(config: &RemoteConfig, url: &str) -> Result<Channel, RemoteError> {
    let mut endpoint = Endpoint::from_shared(url.to_owned())?
        .connect_timeout(config.connect_timeout())
        .timeout(config.request_timeout());
    if url.starts_with("https://") {
        let (Some(ca), Some(cert), Some(key)) = (&config.ca, &config.cert, &config.key) else {
            return Err(RemoteConfigError::HttpsWithoutCertificates.into());
        };
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)?))
            .identity(Identity::from_pem(read(cert)?, read(key)?));
        if let Some(d) = &config.domain_name {
            tls = tls.domain_name(d.clone());
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(endpoint.connect_lazy())
}

impl RemoteSm {
    /// Builds the clients. The connections are made lazily on the first apply, so the SM hosts
    /// need not be up when the agent starts.
    pub fn new(config: &RemoteConfig) -> Result<RemoteSm, RemoteError> {
        config.validate()?;
        let hosts = config
            .all_endpoints()
            .into_iter()
            .map(|endpoint| {
                Ok(SmHostClient {
                    client: PartitionsClient::new(sm_host_channel(config, &endpoint)?),
                    endpoint,
                })
            })
            .collect::<Result<Vec<_>, RemoteError>>()?;
        Ok(RemoteSm { hosts })
    }
}

/// One apply's answers, host by host, folded into the node's outcome.
fn fold_answers(
    answers: Vec<(&str, Result<pb::SetNodeMembershipsResponse, tonic::Status>)>,
    generation: u64,
) -> Result<ApplyOutcome, SmError> {
    let single = answers.len() == 1;
    let mut sweeps = 0;
    let mut stale: Option<u64> = None;
    let mut refused = false;
    let mut failed: Vec<String> = Vec::new();
    let mut first: Option<tonic::Status> = None;
    for (endpoint, answer) in answers {
        match answer {
            Ok(reply) => sweeps = sweeps.max(reply.sweeps),
            Err(status) => {
                let error = sm_error_of(&status, generation);
                if single {
                    return Err(error);
                }
                match &error {
                    SmError::StaleGeneration { stored, .. } => {
                        stale = Some(stale.map_or(*stored, |s| s.max(*stored)));
                    }
                    SmError::Refused(_) => refused = true,
                    SmError::Unreachable(_) => {}
                }
                failed.push(format!("{endpoint} ({error})"));
                first.get_or_insert(status);
            }
        }
    }
    if let Some(stored) = stale {
        return Err(SmError::StaleGeneration {
            sent: generation,
            stored,
        });
    }
    let Some(status) = first else {
        return Ok(ApplyOutcome {
            detail: if single {
                format!("SM host merged the memberships ({sweeps} sweeps requested there so far)")
            } else {
                "every SM host merged the memberships".to_owned()
            },
        });
    };
    let failure = SmFailure::SmHost {
        message: format!(
            "not acknowledged by {} of the fabric's SM hosts: {}",
            failed.len(),
            failed.join("; ")
        ),
        source: std::sync::Arc::new(status),
    };
    Err(if refused {
        SmError::Refused(failure)
    } else {
        SmError::Unreachable(failure)
    })
}

#[async_trait]
impl SubnetManager for RemoteSm {
    fn backend(&self) -> &'static str {
        "remote"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        self.apply_granted(desired, &[], generation).await
    }

    /// Sends the set with the grants of every desired attachment: the SM host refuses keys
    /// without one when it requires grants.
    async fn apply_granted(
        &self,
        desired: &NodeMemberships,
        grants: &[SignedGrant],
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let mut memberships = memberships_to_proto(desired, generation);
        memberships.grants = grants.iter().map(signed_grant_to_proto).collect();
        let request = pb::SetNodeMembershipsRequest {
            memberships: Some(memberships),
        };
        let answers = futures::future::join_all(self.hosts.iter().map(|host| {
            let mut client = host.client.clone();
            let request = request.clone();
            async move {
                let answer = client
                    .set_node_memberships(request)
                    .await
                    .map(tonic::Response::into_inner);
                (host.endpoint.as_str(), answer)
            }
        }))
        .await;
        fold_answers(answers, generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn ok() -> Result<pb::SetNodeMembershipsResponse, Status> {
        Ok(pb::SetNodeMembershipsResponse { sweeps: 3 })
    }

    #[test]
    fn every_host_must_acknowledge() {
        assert!(fold_answers(vec![("a", ok()), ("b", ok())], 7).is_ok());
        let err = fold_answers(
            vec![
                ("https://a", ok()),
                ("https://b", Err(Status::unavailable("down"))),
            ],
            7,
        )
        .unwrap_err();
        assert!(matches!(err, SmError::Unreachable(_)), "{err:?}");
        assert!(err.to_string().contains("https://b"), "{err}");
        assert!(!err.to_string().contains("https://a ("), "{err}");
        let err = fold_answers(
            vec![
                ("a", Err(Status::unavailable("down"))),
                (
                    "b",
                    Err(Status::new(Code::FailedPrecondition, "operator file")),
                ),
            ],
            7,
        )
        .unwrap_err();
        assert!(matches!(err, SmError::Refused(_)), "{err:?}");
        assert!(err.to_string().contains("a (") && err.to_string().contains("b ("));
    }

    #[test]
    fn one_host_error_is_unchanged() {
        let err = fold_answers(vec![("a", Err(Status::unavailable("down")))], 7).unwrap_err();
        assert!(matches!(err, SmError::Unreachable(_)));
        assert!(!err.to_string().contains("not acknowledged by"), "{err}");
    }
}
