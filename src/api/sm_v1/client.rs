//! The remote subnet-manager backend's gRPC client: sends a node's desired set to the SM host's
//! agent (`fabric.sm.v1.Partitions`) over mTLS, or plaintext to a loopback address. Settings
//! and their rules are `sm::remote`'s; conversion and error mapping are [`super::convert`]'s.
//!
//! Several SM hosts: every apply goes to all of them at once, and is acknowledged only when
//! every SM host the answers name (less those every answering host holds fenced) acknowledged
//! that generation through one of the endpoints, compared by identity ([`super::host_set`]).
//! Otherwise the apply fails naming each host that did not (and why a silent one is not
//! fenced, as the answering hosts say), and any host-set problem (`SM_HOST_SET_INCOMPLETE`): [`SmError::StaleGeneration`] when any host holds a newer generation (the highest one,
//! so the node moves past every host's), else [`SmError::Refused`] when any host answered with
//! a refusal, else [`SmError::Unreachable`]. The keys stay in doubt (the reconciler's rules).
//! A status the SM host's agent sent is its answer, so a refusal even with UNAVAILABLE or
//! ABORTED; only a transport failure or a timeout is "no answer" (`classify`).

use super::convert::memberships_to_proto;
use super::host_answer::classify;
pub use super::host_answer::HostAnswer;
pub use super::stored_set::answer_of as stored_set_answer;
use crate::api::grant_v1::signed_grant_to_proto;
use crate::domain::{NodeId, NodeMemberships, SignedGrant};
use crate::proto::sm as pb;
use crate::proto::sm::partitions_client::PartitionsClient;
use crate::sm::remote::{RemoteConfig, RemoteConfigError};
use crate::sm::{ApplyOutcome, HostStoredSet, SmError, SmFailure, SubnetManager};
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
    /// The name TLS verifies in its certificate (https), `None` on plaintext.
    verified: Option<String>,
    client: PartitionsClient<Channel>,
}

/// The remote subnet manager: one client per configured SM host.
pub struct RemoteSm {
    hosts: Vec<SmHostClient>,
    /// Plaintext endpoints: the name each stated in its last answer.
    stated: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    /// The host-set problems of the last apply (`SM_HOST_SET_INCOMPLETE`).
    host_set: std::sync::Mutex<Vec<String>>,
    /// The SM-host set as the last finished apply saw it (`GetNode`).
    sm_hosts: std::sync::Mutex<Option<crate::domain::SmHostSet>>,
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
                    verified: endpoint
                        .starts_with("https://")
                        .then(|| {
                            config
                                .domain_name
                                .clone()
                                .or_else(|| crate::sm::opensm::peers::url_host(&endpoint))
                        })
                        .flatten(),
                    endpoint,
                })
            })
            .collect::<Result<Vec<_>, RemoteError>>()?;
        Ok(RemoteSm {
            hosts,
            stated: Default::default(),
            host_set: Default::default(),
            sm_hosts: Default::default(),
        })
    }
}

/// One apply's answers, host by host, folded into the node's outcome, and the host-set
/// problems seen ([`super::host_set`]), for the node's condition.
pub fn fold_answers(
    answers: Vec<HostAnswer<'_>>,
    generation: u64,
) -> (Result<ApplyOutcome, SmError>, Vec<String>) {
    let single = answers.len() == 1;
    let mut sweeps = 0;
    let mut stale: Option<u64> = None;
    let mut refused = false;
    let mut errors: Vec<Option<(SmError, tonic::Status)>> = Vec::with_capacity(answers.len());
    for a in &answers {
        match &a.answer {
            Ok(reply) => {
                sweeps = sweeps.max(reply.sweeps);
                errors.push(None);
            }
            Err(status) => {
                let error = classify(status, generation);
                if single {
                    return (Err(error), Vec::new());
                }
                match &error {
                    SmError::StaleGeneration { stored, .. } => {
                        stale = Some(stale.map_or(*stored, |s| s.max(*stored)));
                    }
                    SmError::Refused(_) => refused = true,
                    SmError::Unreachable(_) => {}
                }
                errors.push(Some((error, status.clone())));
            }
        }
    }
    if let Some(stored) = stale {
        return (
            Err(SmError::StaleGeneration {
                sent: generation,
                stored,
            }),
            Vec::new(),
        );
    }
    let verdict = super::host_set::judge(&super::host_set_view::endpoint_views(&answers));
    if verdict.complete() {
        let excused = if verdict.excused.is_empty() {
            String::new()
        } else {
            format!(
                "; fenced by every answering SM host, excused: {}",
                verdict.excused.join(", ")
            )
        };
        let detail = if single && verdict.excused.is_empty() {
            format!("SM host merged the memberships ({sweeps} sweeps requested there so far)")
        } else {
            format!(
                "every SM host merged the memberships (acknowledged by {}{excused})",
                verdict.acknowledged.join(", ")
            )
        };
        let outcome = ApplyOutcome {
            detail,
            acknowledged_by: verdict.acknowledged,
        };
        return (Ok(outcome), verdict.problems);
    }
    let mut failed: Vec<String> = Vec::new();
    let mut first: Option<tonic::Status> = None;
    for i in &verdict.unacknowledged {
        let endpoint = answers[*i].endpoint;
        match &errors[*i] {
            Some((error, status)) => {
                failed.push(format!("{endpoint} ({error})"));
                first.get_or_insert_with(|| status.clone());
            }
            None => failed.push(format!("{endpoint} (its acknowledgement is not counted)")),
        }
    }
    let problems = verdict.problems.clone();
    let mut message = format!(
        "not acknowledged by {} of the fabric's SM hosts",
        failed.len()
            + problems
                .iter()
                .filter(|p| p.contains("is not among"))
                .count()
    );
    if !failed.is_empty() {
        message.push_str(&format!(": {}", failed.join("; ")));
    }
    if !problems.is_empty() {
        message.push_str(&format!(
            "; the SM-host set is not covered: {}",
            problems.join("; ")
        ));
    }
    let mut not_fenced: Vec<&str> = answers
        .iter()
        .filter_map(|a| a.answer.as_ref().ok())
        .flat_map(|r| r.not_fenced.iter().map(String::as_str))
        .collect();
    not_fenced.sort_unstable();
    not_fenced.dedup();
    if !not_fenced.is_empty() {
        message.push_str(&format!("; {}", not_fenced.join("; ")));
    }
    let host_set_refusal = !problems.is_empty();
    let status = first.unwrap_or_else(|| tonic::Status::failed_precondition(message.clone()));
    let failure = SmFailure::SmHost {
        message,
        source: std::sync::Arc::new(status),
    };
    (
        Err(if refused || host_set_refusal || failed.is_empty() {
            SmError::Refused(failure)
        } else {
            SmError::Unreachable(failure)
        }),
        problems,
    )
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

    /// Every configured SM host's stored set for the node (asked in `sm_v1::stored_set`).
    async fn stored_sets(&self, node: &NodeId) -> Option<Vec<HostStoredSet>> {
        let hosts = self.hosts.iter();
        let hosts = hosts.map(|h| (h.endpoint.as_str(), h.client.clone()));
        Some(super::stored_set::query(hosts, node).await)
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
                (host, answer)
            }
        }))
        .await;
        let answers: Vec<HostAnswer<'_>> = {
            let mut stated = self.stated.lock().unwrap_or_else(|p| p.into_inner());
            answers
                .into_iter()
                .map(|(host, answer)| {
                    if let (None, Ok(reply)) = (&host.verified, &answer) {
                        if !reply.host.is_empty() {
                            stated.insert(host.endpoint.clone(), reply.host.clone());
                        }
                    }
                    HostAnswer {
                        endpoint: host.endpoint.as_str(),
                        verified: host.verified.clone(),
                        remembered: stated.get(&host.endpoint).cloned(),
                        answer,
                    }
                })
                .collect()
        };
        let answered_unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let view = super::host_set_view::view(&answers, generation, answered_unix_ns);
        *self.sm_hosts.lock().unwrap_or_else(|p| p.into_inner()) = Some(view);
        let (outcome, problems) = fold_answers(answers, generation);
        if !problems.is_empty() {
            tracing::warn!(problems = ?problems, "the SM hosts' answers name a host set this node's endpoints do not cover");
        }
        *self.host_set.lock().unwrap_or_else(|p| p.into_inner()) = problems;
        outcome
    }

    fn sm_hosts(&self) -> Option<crate::domain::SmHostSet> {
        self.sm_hosts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `SM_HOST_SET_INCOMPLETE` while the last apply's answers named a host set the endpoints
    /// do not cover.
    fn conditions(&self) -> Vec<crate::domain::Condition> {
        let problems = self.host_set.lock().unwrap_or_else(|p| p.into_inner());
        if problems.is_empty() {
            return Vec::new();
        }
        vec![crate::domain::Condition {
            kind: crate::domain::ConditionKind::SmHostSetIncomplete,
            detail: format!(
                "the SM hosts' answers name a host set this node's endpoints do not cover, so no apply is acknowledged: {}",
                problems.join("; ")
            ),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn ok() -> Result<pb::SetNodeMembershipsResponse, Status> {
        Ok(pb::SetNodeMembershipsResponse {
            sweeps: 3,
            ..Default::default()
        })
    }

    /// What tonic gives for a host it could not reach: the transport error behind the status.
    fn unreachable() -> Status {
        Status::from_error(Box::new(std::io::Error::other("tcp connect error")))
    }

    fn fold(
        answers: Vec<(&str, Result<pb::SetNodeMembershipsResponse, Status>)>,
    ) -> Result<ApplyOutcome, SmError> {
        fold_answers(
            answers
                .into_iter()
                .map(|(endpoint, answer)| HostAnswer {
                    endpoint,
                    verified: None,
                    remembered: None,
                    answer,
                })
                .collect(),
            7,
        )
        .0
    }

    #[test]
    fn an_answer_is_a_refusal_never_unreachable() {
        for status in [
            Status::unavailable("OpenSM has not confirmed the file"),
            Status::aborted("older generation"),
        ] {
            let err = fold(vec![("https://a", Err(status))]).unwrap_err();
            assert!(matches!(err, SmError::Refused(_)), "{err:?}");
        }
        let err = fold(vec![("a", ok()), ("b", Err(Status::unavailable("busy")))]).unwrap_err();
        assert!(matches!(err, SmError::Refused(_)), "{err:?}");
        let err = fold(vec![("a", Err(unreachable()))]).unwrap_err();
        assert!(matches!(err, SmError::Unreachable(_)), "{err:?}");
        let err = fold(vec![("a", Err(Status::deadline_exceeded("timeout")))]).unwrap_err();
        assert!(matches!(err, SmError::Unreachable(_)), "{err:?}");
    }

    #[test]
    fn every_host_must_acknowledge() {
        assert!(fold(vec![("a", ok()), ("b", ok())]).is_ok());
        let err = fold(vec![("https://a", ok()), ("https://b", Err(unreachable()))]).unwrap_err();
        assert!(matches!(err, SmError::Unreachable(_)), "{err:?}");
        assert!(err.to_string().contains("https://b"), "{err}");
        assert!(!err.to_string().contains("https://a ("), "{err}");
        let err = fold(vec![
            ("a", Err(unreachable())),
            (
                "b",
                Err(Status::new(Code::FailedPrecondition, "operator file")),
            ),
        ])
        .unwrap_err();
        assert!(matches!(err, SmError::Refused(_)), "{err:?}");
        assert!(err.to_string().contains("a (") && err.to_string().contains("b ("));
    }

    #[test]
    fn one_host_error_is_unchanged() {
        let err = fold(vec![("a", Err(unreachable()))]).unwrap_err();
        assert!(matches!(err, SmError::Unreachable(_)));
        assert!(!err.to_string().contains("not acknowledged by"), "{err}");
    }

    fn named(
        host: &str,
        known: &[&str],
        fenced: &[&str],
    ) -> Result<pb::SetNodeMembershipsResponse, Status> {
        Ok(super::super::host_set::reply(host, known, fenced))
    }

    #[test]
    fn a_node_whose_endpoints_lack_a_known_host_never_counts_an_apply_complete() {
        let err = fold(vec![(
            "http://127.0.0.1:1",
            named("sm1", &["sm1", "sm2"], &[]),
        )])
        .unwrap_err();
        assert!(matches!(err, SmError::Refused(_)), "{err:?}");
        assert!(
            err.to_string().contains("\"sm2\"") && err.to_string().contains("not among"),
            "{err}"
        );
        let (outcome, problems) = fold_answers(
            vec![HostAnswer {
                endpoint: "http://127.0.0.1:1",
                verified: None,
                remembered: None,
                answer: named("sm1", &["sm1", "sm2"], &[]),
            }],
            7,
        );
        assert!(outcome.is_err());
        assert_eq!(problems.len(), 1);
    }

    #[test]
    fn two_endpoints_answering_as_one_host_are_not_acknowledged() {
        let err = fold(vec![
            ("http://127.0.0.1:1", named("sm1", &["sm1"], &[])),
            ("http://127.0.0.1:2", named("sm1", &["sm1"], &[])),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("answer as one SM host"), "{err}");
    }

    #[test]
    fn a_fenced_host_is_excused_only_when_every_answering_host_says_so() {
        let three = ["sm1", "sm2", "sm3"];
        let dead = || Err(unreachable());
        let err = fold(vec![
            ("http://127.0.0.1:1", named("sm1", &three, &["sm3"])),
            ("http://127.0.0.1:2", named("sm2", &three, &[])),
            ("http://127.0.0.1:3", dead()),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("http://127.0.0.1:3"), "{err}");
        // The dead endpoint's identity is known over TLS (or from an earlier answer).
        let answers = |fenced2: &'static [&'static str]| {
            vec![
                HostAnswer {
                    endpoint: "https://sm1:7443",
                    verified: Some("sm1".into()),
                    remembered: None,
                    answer: named("sm1", &three, &["sm3"]),
                },
                HostAnswer {
                    endpoint: "https://sm2:7443",
                    verified: Some("sm2".into()),
                    remembered: None,
                    answer: named("sm2", &three, fenced2),
                },
                HostAnswer {
                    endpoint: "https://sm3:7443",
                    verified: Some("sm3".into()),
                    remembered: None,
                    answer: dead(),
                },
            ]
        };
        assert!(fold_answers(answers(&[]), 7).0.is_err());
        let ok = fold_answers(answers(&["sm3"]), 7).0.unwrap();
        assert!(ok.detail.contains("excused: sm3"), "{}", ok.detail);
        // The evidence names the hosts that acknowledged, not the excused one.
        assert_eq!(ok.acknowledged_by, ["sm1", "sm2"]);
    }
}
