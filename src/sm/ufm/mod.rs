//! UFM backend: programs this node's port GUIDs into partitions through NVIDIA UFM's REST API.
//!
//! # How an apply works
//! `apply` is declarative and serialised (one at a time per backend). For every key that is
//! desired, or that this node's GUIDs may still be in, it
//! 1. reads the partition first (`GET …/resources/pkeys/{pkey}?guids_data=true`; on the first
//!    apply after start one `GET …/resources/pkeys?guids_data=true` instead, which also finds
//!    every key this node's GUIDs are in, so keys programmed before a restart are released);
//! 2. changes only what differs: releases undesired keys first (frees table slots), then adds
//!    missing GUIDs or fixes their membership (`POST …/resources/pkeys`, which also re-creates
//!    a partition UFM dropped when its last GUID left) and removes GUIDs of replaced ports;
//! 3. reads back only the keys it changed and checks them with the same comparison.
//!
//! A no-change re-apply therefore costs one `GET` per key and writes nothing. Removal uses
//! `POST …/actions/remove_guids_from_pkey` and falls back, for good, to
//! `DELETE …/resources/pkeys/{pkey}/guids/{g1,g2}` when UFM answers 404/405 to the old form.
//! `200 {}` and 404 on a read both mean "no such key"; 404 on a removal means already gone.
//!
//! # Failures
//! Timeouts, connection errors and 5xx are retried per request with capped, jittered backoff,
//! then reported as [`SmError::Unavailable`]. A 4xx is [`SmError::Refused`] at once. After
//! 401/403 the backend does not call UFM again until the credentials file's contents change
//! (checked on every apply). Credentials are never logged nor put in any message.

mod auth;
mod config;
mod http;
mod plan;
mod wire;

pub use config::{TokenScheme, UfmConfig};

use super::{ApplyOutcome, SmError, SubnetManager};
use crate::domain::{Guid, Membership, NodeMemberships, PKey};
use async_trait::async_trait;
use auth::{Credential, Loaded, Secret};
use config::AuthConfig;
use futures::{StreamExt, TryStreamExt};
use http::{Answer, Exchange, RetryPolicy, Unreachable};
use plan::{plan_key, KeyPlan};
use reqwest::{Certificate, Client, Method, StatusCode};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use wire::{guid_text, pkey_text, PartitionState};

/// Partition reads in flight at once during one apply.
const READ_CONCURRENCY: usize = 8;

/// The UFM subnet-manager backend.
pub struct UfmSm {
    base: String,
    auth: AuthConfig,
    policy: RetryPolicy,
    index0: bool,
    ip_over_ib: bool,
    client_settings: ClientSettings,
    state: tokio::sync::Mutex<State>,
}

/// What every HTTP client this backend builds shares.
struct ClientSettings {
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Trusted roots from `ca_file` (empty: the system's trust store).
    roots: Vec<Certificate>,
}

impl fmt::Debug for UfmSm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UfmSm")
            .field("base", &self.base)
            .field("auth", &self.auth)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Which removal request UFM accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RemovalForm {
    /// `POST …/actions/remove_guids_from_pkey` (deprecated, widely deployed).
    Action,
    /// `DELETE …/resources/pkeys/{pkey}/guids/{g1,g2}`.
    Delete,
}

struct State {
    client: Client,
    /// Fingerprint of the client certificate + key the client was built with.
    identity: Option<u64>,
    /// Fingerprint of credentials UFM rejected, with its answer: not sent again.
    rejected: Option<(u64, StatusCode)>,
    /// Whether the start-up scan of all partitions has been done.
    discovered: bool,
    /// Keys this node's GUIDs may be in, with the GUIDs put there.
    programmed: BTreeMap<PKey, BTreeSet<Guid>>,
    removal: RemovalForm,
}

/// Why an apply stopped, before mapping to [`SmError`].
enum Failure {
    Rejected(StatusCode),
    Refused(String),
    Unavailable(String),
}

impl From<Unreachable> for Failure {
    fn from(u: Unreachable) -> Self {
        Failure::Unavailable(u.0)
    }
}

impl ClientSettings {
    /// An HTTP client with the timeouts, trusted roots and (optionally) client identity.
    fn build(&self, identity: Option<&Secret>) -> Result<Client, SmError> {
        crate::tls::install_crypto_provider();
        let mut builder = Client::builder()
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("fabric-agent/", env!("CARGO_PKG_VERSION")));
        if !self.roots.is_empty() {
            builder = builder.tls_certs_only(self.roots.clone());
        }
        if let Some(pem) = identity {
            let identity = reqwest::Identity::from_pem(pem.expose().as_bytes()).map_err(|e| {
                SmError::Refused(format!(
                    "UFM client_cert/client_key are not a usable PEM certificate and key: {e}"
                ))
            })?;
            builder = builder.identity(identity);
        }
        builder
            .build()
            .map_err(|e| SmError::Refused(format!("UFM HTTP client: {e}")))
    }
}

/// Counts for the outcome line.
#[derive(Default)]
struct Summary {
    programmed: usize,
    released: usize,
    unchanged: usize,
}

impl UfmSm {
    /// Builds the backend: validates `config`, reads the CA bundle and (for client-certificate
    /// authentication) the certificate and key. Credentials files are read on every apply.
    pub fn new(config: &UfmConfig) -> Result<UfmSm, SmError> {
        config
            .validate()
            .map_err(|why| SmError::Refused(format!("UFM configuration: {why}")))?;
        let auth = config.auth().map_err(SmError::Refused)?;
        let url = config.base_url().map_err(SmError::Refused)?;
        let base = format!(
            "{}{}",
            url.as_str().trim_end_matches('/'),
            config.effective_api_path(&auth)
        );
        let roots = match &config.ca_file {
            None => Vec::new(),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    SmError::Refused(format!("cannot read UFM ca_file {}: {e}", path.display()))
                })?;
                let roots = Certificate::from_pem_bundle(&pem).map_err(|e| {
                    SmError::Refused(format!("UFM ca_file {}: {e}", path.display()))
                })?;
                if roots.is_empty() {
                    return Err(SmError::Refused(format!(
                        "UFM ca_file {}: no PEM certificate found",
                        path.display()
                    )));
                }
                roots
            }
        };
        let client_settings = ClientSettings {
            connect_timeout: Duration::from_millis(config.connect_timeout_ms),
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            roots,
        };
        let (client, identity) = match &auth {
            AuthConfig::ClientCert { cert, key } => {
                let (pem, fp) = auth::load_identity_blocking(cert, key)?;
                (client_settings.build(Some(&pem))?, Some(fp))
            }
            _ => (client_settings.build(None)?, None),
        };
        Ok(UfmSm {
            base,
            auth,
            policy: RetryPolicy {
                retries: config.retries,
                initial: Duration::from_millis(config.backoff_initial_ms),
                max: Duration::from_millis(config.backoff_max_ms),
            },
            index0: config.index0,
            ip_over_ib: config.ip_over_ib,
            client_settings,
            state: tokio::sync::Mutex::new(State {
                client,
                identity,
                rejected: None,
                discovered: false,
                programmed: BTreeMap::new(),
                removal: RemovalForm::Action,
            }),
        })
    }

    /// Rebuilds the client when the client certificate or key changed on disk.
    fn refresh_identity(&self, state: &mut State, loaded: &Loaded) -> Result<(), SmError> {
        if let Credential::ClientCert(pem) = &loaded.credential {
            if state.identity != Some(loaded.fingerprint) {
                state.client = self.client_settings.build(Some(pem))?;
                state.identity = Some(loaded.fingerprint);
            }
        }
        Ok(())
    }

    fn rejected_message(loaded: &Loaded, status: StatusCode) -> String {
        format!(
            "UFM rejected the credentials ({status}); not calling UFM again until {} changes",
            loaded.source.display()
        )
    }

    async fn apply_locked(
        &self,
        state: &mut State,
        desired: &NodeMemberships,
        ports: &BTreeSet<Guid>,
        ex: &Exchange<'_>,
    ) -> Result<Summary, Failure> {
        // 1. Read first.
        let mut current: BTreeMap<PKey, Option<PartitionState>> = BTreeMap::new();
        if !state.discovered {
            let all = self.read_all(ex).await?;
            for (key, partition) in &all {
                let ours: BTreeSet<Guid> = partition
                    .members
                    .keys()
                    .filter(|g| ports.contains(g))
                    .copied()
                    .collect();
                if !ours.is_empty() {
                    state.programmed.entry(*key).or_default().extend(ours);
                }
            }
            state.discovered = true;
            for key in desired.keys.keys().chain(state.programmed.keys()) {
                current.insert(*key, all.get(key).cloned());
            }
        } else {
            let keys: BTreeSet<PKey> = desired
                .keys
                .keys()
                .chain(state.programmed.keys())
                .copied()
                .collect();
            current = self.read_keys(ex, &keys).await?;
        }

        // 2. Change what differs: releases first, then additions.
        let no_stale = BTreeSet::new();
        let mut plans: BTreeMap<PKey, KeyPlan> = BTreeMap::new();
        let mut summary = Summary::default();
        for (key, partition) in &current {
            let want = desired.keys.get(key).map(|s| s.membership);
            let stale = state.programmed.get(key).unwrap_or(&no_stale);
            let plan = plan_key(partition.as_ref(), want, ports, stale, self.index0);
            if plan.is_empty() {
                summary.unchanged += 1;
                self.settle(state, *key, want, ports);
            } else {
                plans.insert(*key, plan);
            }
        }
        for (key, plan) in plans.iter().filter(|(k, _)| !desired.keys.contains_key(k)) {
            self.remove_guids(ex, &mut state.removal, *key, &plan.remove)
                .await?;
            summary.released += 1;
        }
        for (key, plan) in plans.iter().filter(|(k, _)| desired.keys.contains_key(k)) {
            let membership = desired.keys[key].membership;
            if !plan.add.is_empty() {
                // Recorded before sending: an add that times out may still have happened.
                state
                    .programmed
                    .entry(*key)
                    .or_default()
                    .extend(plan.add.iter().copied());
                self.add_guids(ex, *key, membership, &plan.add).await?;
            }
            if !plan.remove.is_empty() {
                self.remove_guids(ex, &mut state.removal, *key, &plan.remove)
                    .await?;
            }
            summary.programmed += 1;
        }

        // 3. Read back what changed.
        let changed: BTreeSet<PKey> = plans.keys().copied().collect();
        let after = self.read_keys(ex, &changed).await?;
        for (key, partition) in &after {
            let want = desired.keys.get(key).map(|s| s.membership);
            let stale = state.programmed.get(key).unwrap_or(&no_stale);
            let left = plan_key(partition.as_ref(), want, ports, stale, self.index0);
            if !left.is_empty() {
                return Err(Failure::Unavailable(format!(
                    "UFM accepted the change to {key} but reading it back shows {} GUID(s) still to add and {} to remove",
                    left.add.len(),
                    left.remove.len()
                )));
            }
            self.settle(state, *key, want, ports);
        }
        Ok(summary)
    }

    /// Bookkeeping once a key is confirmed right.
    fn settle(
        &self,
        state: &mut State,
        key: PKey,
        want: Option<Membership>,
        ports: &BTreeSet<Guid>,
    ) {
        match want {
            Some(_) => {
                state.programmed.insert(key, ports.clone());
            }
            None => {
                state.programmed.remove(&key);
            }
        }
    }

    async fn read_all(&self, ex: &Exchange<'_>) -> Result<BTreeMap<PKey, PartitionState>, Failure> {
        let path = "/resources/pkeys?guids_data=true";
        let answer = ex.call(Method::GET, path, None).await?;
        if !answer.status.is_success() {
            return Err(self.refusal(ex, &answer, "listing partitions"));
        }
        wire::parse_all(&answer.body).map_err(|why| {
            Failure::Refused(format!(
                "UFM's answer to GET {path} is not understood: {why}"
            ))
        })
    }

    async fn read_keys(
        &self,
        ex: &Exchange<'_>,
        keys: &BTreeSet<PKey>,
    ) -> Result<BTreeMap<PKey, Option<PartitionState>>, Failure> {
        futures::stream::iter(keys.iter().copied())
            .map(|key| async move { self.read_key(ex, key).await.map(|p| (key, p)) })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await
    }

    async fn read_key(
        &self,
        ex: &Exchange<'_>,
        key: PKey,
    ) -> Result<Option<PartitionState>, Failure> {
        let path = format!("/resources/pkeys/{}?guids_data=true", pkey_text(key));
        let answer = ex.call(Method::GET, &path, None).await?;
        match answer.status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => wire::parse_partition(&answer.body).map_err(|why| {
                Failure::Refused(format!(
                    "UFM's answer to GET {path} is not understood: {why}"
                ))
            }),
            _ => Err(self.refusal(ex, &answer, &format!("reading {key}"))),
        }
    }

    async fn add_guids(
        &self,
        ex: &Exchange<'_>,
        key: PKey,
        membership: Membership,
        guids: &[Guid],
    ) -> Result<(), Failure> {
        let body = wire::AddGuids {
            pkey: pkey_text(key),
            guids: guids.iter().map(|g| guid_text(*g)).collect(),
            membership,
            index0: self.index0,
            ip_over_ib: self.ip_over_ib,
        };
        let body = serde_json::to_value(&body).expect("AddGuids serialises");
        let answer = ex
            .call(Method::POST, "/resources/pkeys", Some(&body))
            .await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self.refusal(
                ex,
                &answer,
                &format!("adding {} GUID(s) to {key}", guids.len()),
            ))
        }
    }

    async fn remove_guids(
        &self,
        ex: &Exchange<'_>,
        form: &mut RemovalForm,
        key: PKey,
        guids: &[Guid],
    ) -> Result<(), Failure> {
        let what = format!("removing {} GUID(s) from {key}", guids.len());
        if *form == RemovalForm::Action {
            let body = serde_json::to_value(wire::RemoveGuids {
                pkey: pkey_text(key),
                guids: guids.iter().map(|g| guid_text(*g)).collect(),
            })
            .expect("RemoveGuids serialises");
            let answer = ex
                .call(Method::POST, "/actions/remove_guids_from_pkey", Some(&body))
                .await?;
            match answer.status {
                s if s.is_success() => return Ok(()),
                // The deprecated action is gone (or the key vanished): the resource form decides.
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {}
                _ => return Err(self.refusal(ex, &answer, &what)),
            }
        }
        let list: Vec<String> = guids.iter().map(|g| guid_text(*g)).collect();
        let path = format!(
            "/resources/pkeys/{}/guids/{}",
            pkey_text(key),
            list.join(",")
        );
        let answer = ex.call(Method::DELETE, &path, None).await?;
        match answer.status {
            s if s.is_success() => {
                if *form == RemovalForm::Action {
                    tracing::info!("UFM no longer offers remove_guids_from_pkey; using DELETE …/guids from now on");
                    *form = RemovalForm::Delete;
                }
                Ok(())
            }
            StatusCode::NOT_FOUND => Ok(()),
            _ => Err(self.refusal(ex, &answer, &what)),
        }
    }

    /// A non-success answer below 500 as a failure: credentials, or a refusal with UFM's words.
    fn refusal(&self, ex: &Exchange<'_>, answer: &Answer, what: &str) -> Failure {
        if matches!(
            answer.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Failure::Rejected(answer.status);
        }
        let text = String::from_utf8_lossy(&answer.body);
        let mut text: String = ex
            .credential
            .redact(text.trim())
            .chars()
            .take(200)
            .collect();
        if text.is_empty() {
            text = "no details".into();
        }
        Failure::Refused(format!("UFM refused {what} ({}): {text}", answer.status))
    }
}

#[async_trait]
impl SubnetManager for UfmSm {
    fn backend(&self) -> &'static str {
        "ufm"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        _generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let ports: BTreeSet<Guid> = desired.port_guids.iter().copied().collect();
        if ports.is_empty() {
            if desired.keys.is_empty() {
                return Ok(ApplyOutcome {
                    detail: "UFM: no fabric ports, nothing to program".into(),
                });
            }
            return Err(SmError::Refused(
                "no InfiniBand port GUIDs on this node to program keys for".into(),
            ));
        }
        let mut state = self.state.lock().await;
        let loaded = auth::load(&self.auth).await?;
        if let Some((fingerprint, status)) = state.rejected {
            if fingerprint == loaded.fingerprint {
                return Err(SmError::Refused(Self::rejected_message(&loaded, status)));
            }
        }
        self.refresh_identity(&mut state, &loaded)?;
        let client = state.client.clone();
        let ex = Exchange {
            client: &client,
            base: &self.base,
            credential: &loaded,
            policy: self.policy,
            sent: AtomicUsize::new(0),
        };
        let result = self.apply_locked(&mut state, desired, &ports, &ex).await;
        let sent = ex.sent.load(Ordering::Relaxed);
        match result {
            Ok(s) => {
                state.rejected = None;
                Ok(ApplyOutcome {
                    detail: format!(
                        "UFM: {} key(s) programmed, {} released, {} already right ({sent} requests)",
                        s.programmed, s.released, s.unchanged
                    ),
                })
            }
            Err(Failure::Rejected(status)) => {
                state.rejected = Some((loaded.fingerprint, status));
                let message = Self::rejected_message(&loaded, status);
                tracing::warn!(%message, "UFM apply refused");
                Err(SmError::Refused(message))
            }
            Err(Failure::Refused(message)) => Err(SmError::Refused(message)),
            Err(Failure::Unavailable(message)) => Err(SmError::Unavailable(message)),
        }
    }
}
