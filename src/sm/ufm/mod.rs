//! UFM backend: programs this node's port GUIDs into partitions through NVIDIA UFM's REST API.
//!
//! # How an apply works
//! `apply` is declarative and serialised (one at a time per backend). The backend keeps a
//! persisted ledger ([`UfmLedger`]): per key, every GUID this node put (or found) in it and has
//! not yet seen removed, visible now or not. For every key that is desired or in the ledger, it
//! 0. reads UFM's partition stamp (`GET …/resources/pkeys/last_updated`) and may stop there
//!    (see "Skipping unchanged state" below);
//! 1. reads the partitions first: with `list_reads` (the default) and two or more keys to read,
//!    one `GET …/resources/pkeys?guids_data=true` answers for all of them; otherwise one
//!    `GET …/resources/pkeys/{pkey}?guids_data=true` per key. The first apply after start
//!    always reads the whole list when `list_reads` is on, and records in the ledger every key
//!    this node's visible GUIDs are in;
//! 2. records every GUID it is about to add in the ledger, durably, before sending anything;
//! 3. changes only what differs: removes every ledger GUID (and visible port) from keys no
//!    longer desired, first (frees table slots); then adds missing visible GUIDs or fixes their
//!    membership (`POST …/resources/pkeys`, which also re-creates a partition UFM dropped when
//!    its last GUID left) and removes ledger GUIDs that are no longer among the node's ports;
//! 4. reads back the keys it changed (same read rule as step 1) and checks them with the same
//!    comparison.
//!
//! Ok therefore means: a read of UFM made during this apply (or, for a skipped re-check, the
//! stamp rule below) shows every desired key holding every visible port with the desired
//! membership, no ledger GUID of a port the node no longer has in a desired key, and none of
//! the ledger's GUIDs in any key no longer desired. A ledger entry is dropped only after such a
//! read showed the GUID gone.
//!
//! UFM's whole-list answer grows with every membership in the fabric. When it is larger than
//! the answer cap while per-key reads of the same apply work, the backend reads per key from
//! then on; the start-up scan then finds only the desired and ledger keys (logged). Any other
//! failure of the list read fails the apply, as before.
//!
//! # Skipping unchanged state
//! UFM keeps one stamp, `last_updated`, for its whole partition configuration (public UFM
//! clients and NVIDIA's UFM simulator read it at `GET …/resources/pkeys/last_updated`; the
//! project's reference lists only the partition reads, so the backend treats the endpoint as
//! optional: a 4xx answer or a document without `last_updated` turns skipping off for this
//! process). The backend remembers the stamp only from an apply that (a) read the stamp,
//! (b) then read every key it looks at and found all of them right, and (c) sent no write.
//! A later apply for the same desired keys, memberships and port GUIDs whose stamp read
//! returns exactly the remembered string answers Ok without reading the partitions, at most
//! `max_skipped_rechecks` times in a row; then it reads again.
//!
//! What is trusted: that UFM moves `last_updated` on every partition change, whoever makes it
//! (REST, GUI, another agent), so an equal stamp means no partition changed since the
//! confirming read. A change that leaves the stamp equal (a UFM whose stamp has a coarse tick
//! and a change within the same tick after that read, or a UFM restart that restores an old
//! stamp) stays unseen until the next full read, at most `max_skipped_rechecks` re-checks
//! later. Changes made behind UFM's back (an SM configuration edited by hand) are invisible to
//! every UFM read, skipped or not. Any change of the desired set or of the node's ports, any
//! failed apply and any apply that wrote forgets the stamp.
//!
//! A no-change re-check therefore costs one small `GET` while the stamp holds, and otherwise
//! one `GET` of the list (or one per key). Every request first takes a token from the
//! backend's budget (`max_requests_per_sec`, `request_burst`): beyond it requests wait, never
//! fail. Removal uses `POST …/actions/remove_guids_from_pkey` and falls back, for good, to
//! `DELETE …/resources/pkeys/{pkey}/guids/{g1,g2}` when UFM answers 404/405 to the old form.
//! `200 {}` and 404 on a read both mean "no such key"; 404 on a removal means already gone.
//!
//! # Store restores
//! The ledger lives in the node's store. A store restored from a copy brings back an old
//! ledger: it lacks every add sent after the copy was taken, which may be in UFM now or land
//! there up to `late_write_window_ms` after it was sent, in keys the ledger does not name.
//! [`UfmSm::after_restore`], called at start when the store says it was found restored, puts
//! the whole ledger under a *restore watch* until `late_write_window_ms` from then, recorded
//! durably before it returns. While it stands:
//! - every apply reads UFM's whole partition list (even with `list_reads` off), records every
//!   key holding a visible port, as the start-up scan does, and never skips on the stamp;
//! - every key is treated as watched (the late-write rules, `ledger.rs`): the node's GUIDs are
//!   removed from every key that does not give them, kept in the ledger while read absent,
//!   and a GUID found in a key where an earlier list read of this process did not find it is
//!   a late write (`UFM_LATE_WRITE`);
//! - nothing is added (a port must not take a key while a key the restored ledger forgot may
//!   still land on it: two partitions on one port), and no apply is acknowledged
//!   (`UfmError::RestoreWatch`).
//!
//! The watch ends with the first apply whose list read started after it and that left every
//! key right (that apply adds what is missing). A list that cannot be read (over the answer
//! cap) keeps it standing: fail closed. Only visible ports are looked for: a GUID of a port the
//! node no longer sees, added after the copy, is not found.
//!
//! # Failures
//! Timeouts, connection errors and 5xx are retried per request with capped, jittered backoff,
//! then reported as [`SmError::Unreachable`]. A 4xx is [`SmError::Refused`] at once. After
//! 401/403 the backend does not call UFM again until the credentials file's contents change
//! (checked on every apply). Credentials are never logged nor put in any message.
//!
//! # The link to UFM
//! Requests go through [`UfmLink`] (`link.rs`): one HTTP attempt, the wall clock the
//! late-write window is measured on, and the retry jitter. The backend uses reqwest and the
//! system clock; [`UfmSm::with_link`] plugs in another link (the deterministic simulation's
//! model UFM, on its paused clock). Retries, the budget and every rule above stay in the
//! backend.
//!
//! # Files
//! This file holds the backend's state and the apply; `subnet_manager.rs` the trait (one apply
//! under the lock, and the acknowledgement rule); `reads.rs` and `writes.rs` are its
//! partition reads and writes, `ledger_io.rs` the ledger's load, save, late-write record and
//! restore watch,
//! `plan.rs` the pure per-key plan, `wire.rs` UFM's JSON, `http.rs` retries and the budget's
//! use, `link.rs` one attempt, `ledger.rs` the ledger type and its store, `auth.rs` the
//! credentials, `config.rs` `[subnet_manager.ufm]`, `ports.rs` UFM's port list, `broker/` the
//! UFM broker.

mod auth;
pub mod broker;
mod budget;
mod config;
mod error;
mod http;
mod ledger;
mod ledger_io;
mod link;
mod plan;
mod ports;
mod reads;
#[cfg(test)]
mod rearm_tests;
mod subnet_manager;
mod wire;
mod writes;

pub use config::{TokenScheme, UfmConfig, UfmConfigError, UrlParseError};
pub use error::UfmError;
pub use http::NoAnswer;
pub use ledger::{LedgerStoreError, MemoryLedgerStore, UfmLedger, UfmLedgerStore};
pub use link::{Answer as UfmAnswer, LinkError, UfmLink};
pub use ports::{parse_ports, UfmPort};
pub use wire::WireError;

use super::{SmError, SmFailure};
use crate::domain::{Guid, Membership, NodeMemberships, PKey};
use auth::{Credential, Loaded, Secret};
use budget::Budget;
use config::AuthConfig;
use http::{Answer, Exchange, RetryPolicy};
use plan::{plan_key, KeyPlan};
use reqwest::{Certificate, Client, StatusCode};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use wire::PartitionState;

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
    ledger_store: Arc<dyn UfmLedgerStore>,
    /// `list_reads` as configured.
    list_reads: bool,
    /// `max_skipped_rechecks` as configured.
    max_skipped: u32,
    budget: Budget,
    state: tokio::sync::Mutex<State>,
    /// `late_write_window_ms` as configured.
    late_window_ms: i64,
    /// Late writes seen (a watched key's GUIDs re-appeared after a read showed them gone),
    /// reported as the `UFM_LATE_WRITE` condition until the key's watch ends.
    late_writes: std::sync::Mutex<BTreeMap<PKey, String>>,
    /// Another way to UFM than reqwest and the system clock ([`UfmSm::with_link`]).
    link: Option<Arc<dyn UfmLink>>,
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
    /// Keys this node's GUIDs may be in, with the GUIDs put there (`None` until loaded from
    /// the ledger store at the first apply).
    ledger: Option<UfmLedger>,
    /// The ledger as last saved: a save is due whenever `ledger` differs.
    saved: UfmLedger,
    removal: RemovalForm,
    /// Whether the whole-list read is still used (off for good once it failed where per-key
    /// reads worked, or when `list_reads` is off).
    list_usable: bool,
    /// Whether UFM answers `…/pkeys/last_updated` (off for good after a 4xx or a foreign
    /// document).
    stamp_supported: bool,
    /// What the last confirming read showed, with the stamp read before it.
    confirmed: Option<Confirmed>,
    /// Watched keys, with the GUIDs not desired in them that a read of this process showed
    /// absent: a later read that finds one of them again saw a late write.
    seen_absent: BTreeMap<PKey, BTreeSet<Guid>>,
    /// Whether this process read the whole list during the restore watch: every visible port
    /// it found then is in the ledger, so one found later in a key where the ledger lacks it
    /// is a late write.
    restore_scanned: bool,
    /// Whether the last apply during the restore watch could not read the whole list.
    restore_unread: bool,
}

/// An apply that read the stamp, then read every key and found all right, and wrote nothing.
struct Confirmed {
    keys: BTreeMap<PKey, Membership>,
    ports: BTreeSet<Guid>,
    /// The ports each key was given (a node whose instances hold different partitions).
    key_ports: BTreeMap<PKey, BTreeSet<Guid>>,
    stamp: String,
    /// Re-checks answered from the stamp alone since.
    skipped: u32,
}

/// Why an apply stopped, before mapping to [`SmError`].
enum Failure {
    /// UFM answered 401/403: the credentials are rejected.
    Rejected(StatusCode),
    /// Retrying soon will not fix it.
    Refused(UfmError),
    /// No usable answer: worth retrying.
    NoAnswer(UfmError),
}

impl From<NoAnswer> for Failure {
    fn from(e: NoAnswer) -> Self {
        Failure::NoAnswer(UfmError::NoAnswer(e))
    }
}

/// A failure retrying soon will not fix.
pub(crate) fn refused(e: UfmError) -> SmError {
    SmError::Refused(SmFailure::Ufm(e))
}

impl ClientSettings {
    /// An HTTP client with the timeouts, trusted roots and (optionally) client identity.
    fn build(&self, identity: Option<&Secret>) -> Result<Client, SmError> {
        crate::tls::install_crypto_provider();
        let mut builder = Client::builder()
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            // At most 2 idle connections kept per agent: a fleet of agents must not hold
            // READ_CONCURRENCY idle (TLS) connections each at UFM between re-checks.
            .pool_max_idle_per_host(2)
            .user_agent(concat!("fabric-agent/", env!("CARGO_PKG_VERSION")));
        if !self.roots.is_empty() {
            builder = builder.tls_certs_only(self.roots.clone());
        }
        if let Some(pem) = identity {
            let identity = reqwest::Identity::from_pem(pem.expose().as_bytes())
                .map_err(|e| refused(UfmError::Identity(Arc::new(e))))?;
            builder = builder.identity(identity);
        }
        builder
            .build()
            .map_err(|e| refused(UfmError::Client(Arc::new(e))))
    }
}

/// Counts for the outcome line.
#[derive(Default)]
struct Summary {
    programmed: usize,
    released: usize,
    unchanged: usize,
    /// Answered from the unchanged `last_updated` stamp, without reading partitions.
    skipped: bool,
}

impl UfmSm {
    /// Builds the backend: validates `config`, reads the CA bundle and (for client-certificate
    /// authentication) the certificate and key. Credentials files are read on every apply.
    /// `ledger_store` keeps the ledger of GUIDs this node put in keys (see [`UfmLedger`]); it
    /// is read at the first apply.
    pub fn new(
        config: &UfmConfig,
        ledger_store: Arc<dyn UfmLedgerStore>,
    ) -> Result<UfmSm, SmError> {
        let invalid = |why| refused(UfmError::Config(why));
        config.validate().map_err(invalid)?;
        let auth = config.auth().map_err(invalid)?;
        let url = config.base_url().map_err(invalid)?;
        let base = format!(
            "{}{}",
            url.as_str().trim_end_matches('/'),
            config.effective_api_path(&auth)
        );
        let roots = match &config.ca_file {
            None => Vec::new(),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    refused(UfmError::ReadFile {
                        what: "ca_file",
                        path: path.clone(),
                        source: Arc::new(e),
                    })
                })?;
                let roots = Certificate::from_pem_bundle(&pem).map_err(|e| {
                    refused(UfmError::CaBundle {
                        path: path.clone(),
                        source: Arc::new(e),
                    })
                })?;
                if roots.is_empty() {
                    return Err(refused(UfmError::BadFile {
                        what: "ca_file",
                        path: path.clone(),
                        problem: "no PEM certificate found",
                    }));
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
            ledger_store,
            list_reads: config.list_reads,
            max_skipped: config.max_skipped_rechecks,
            budget: Budget::new(config.max_requests_per_sec, config.request_burst),
            state: tokio::sync::Mutex::new(State {
                client,
                identity,
                rejected: None,
                discovered: false,
                ledger: None,
                saved: UfmLedger::default(),
                removal: RemovalForm::Action,
                list_usable: config.list_reads,
                stamp_supported: true,
                confirmed: None,
                seen_absent: BTreeMap::new(),
                restore_scanned: false,
                restore_unread: false,
            }),
            late_window_ms: i64::try_from(config.late_write_window_ms).unwrap_or(i64::MAX),
            late_writes: std::sync::Mutex::default(),
            link: None,
        })
    }

    /// The same backend reaching UFM through `link` (its clock and jitter included) instead
    /// of reqwest and the system clock: a model UFM on a simulated clock. Authentication and
    /// TLS are then the link's business; every rule of the backend is unchanged.
    #[must_use]
    pub fn with_link(mut self, link: Arc<dyn UfmLink>) -> UfmSm {
        self.link = Some(link);
        self
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

    fn rejected(loaded: &Loaded, status: StatusCode) -> UfmError {
        UfmError::CredentialsRejected {
            status,
            source_file: loaded.source.clone(),
        }
    }

    async fn apply_locked(
        &self,
        state: &mut State,
        desired: &NodeMemberships,
        ports: &BTreeSet<Guid>,
        ex: &Exchange<'_>,
    ) -> Result<Summary, Failure> {
        let State {
            discovered,
            ledger,
            saved,
            removal,
            list_usable,
            stamp_supported,
            confirmed,
            seen_absent,
            restore_scanned,
            restore_unread,
            ..
        } = state;
        let ledger = ledger
            .as_mut()
            .expect("the ledger is loaded before an apply");
        let want: BTreeMap<PKey, Membership> = desired
            .keys
            .iter()
            .map(|(k, s)| (*k, s.membership))
            .collect();
        // Each wanted key goes to its own ports; a key no longer wanted leaves every port.
        let key_ports: BTreeMap<PKey, BTreeSet<Guid>> = desired
            .keys
            .keys()
            .map(|k| (*k, desired.guids_for(*k).into_iter().collect()))
            .collect();
        let ports_of = |key: &PKey| key_ports.get(key).unwrap_or(ports);

        // During a restore watch every apply reads the whole list (module docs, store restores).
        let restoring = ledger.restore_watched_until();

        // 0. Nothing changed at UFM since the last confirming read: trust it (module docs).
        let stamp = if self.max_skipped > 0 && *stamp_supported && restoring.is_none() {
            self.read_stamp(ex, stamp_supported).await?
        } else {
            None
        };
        if let (Some(now), Some(c)) = (&stamp, confirmed.as_mut()) {
            if c.stamp == *now
                && c.keys == want
                && c.ports == *ports
                && c.key_ports == key_ports
                && c.skipped < self.max_skipped
            {
                c.skipped += 1;
                return Ok(Summary {
                    unchanged: want.len(),
                    skipped: true,
                    ..Summary::default()
                });
            }
        }
        *confirmed = None;

        // 1. Read first.
        let read_ms = ex.link.unix_ms();
        let mut restore_read = None;
        let current: BTreeMap<PKey, Option<PartitionState>> = if !*discovered || restoring.is_some()
        {
            let keys = keys_of(desired, ledger);
            // The restore watch reads the list even where per-key reads are configured: only
            // the list shows keys the restored ledger forgot.
            let mut list = *list_usable || restoring.is_some();
            let (picked, all) = self.read_many(ex, &mut list, &keys, true).await?;
            *list_usable &= list;
            let current = match all {
                Some(all) => {
                    for (key, partition) in &all {
                        let ours: BTreeSet<Guid> = partition
                            .members
                            .keys()
                            .filter(|g| ports.contains(g))
                            .copied()
                            .collect();
                        if restoring.is_some() && *restore_scanned {
                            let unknown = ours
                                .iter()
                                .filter(|&&g| {
                                    let undesired = !desired.keys.contains_key(key)
                                        || !ports_of(key).contains(&g);
                                    undesired
                                        && !ledger.guids_ref(*key).is_some_and(|l| l.contains(&g))
                                })
                                .count();
                            if unknown > 0 {
                                self.late_write(ledger, *key, unknown);
                            }
                        }
                        ledger.record(*key, ours);
                    }
                    if restoring.is_some() {
                        *restore_scanned = true;
                        restore_read = Some(read_ms);
                    }
                    keys_of(desired, ledger)
                        .into_iter()
                        .map(|key| (key, all.get(&key).cloned()))
                        .collect()
                }
                None => {
                    if restoring.is_some() {
                        tracing::warn!("UFM's partition list is not readable: this node's store was restored from a copy and no apply is acknowledged until the list can be read");
                    } else if self.list_reads {
                        tracing::warn!("UFM's partition list is not readable here: the start-up scan covers only the desired and ledger keys");
                    }
                    picked
                }
            };
            *restore_unread = restoring.is_some() && restore_read.is_none();
            self.save_ledger(ledger, saved).await?;
            *discovered = true;
            current
        } else {
            self.read_many(ex, list_usable, &keys_of(desired, ledger), false)
                .await?
                .0
        };

        // 2. Plan; keys already right are confirmed by this read.
        let mut plans: BTreeMap<PKey, KeyPlan> = BTreeMap::new();
        let mut summary = Summary::default();
        for (key, partition) in &current {
            let want = desired.keys.get(key).map(|s| s.membership);
            let plan = self.plan(ledger, partition.as_ref(), *key, want, ports_of(key));
            let late = seen_absent.get(key).map_or(0, |gone| {
                plan.remove.iter().filter(|g| gone.contains(g)).count()
            });
            if late > 0 {
                self.late_write(ledger, *key, late);
            }
            if plan.is_empty() {
                summary.unchanged += 1;
                self.confirm_read(ledger, seen_absent, *key, want, ports_of(key), read_ms);
            } else {
                plans.insert(*key, plan);
            }
        }

        // During the restore watch nothing is added: a port must not take a key while one the
        // restored ledger forgot may still land on it (module docs, store restores).
        let restore_ends = restore_read
            .zip(restoring)
            .is_some_and(|(read, until)| read > until);
        if restoring.is_some() && !restore_ends {
            plans.retain(|_, plan| {
                plan.add.clear();
                !plan.is_empty()
            });
        }

        // 3. Write ahead: every GUID about to be added is recorded durably before the request
        //    goes out (an add that fails or times out may still take effect).
        //    The key is watched from now until the latest time the add could still land; an add
        //    answered on its first attempt lifts that again (nothing of it is left to land).
        let sent_ms = ex.link.unix_ms();
        let mut watched_before = BTreeMap::new();
        for (key, plan) in &plans {
            ledger.record(*key, plan.add.iter().copied());
            if !plan.add.is_empty() {
                watched_before.insert(*key, ledger.watched_until(*key));
                ledger.watch(*key, sent_ms.saturating_add(self.late_window_ms));
            }
        }
        self.save_ledger(ledger, saved).await?;

        // 4. Change what differs: releases first (frees table slots), then additions.
        for (key, plan) in plans.iter().filter(|(k, _)| !desired.keys.contains_key(k)) {
            self.remove_guids(ex, removal, *key, &plan.remove).await?;
            summary.released += 1;
        }
        for (key, plan) in plans.iter().filter(|(k, _)| desired.keys.contains_key(k)) {
            let membership = desired.keys[key].membership;
            if !plan.add.is_empty() {
                let before = ex.sent.load(Ordering::Relaxed);
                self.add_guids(ex, *key, membership, &plan.add).await?;
                if ex.sent.load(Ordering::Relaxed) == before + 1 {
                    ledger.restore_watch(*key, watched_before.get(key).copied().flatten());
                }
            }
            if !plan.remove.is_empty() {
                self.remove_guids(ex, removal, *key, &plan.remove).await?;
            }
            summary.programmed += 1;
        }

        // 5. Read back what changed. Entries leave the ledger only once a read showed them gone.
        let changed: BTreeSet<PKey> = plans.keys().copied().collect();
        let read_ms = ex.link.unix_ms();
        let after = if changed.is_empty() {
            BTreeMap::new()
        } else {
            self.read_many(ex, list_usable, &changed, false).await?.0
        };
        let mut wrong: Vec<(PKey, KeyPlan)> = Vec::new();
        for (key, partition) in &after {
            let want = desired.keys.get(key).map(|s| s.membership);
            let left = self.plan(ledger, partition.as_ref(), *key, want, ports_of(key));
            if left.is_empty() {
                self.confirm_read(ledger, seen_absent, *key, want, ports_of(key), read_ms);
            } else {
                wrong.push((*key, left));
            }
        }
        // The restore watch ends with an apply whose whole-list read started after it and
        // that left every key right: nothing the restored ledger forgot can land any more.
        if wrong.is_empty() && restore_ends {
            ledger.end_restore_watch();
            *restore_scanned = false;
        }
        self.save_ledger(ledger, saved).await?;
        if let Some((key, left)) = wrong.first() {
            return Err(Failure::NoAnswer(UfmError::NotApplied {
                key: *key,
                to_add: left.add.len(),
                to_remove: left.remove.len(),
                other_keys: wrong.len() - 1,
            }));
        }
        // Only a write-free apply's stamp vouches for every key it read (module docs).
        if plans.is_empty() {
            *confirmed = stamp.map(|stamp| Confirmed {
                keys: want,
                ports: ports.clone(),
                key_ports: key_ports.clone(),
                stamp,
                skipped: 0,
            });
        }
        Ok(summary)
    }

    /// Bookkeeping once a read started at `read_ms` showed `key` right. While the key is
    /// watched, the ledger keeps its GUIDs that are no longer desired in it (the key no longer
    /// desired at all, or a port no longer given it): later applies re-read the key and remove
    /// a re-appearance. Once a read started after the watch ended shows the key right, those
    /// GUIDs, the watch of a key no longer desired and any late-write report go.
    fn confirm_read(
        &self,
        ledger: &mut UfmLedger,
        seen_absent: &mut BTreeMap<PKey, BTreeSet<Guid>>,
        key: PKey,
        want: Option<Membership>,
        ports: &BTreeSet<Guid>,
        read_ms: i64,
    ) {
        let watched = ledger.watch_end(key).is_some_and(|until| read_ms <= until);
        let undesired: BTreeSet<Guid> = match want {
            Some(_) => ledger.guids(key).difference(ports).copied().collect(),
            None => ledger.guids(key).union(ports).copied().collect(),
        };
        match want {
            _ if watched && !undesired.is_empty() => {
                seen_absent.insert(key, undesired);
                if want.is_some() {
                    let kept: BTreeSet<Guid> = ledger.guids(key).union(ports).copied().collect();
                    ledger.confirm(key, &kept);
                }
            }
            None if watched => {
                seen_absent.insert(key, undesired);
            }
            None => {
                ledger.restore_watch(key, None);
                seen_absent.remove(&key);
                self.late_writes_mut().remove(&key);
                confirm(ledger, key, want, ports);
            }
            Some(_) => {
                seen_absent.remove(&key);
                if !watched {
                    self.late_writes_mut().remove(&key);
                }
                confirm(ledger, key, want, ports);
            }
        }
    }

    /// What to change in `key` for this node: the visible ports and the ledger's GUIDs.
    fn plan(
        &self,
        ledger: &UfmLedger,
        partition: Option<&PartitionState>,
        key: PKey,
        want: Option<Membership>,
        ports: &BTreeSet<Guid>,
    ) -> KeyPlan {
        let none = BTreeSet::new();
        let recorded = ledger.guids_ref(key).unwrap_or(&none);
        plan_key(partition, want, ports, recorded, self.index0)
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
        Failure::Refused(UfmError::Refused {
            what: what.to_owned(),
            status: answer.status,
            text,
        })
    }
}

/// A read's answer that does not parse: a refusal (asking again gets the same answer).
fn not_understood(path: &str, why: WireError) -> Failure {
    Failure::Refused(UfmError::NotUnderstood {
        path: path.to_owned(),
        source: Arc::new(why),
    })
}

/// The states of the keys asked for, and the whole list when it was read.
type PartitionReads = (
    BTreeMap<PKey, Option<PartitionState>>,
    Option<BTreeMap<PKey, PartitionState>>,
);

/// Every key to look at: the desired ones and every key the ledger holds GUIDs in or watches.
fn keys_of(desired: &NodeMemberships, ledger: &UfmLedger) -> BTreeSet<PKey> {
    desired
        .keys
        .keys()
        .copied()
        .chain(ledger.keys())
        .chain(ledger.watched().map(|(k, _)| k))
        .collect()
}

/// Bookkeeping once a read showed `key` right: the ledger keeps exactly the GUIDs now in it
/// (every port when desired, none otherwise).
fn confirm(ledger: &mut UfmLedger, key: PKey, want: Option<Membership>, ports: &BTreeSet<Guid>) {
    match want {
        Some(_) => ledger.confirm(key, ports),
        None => ledger.confirm(key, &BTreeSet::new()),
    };
}
