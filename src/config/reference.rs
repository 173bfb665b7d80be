//! The configuration reference, `fabric-agent.toml(5)`: one row per key of every section the
//! agent's own structs define, rendered as a man page by `fabric-agent man --dir` and as
//! docs/CONFIG-REFERENCE.md by `fabric-agent man --config-reference` (a test fails when the
//! checked-in page differs from what that prints). A test holds
//! the table to the structs: each section's keys are exactly the fields its struct accepts
//! (serde's own list of expected fields), so a key added to a struct without a row here, or a
//! row for a key that is gone, fails the build's tests. The backends' own sections
//! (`[subnet_manager.opensm]`, `.remote`, `.ufm`, `.ufm_broker`, `.embedded`) are described in docs/OPENSM.md
//! and docs/UFM.md and are not listed here; `[subnet_manager.opensm_ha]` (the SM hosts' peers) is.

/// One configuration key.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The section (`""` for the top level, `listen.tls`, `grants.keys` for the array table).
    pub section: &'static str,
    /// The key.
    pub key: &'static str,
    /// Its TOML type.
    pub ty: &'static str,
    /// Its default, as written in the file (`required` when it has none).
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

const fn k(
    section: &'static str,
    key: &'static str,
    ty: &'static str,
    default: &'static str,
    doc: &'static str,
) -> Key {
    Key {
        section,
        key,
        ty,
        default,
        doc,
    }
}

/// Every key of the sections this page covers, section by section.
pub const KEYS: &[Key] = &[
    k("", "node_id", "string", "the host name", "This node's id as the control plane knows it."),
    k("", "fabric", "string", "required", "The fabric this node's InfiniBand ports are cabled to; attaches naming another fabric are refused."),
    k("", "state_dir", "path", "\"/var/lib/fabric-agent\"", "Where the durable store (state.redb) lives."),
    k("", "allow_full_default", "bool", "false", "Accept fabric ports that are full members of the default partition (0xffff), or an OpenSM Default entry granting ALL=full. Without it such a posture is a standing condition and tenant keys are not reported ACTIVE (node) or served (SM host)."),
    k("", "listen", "table", "", "Listeners, below."),
    k("", "subnet_manager", "table", "", "The subnet-manager backend, below."),
    k("", "observer", "table", "", "The port observer, below."),
    k("", "ports", "table", "", "Which ports belong to the fabric, below."),
    k("", "events", "table", "", "Event log retention, below."),
    k("", "reconciler", "table", "", "Reconciler timing, below."),
    k("", "metrics", "table", "", "The OpenMetrics endpoint, below."),
    k("", "log", "table", "", "Logging, below."),
    k("", "limits", "table", "", "Resource bounds of the gRPC listeners, below."),
    k("", "grants", "table", "", "The control plane's signed grants, below."),
    k("listen", "unix_socket", "path", "\"/run/fabric-agent/agent.sock\"", "Unix socket for local use (the CLI). Restart to change."),
    k("listen", "unix_socket_mode", "string", "\"0660\"", "Its mode, octal text."),
    k("listen", "read_group", "string", "the agent's group", "Group (name or gid) whose members may call the read-only RPCs on the unix socket."),
    k("listen", "allowed_uids", "array of integers", "[]", "Users besides root and the agent's own that may call mutating RPCs on the unix socket."),
    k("listen", "tcp", "address", "none", "TCP address for the control plane (mTLS, [listen.tls])."),
    k("listen", "insecure_plaintext_for_tests", "bool", "false", "UNSAFE, test rigs only: plaintext gRPC on a loopback tcp address."),
    k("listen", "plaintext_loopback", "bool", "none", "Replaced by insecure_plaintext_for_tests; present only to say so."),
    k("listen", "tls", "table", "none", "TLS for tcp, below; its files and lists re-read on SIGHUP (other file paths need a restart)."),
    k("listen.tls", "cert", "path", "required", "PEM certificate chain of this agent."),
    k("listen.tls", "key", "path", "required", "PEM private key."),
    k("listen.tls", "client_ca", "path", "required", "PEM CA bundle client certificates must chain to."),
    k("listen.tls", "allowed_clients", "array of strings", "[]", "Who may call FabricAgent: dns:NAME, uri:URI, cn:NAME."),
    k("listen.tls", "partitions_clients", "array of strings", "[]", "SM host: who may call fabric.sm.v1.Partitions (the nodes' agents)."),
    k("listen.tls", "operator_clients", "array of strings", "[]", "SM host: identities that may read every node's memberships."),
    k("listen.tls", "node_name_template", "string", "none", "SM host: a node's certificate carries this DNS SAN with {node} replaced by its node id."),
    k("listen.tls", "node_identities", "table", "{}", "SM host: an explicit identity = node id table instead."),
    k("subnet_manager", "backend", "string", "\"embedded\"", "embedded (simulated, demos), opensm (SM host), remote (node of an OpenSM fabric), ufm (NVIDIA UFM)."),
    k("subnet_manager", "embedded", "table", "{}", "The embedded backend's settings."),
    k("subnet_manager", "opensm", "table", "none", "The opensm backend's settings (docs/OPENSM.md)."),
    k("subnet_manager", "remote", "table", "none", "The remote backend's settings: endpoint (one SM host) or endpoints (every SM host of the fabric; an apply is acknowledged only when every SM host the SM hosts name, less the ones all of them hold fenced, acknowledged it), TLS, timeouts (docs/OPENSM.md)."),
    k("subnet_manager", "ufm", "table", "none", "The ufm backend's settings (docs/UFM.md)."),
    k("subnet_manager", "opensm_ha", "table", "none", "With backend = \"opensm\": the fabric's other SM hosts; peers, peer_identities, ca/cert/key, sync_interval_ms, fencing (docs/OPENSM.md, \"Several SM hosts\")."),
    k("subnet_manager", "ufm_broker", "table", "none", "With backend = \"ufm\": `enabled = true` serves fabric.sm.v1 to the fabric's nodes, which then use the remote backend and hold no UFM credential (docs/UFM.md, \"The UFM broker\")."),
    k("subnet_manager.opensm_ha", "peers", "array of strings", "[]", "The other SM hosts' agents: https://host:port (mTLS with ca, cert, key), or http:// to a loopback address (test rigs). Empty: the fabric's only SM host, ready to take peers on SIGHUP. Re-read on SIGHUP with peer_host_names, peer_sm_port_guids, ca, cert, key, domain_name and request_timeout_ms; a peer is removed only once this host holds it fenced."),
    k("subnet_manager.opensm_ha", "peer_identities", "array of strings", "[]", "Who may pull this host's sets: the peers' certificate identities (dns:NAME, uri:URI, cn:NAME); required with https peers."),
    k("subnet_manager.opensm_ha", "ca", "path", "none", "PEM CA bundle the peers' certificates must chain to."),
    k("subnet_manager.opensm_ha", "cert", "path", "none", "PEM client certificate of this SM host towards its peers."),
    k("subnet_manager.opensm_ha", "key", "path", "none", "PEM private key of that certificate."),
    k("subnet_manager.opensm_ha", "domain_name", "string", "each endpoint's host", "Name to verify in the peers' certificates."),
    k("subnet_manager.opensm_ha", "sync_interval_ms", "integer", "5000", "Pull every peer's stored sets this often, milliseconds."),
    k("subnet_manager.opensm_ha", "catch_up_timeout_ms", "integer", "5000", "At start, how long the first pull may take before the agent reports ready, milliseconds."),
    k("subnet_manager.opensm_ha", "request_timeout_ms", "integer", "10000", "One pull's deadline, milliseconds."),
    k("subnet_manager.opensm_ha", "sminfo_umad_device", "path", "none", "umad device of the port this host's OpenSM is bound to: master/standby is read from the SM's own SMInfo there (a standby's write is confirmed only on an SMInfo read after it); none: from OpenSM's log lines, shown as a fallback."),
    k("subnet_manager.opensm_ha", "host_name", "string", "node_id", "The name this SM host states to the nodes and peers; over TLS it must be the name the nodes verify in its certificate (their domain_name, else the host of their endpoint URL), or they do not count its acknowledgements."),
    k("subnet_manager.opensm_ha", "peer_host_names", "array of strings", "[]", "The name each peer states, in the order of peers; empty: an https peer's verified name (domain_name, else the URL's host), a plaintext peer's stated one."),
    k("subnet_manager.opensm_ha", "peer_sm_port_guids", "array of strings", "[]", "The port GUID each peer's OpenSM is bound to, in the order of peers (needs sminfo_umad_device): a peer whose agent is silent for fence_after_ms is fenced when that port does not answer SMInfo or is not in the fabric; empty: never fenced."),
    k("subnet_manager.opensm_ha", "fence_after_ms", "integer", "3 x sync_interval_ms", "How long a peer's agent must not answer pulls before its SM is checked for fencing, milliseconds (100-3600000)."),
    k("observer", "kind", "string", "embedded with the embedded backend, else auto", "auto (verbs, then sysfs), embedded, smp, sysfs or verbs."),
    k("observer", "fast_poll_ms", "integer", "50", "Poll interval while a transition is pending, milliseconds."),
    k("observer", "slow_poll_ms", "integer", "5000", "Poll interval when idle, milliseconds (at least fast_poll_ms)."),
    k("observer", "sysfs_root", "path", "\"/sys/class/infiniband\"", "Where the sysfs observer reads."),
    k("observer", "umad_device", "path", "\"/dev/infiniband/umad0\"", "umad device of the smp observer."),
    k("observer", "smp_timeout_ms", "integer", "200", "SMP reply timeout, milliseconds."),
    k("observer", "smp_retries", "integer", "3", "SMP retries after a timeout."),
    k("observer", "sa_umad_device", "path", "none", "umad device of a port that stays in the fabric, through which the sysfs and verbs observers ask the subnet administrator whether a covered port missing from the read has left the fabric (README, \"Per port\"); none: such a port blocks RELEASED until it is back."),
    k("ports", "devices", "array of strings", "[]", "Device name patterns (* wildcard); with guids empty too, every InfiniBand port."),
    k("ports", "guids", "array of strings", "[]", "Port GUIDs."),
    k("events", "retain", "integer", "100000", "Keep at most this many newest events."),
    k("events", "released_retain_secs", "integer", "604800", "Keep RELEASED attachments listed this many seconds."),
    k("reconciler", "backoff_initial_ms", "integer", "200", "First retry delay after a failed apply, milliseconds."),
    k("reconciler", "backoff_max_ms", "integer", "30000", "Retry delay cap, milliseconds; also the retry pace after a refusal. A new request or a changed embedded fault file is tried at once."),
    k("reconciler", "resync_secs", "integer", "300", "Re-apply the desired set this often, seconds."),
    k("reconciler", "resync_jitter_pct", "integer", "10", "Resync jitter, percent (0-50)."),
    k("metrics", "enabled", "bool", "false", "Serve GET /metrics (OpenMetrics). listen or allow_remote without it is an error."),
    k("metrics", "listen", "address", "\"127.0.0.1:9464\"", "Where; a non-loopback address needs allow_remote."),
    k("metrics", "allow_remote", "bool", "false", "Allow a non-loopback listen address (the metrics name instances and partitions)."),
    k("log", "filter", "string", "\"info\"", "Log filter: a level (trace, debug, info, warn, error, off) and module=level directives, e.g. info,fabric_agent::agent=debug. Re-read on SIGHUP; FABRIC_AGENT_LOG overrides it."),
    k("limits", "max_watch_streams", "integer", "64", "Concurrent WatchEvents streams, all listeners."),
    k("limits", "max_in_flight_requests", "integer", "256", "Requests in progress per listener."),
    k("limits", "request_timeout_secs", "integer", "660", "A handler is cancelled after this; must exceed 600."),
    k("limits", "keepalive_interval_secs", "integer", "30", "HTTP/2 keepalive ping interval; 0 turns pings off."),
    k("limits", "keepalive_timeout_secs", "integer", "20", "How long a keepalive ping may go unanswered."),
    k("limits", "watch_max_age_secs", "integer", "0", "A WatchEvents stream ends (resumable) after this; 0 means no bound."),
    k("limits", "watch_batch", "integer", "64", "Events per replay batch of one stream (at most 4096)."),
    k("limits", "list_default_page_size", "integer", "500", "ListAttachments page size when none is given."),
    k("limits", "list_max_page_size", "integer", "5000", "Largest ListAttachments page size accepted."),
    k("limits", "max_connections", "integer", "1024", "TCP connections open at once."),
    k("limits", "max_unauthenticated_per_address", "integer", "16", "Per address: connections handshaking or without a client certificate."),
    k("limits", "max_connections_per_identity", "integer", "16 (at most max_connections - reserved_connections)", "TCP connections one client certificate identity may hold; more get RESOURCE_EXHAUSTED."),
    k("limits", "reserved_connections", "integer", "max_connections / 16 (64)", "Of max_connections, kept for operators, the control plane and peer SM hosts."),
    k("limits", "max_watch_streams_per_identity", "integer", "max_watch_streams / 8, at least 1 (8)", "Open-ended streams one client certificate identity may hold."),
    k("limits", "reserved_watch_streams", "integer", "max_watch_streams / 4 (16)", "Of max_watch_streams, kept for operators, the control plane, peer SM hosts and local callers."),
    k("limits", "unauthenticated_secs", "integer", "10", "A handshake must finish within this."),
    k("limits", "max_connection_age_secs", "integer", "3600", "GOAWAY after this, so rotated CAs and revoked certificates take effect."),
    k("limits", "request_body_secs", "integer", "10", "A unary request's body must arrive within this."),
    k("grants", "require", "bool", "false", "Attaches need the control plane's grant (node); keys need one per node (SM host)."),
    k("grants", "fabric", "string", "the top-level fabric", "The fabric grants must name."),
    k("grants", "keys", "array of tables", "[]", "The control plane's public keys, below."),
    k("grants", "max_age", "duration", "\"1h\"", "A grant is admitted for the first time only this long after its issue (1s..=7d); an admitted one keeps working."),
    k("grants", "max_clock_skew", "duration", "\"5m\"", "Clock disagreement tolerated between the control plane and this host (0..=1h)."),
    k("grants.keys", "id", "string", "required", "The key id grants name."),
    k("grants.keys", "public_key", "string", "none", "The Ed25519 public key, base64 (or public_key_file)."),
    k("grants.keys", "public_key_file", "path", "none", "A file holding the base64 public key."),
    k("grants.keys", "not_before", "RFC 3339 time", "none", "Grants issued before this are refused."),
    k("grants.keys", "not_after", "RFC 3339 time", "none", "Grants issued after this are refused (a retired key)."),
];

/// Which settings SIGHUP applies in place; every other change takes effect on restart.
pub const RELOADED_ON_SIGHUP: &[&str] = &[
    "log.filter",
    "listen.tls (the certificate, key and CA bundle files re-read; allowed_clients, partitions_clients, operator_clients, node_name_template and node_identities replaced)",
    "subnet_manager.remote (endpoint or endpoints, TLS files and settings, timeouts; after a change of endpoints nothing becomes ACTIVE or RELEASED until every SM host of the new set acknowledged the current set)",
    "subnet_manager.opensm_ha peers, peer_host_names, peer_sm_port_guids, ca, cert, key, domain_name and request_timeout_ms (a peer is removed only once this host holds it fenced)",
];

/// Escapes text for roff.
fn roff(text: &str) -> String {
    text.replace('\\', "\\\\").replace('-', "\\-")
}

/// The `fabric-agent.toml(5)` page, roff.
pub fn man_page() -> String {
    let mut out = String::from(
        ".TH fabric-agent.toml 5 \"\" \"fabric-agent\" \"File Formats\"\n\
         .SH NAME\nfabric\\-agent.toml \\- fabric\\-agent configuration file\n\
         .SH DESCRIPTION\nThe agent reads /etc/fabric\\-agent/config.toml (or \\-\\-config). \
         Unknown keys are errors; check a file with \\fBfabric\\-agent check\\-config\\fR (exit 64 \
         when invalid). SIGHUP re\\-reads ",
    );
    out.push_str(&roff(&RELOADED_ON_SIGHUP.join(" and ")));
    out.push_str("; every other setting takes effect on restart, and the log says which.\n");
    let mut section = None;
    for key in KEYS {
        if section != Some(key.section) {
            section = Some(key.section);
            let title = if key.section.is_empty() {
                "TOP LEVEL".to_owned()
            } else if key.section == "grants.keys" {
                "[[grants.keys]]".to_owned()
            } else {
                format!("[{}]", key.section)
            };
            out.push_str(&format!(".SH {}\n", roff(&title)));
        }
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR ({}; default {})\n{}\n",
            roff(key.key),
            roff(key.ty),
            roff(if key.default.is_empty() {
                "\u{2014}"
            } else {
                key.default
            }),
            roff(key.doc)
        ));
    }
    out.push_str(
        ".SH SEE ALSO\nfabric\\-agent(1), fabric\\-agent\\-check\\-config(1), \
         /usr/share/doc/fabric\\-agent/OPENSM.md, /usr/share/doc/fabric\\-agent/UFM.md\n",
    );
    out
}

/// The command that prints [`markdown_page`]; the checked-in docs/CONFIG-REFERENCE.md is its
/// output.
pub const MARKDOWN_COMMAND: &str =
    "cargo run --quiet -- man --config-reference > docs/CONFIG-REFERENCE.md";

/// A section's title on the Markdown page.
fn section_title(section: &str) -> String {
    match section {
        "" => "Top level".to_owned(),
        "grants.keys" => "[[grants.keys]]".to_owned(),
        other => format!("[{other}]"),
    }
}

/// Escapes text for a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// A default as the Markdown page shows it: a TOML value in code, a description (`required`,
/// `the host name`) as text, a dash for none.
fn default_cell(default: &str) -> String {
    let value = default.starts_with(['"', '[', '{'])
        || default == "true"
        || default == "false"
        || default.parse::<f64>().is_ok();
    if default.is_empty() {
        "\u{2014}".to_owned()
    } else if value {
        format!("`{}`", cell(default))
    } else {
        cell(default)
    }
}

/// docs/CONFIG-REFERENCE.md: the same table as [`man_page`], as Markdown.
pub fn markdown_page() -> String {
    let mut out = String::from(
        "> For operators: every configuration key with its type, default and meaning, \
         generated from the same table as the fabric-agent.toml(5) man page (do not edit).\n\n\
         # Configuration reference\n\n",
    );
    out.push_str(&format!(
        "The agent reads `/etc/fabric-agent/config.toml` (or `--config`). Unknown keys are \
         errors; check a file with `fabric-agent check-config` (exit 64 when invalid). SIGHUP \
         re-reads {}; every other setting takes effect on restart, and the log says which. The \
         file section by section, with an example: [CONFIGURATION.md](CONFIGURATION.md). The \
         backends' own sections (`[subnet_manager.opensm]`, `.remote`, `.ufm`, `.ufm_broker`, \
         `.embedded`) are described in [OPENSM.md](OPENSM.md), [UFM.md](UFM.md) and \
         CONFIGURATION.md.\n\n\
         This page is generated from `src/config/reference.rs`, whose keys a test holds to the \
         configuration structs. Regenerate it with `{MARKDOWN_COMMAND}`.\n",
        RELOADED_ON_SIGHUP.join(" and ")
    ));
    let mut section = None;
    for key in KEYS {
        if section != Some(key.section) {
            section = Some(key.section);
            out.push_str(&format!(
                "\n## {}\n\n| key | type | default | meaning |\n|---|---|---|---|\n",
                section_title(key.section)
            ));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            key.key,
            cell(key.ty),
            default_cell(key.default),
            cell(key.doc)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The fields serde accepts for `T`, from its own "unknown field" message.
    fn accepted<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> BTreeSet<String> {
        let e = toml::from_str::<T>("no_such_key_zz = 1\n")
            .unwrap_err()
            .to_string();
        let list = e.split("expected").nth(1).unwrap_or_else(|| panic!("{e}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    fn documented(section: &str) -> BTreeSet<String> {
        KEYS.iter()
            .filter(|k| k.section == section)
            .map(|k| k.key.to_owned())
            .collect()
    }

    #[test]
    fn the_reference_lists_exactly_the_keys_the_structs_accept() {
        use super::super::*;
        let sections = [
            ("", accepted::<ConfigFile>()),
            ("listen", accepted::<ListenSection>()),
            ("listen.tls", accepted::<TlsSection>()),
            ("subnet_manager", accepted::<SubnetManagerConfig>()),
            ("observer", accepted::<ObserverConfig>()),
            ("ports", accepted::<PortsConfig>()),
            ("events", accepted::<EventsConfig>()),
            ("reconciler", accepted::<ReconcilerConfig>()),
            ("metrics", accepted::<MetricsConfig>()),
            ("log", accepted::<LogConfig>()),
            ("limits", accepted::<LimitsConfig>()),
            ("grants", accepted::<GrantsConfig>()),
            ("grants.keys", accepted::<GrantKeyConfig>()),
            (
                "subnet_manager.opensm_ha",
                accepted::<crate::sm::opensm::peers::PeersConfig>(),
            ),
        ];
        for (section, fields) in &sections {
            assert!(!fields.is_empty(), "{section}");
            assert_eq!(&documented(section), fields, "section [{section}]");
        }
        let covered: BTreeSet<&str> = sections.iter().map(|(s, _)| *s).collect();
        for key in KEYS {
            assert!(covered.contains(key.section), "{key:?}");
        }
    }

    #[test]
    fn the_page_names_every_key() {
        let page = man_page();
        for key in KEYS {
            assert!(
                page.contains(&format!("\\fB{}\\fR", roff(key.key))),
                "{}",
                key.key
            );
        }
        assert!(page.starts_with(".TH fabric-agent.toml 5"));
    }

    #[test]
    fn the_markdown_page_names_every_key_in_its_section() {
        let page = markdown_page();
        let mut at = 0;
        for key in KEYS {
            let title = format!("\n## {}\n", section_title(key.section));
            let start = page.find(&title).unwrap_or_else(|| panic!("{title}"));
            let end = page[start + 1..]
                .find("\n## ")
                .map_or(page.len(), |i| i + start + 1);
            let row = format!("\n| `{}` |", key.key);
            let found = page[start..end].find(&row).map(|i| i + start);
            let found = found.unwrap_or_else(|| panic!("no row for {key:?} in its section"));
            assert!(found >= at, "{key:?} out of order");
            at = found;
        }
    }

    /// The checked-in docs/CONFIG-REFERENCE.md is exactly what the generator prints.
    #[test]
    fn the_checked_in_reference_page_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CONFIG-REFERENCE.md");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == markdown_page(),
            "{path} differs from the configuration table in src/config/reference.rs; \
             regenerate it: {MARKDOWN_COMMAND}"
        );
    }
}
