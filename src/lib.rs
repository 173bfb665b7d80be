//! fabric-agent: the per-node agent of a GPU cloud's InfiniBand partitions.
//!
//! The control plane asks it (gRPC) to attach an instance on this node to a partition (a P_Key)
//! and to release it when the instance is terminated. The agent programs the key through the
//! fabric's subnet manager and reports, durably, ACTIVE when every fabric port holds the key and
//! RELEASED when none does.
//!
//! # Layout
//! Dependencies point downward, and no two files import each other (`scripts/imports.py` lists
//! the arrows between modules and any pair of files that import each other): `cli` -> `daemon` ->
//! `config` -> `api` -> `agent` -> {`sm`, `observe`, `store`} -> {`embedded_fabric`, `mad`} ->
//! `domain`, a module may skip levels downward; `sys` (for `api`, `config`, `observe`, `sm`,
//! `cli`), `tls` (for `api`, `sm`), `systemd` (for `cli`) and `test_mutation` (for `agent`,
//! `store`, `daemon`) are leaves beside them. `cli` (the
//! commands) and `daemon` (the composition root `cli serve` calls) are the only modules that
//! name concrete backends and observers. `config` composes the settings structs that `agent`,
//! `sm`, `observe` and `api` own; nothing below `daemon`/`cli` reads the whole
//! [`config::Config`]. Inside `api`: `gate` -> `settings` -> {`agent_v1`, `sm_v1`} -> `server`,
//! with `client` (channels), `grant_v1` and `proto` leaves the protocols use; the two protocols
//! do not import each other.
//!
//! - [`cli`]      — clap subcommands: `serve`, `node`, `attach`, `release`, `attachments`, `events`, `ports`, `check-config`, `doctor`, `get`, `grant` (keygen/sign, local), `opensm` (check/apply of the SM host's operator file, local), `reset-node-generation` (`reset_generation`: a stranded node's reset on an SM host, local), `fence-sm-host` (`fence_sm_host`: an operator's fence of a dead peer SM host, through the running agent); the client ones (`remote`) call the daemon through `api::agent_v1::client`; `exit` the one table of exit codes, `verdict` the check-report shape, `output` tables that wrap (never cut) and JSON, `generate` the man pages and completions, `secret_file` the start-up check of secret files' modes and links
//! - [`daemon`]   — the composition root: builds store, SM backend, observer, agent and listeners from a validated config; `StartError`
//! - [`config`]   — the TOML configuration, parsed strictly and validated once into typed values (node id, fabric, port GUIDs, socket mode, the listeners' client allowlists and node mapping, the SM host's peer identities); one file per section it owns (log, metrics, events, ports, subnet_manager, grants); `mod.rs` composes them with the sections other modules own (`api::settings`: listen + TLS, limits; the reconciler's, the backends' and the observers' own); `reference` the fabric-agent.toml(5) table, tested against the structs
//! - [`api`]      — tonic services (thin), one folder per protocol, each with its services, its boundary module (`convert`: protobuf <-> domain, the one error <-> status mapping) and its client: `agent_v1` (FabricAgent; `page_token` the ListAttachments token codec; `client` the typed client the CLI uses, no tonic type above `api`), `sm_v1` (the SM host's Partitions `service`, its `authorisation`, `client` the remote SM backend's gRPC client (every configured SM host), `stored_set` its start check's read of every SM host, `host_set` the node's rule for which SM hosts must acknowledge (the set the SM hosts state, by identity), `peers` the SM hosts' anti-entropy client, `metrics` the SM host's gauges); `gate` the call gate (`guarded` the tower layer, `caller`: SO_PEERCRED, typed mTLS identities, `node_identity` the node mapping, `auth` allowlists, `limits` and `conn_limits` the call and connection bounds, `quota` the per-identity quotas with slots reserved for operators and peers, `socket_guard`, the `audit` trail); at the top the server and its listeners, reloadable TLS (`server_tls`), the metrics listener, `client` channels, `grant_v1` (fabric.grant.v1: decode once, keep the signed bytes), `settings` the `[listen]` (+ TLS) and `[limits]` sections, each validated into typed values with its own error (`ListenError`, `LimitsError`)
//! - [`agent`]    — command handling, the reconciler (pure `sm_knowledge` (what the node knows of the SM: the truth rules' SM side) + pure `plan` (state changes) + `schedule` (retry, resync) + `stall` (the bounded re-apply of a wait without progress) + `conditions` + pure `start_check` (at start, what the SM hosts hold against the last acknowledged set: a store rollback, removals only until they answered), driven by the I/O loop `runner` (its `runner::start` the start check's I/O)), event publishing
//! - [`store`]    — durable desired state and the ordered event log (redb); its side-file mirror detects a restored database
//! - [`sm`]       — `SubnetManager` trait and backends: embedded, opensm, remote, ufm; `FabricSide` (what `fabric.sm.v1.Partitions` calls: the OpenSM SM host, `ufm::broker` the UFM broker, `ufm::broker::inventory` its port-ownership rule and per-node inventory cache), `grant_judge` (the fabric side's grant rules, pure), `blocking` (where the backends run blocking file and store I/O: blocking threads, or inline for the deterministic simulation); `opensm::{peers, peer_state, sync, fence, fenced_host, generation_bound, standby, sminfo, state, opensm_state}` several SM hosts (peers, what hosts tell each other and the sync status, anti-entropy and the catch-up gate, fencing a dead peer on physical evidence and the fenced host's record, the bound on generations learned from peers and the stranded-node reset, a standby's file, the role from the SM's own SMInfo, OpenSM's SM state, and that state as its log announced it); `opensm::group_commit` also paces each node's admissions; `opensm::{log_line, mkey_check, running_start, host_conditions}` OpenSM's own log lines read by structure, the M_Key precondition, the keys a running OpenSM keeps when its agent restarts, the SM host's standing conditions
//! - [`observe`]  — `PortObserver` trait and observers: embedded, smp, sysfs, verbs, auto, combined; `presence` (whether a covered port missing from the read has left the fabric, by the SA's word), `sa_presence` (asking the SA through a configured device, for sysfs and verbs)
//! - [`embedded_fabric`] — the embedded backend's simulated fabric: its port tables (not the deterministic simulation, which is `testkit/src/sim`)
//! - [`mad`]      — MAD/SMP/SA codec: byte offsets, golden vectors; no unsafe, no I/O
//! - [`sys`]      — the only unsafe code and the only `nix`/`libc` use: umad device I/O, libibverbs wrappers, user/group lookups, host name, signals (through pidfds to a named process), open flags
//! - [`domain`]   — P_Keys, GUIDs, partitions, attachments, ports, events, grants (Ed25519 verification, rotating key sets, typed refusals): pure types
//! - [`systemd`]  — sd_notify: READY, STATUS, WATCHDOG (pets while a `Watched` loop answers), STOPPING
//! - [`tls`]      — the process-wide rustls crypto provider
//! - [`test_mutation`] — debug builds only: one truth rule switched off on purpose by `FABRIC_AGENT_TEST_MUTATION`, to prove the chaos checker catches a broken rule (a release build has no switch)
//! - [`proto`]    — generated gRPC code (lives in `api/`, re-exported)

#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::cast_possible_truncation)]
pub mod agent;
pub mod api;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod domain;
pub mod embedded_fabric;
pub mod mad;
pub mod observe;
pub use api::proto;
pub mod sm;
pub mod store;
#[allow(unsafe_code)] // the one place for it: every block carries a `// SAFETY:` comment
pub mod sys;
pub mod systemd;
pub mod test_mutation;
pub mod tls;
