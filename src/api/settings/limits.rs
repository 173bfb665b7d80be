//! `[limits]`: the gRPC listeners' resource bounds.

use serde::Deserialize;
use std::time::Duration;

/// `[limits]`: what one agent serves at most, so no client can exhaust its memory or tasks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Concurrent WatchEvents streams, over all listeners (default 64); more are refused
    /// with RESOURCE_EXHAUSTED. Every event is sent to every open stream, so each stream adds
    /// to the cost of every state change (docs/PERFORMANCE.md, "WatchEvents stream flood"): a
    /// control plane needs a few per node.
    #[serde(default = "default_max_watch_streams")]
    pub max_watch_streams: usize,
    /// Requests in progress per listener (the unix socket, TCP), not counting open
    /// WatchEvents streams once started (default 256); more are refused with
    /// RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight_requests: usize,
    /// A request's handler is cancelled (DEADLINE_EXCEEDED) after this many seconds (default
    /// 660). Must exceed 600, the longest `wait_ms` a call may ask for. A client's shorter
    /// grpc-timeout wins.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_secs: u64,
    /// HTTP/2 keepalive: ping an idle connection every this many seconds (default 30); a peer
    /// that does not answer within `keepalive_timeout_secs` is disconnected, ending its
    /// streams and freeing their slots. 0 turns pings off.
    #[serde(default = "default_keepalive_interval")]
    pub keepalive_interval_secs: u64,
    /// How long a keepalive ping may go unanswered (default 20).
    #[serde(default = "default_keepalive_timeout")]
    pub keepalive_timeout_secs: u64,
    /// A WatchEvents stream ends with UNAVAILABLE (carrying its resume cursor) after this many
    /// seconds; the client reconnects with its last seq. 0 (default) means no bound.
    #[serde(default)]
    pub watch_max_age_secs: u64,
    /// Events read from the log per replay batch of one stream (default 64, at most 4096).
    #[serde(default = "default_watch_batch")]
    pub watch_batch: usize,
    /// ListAttachments page size when the request gives none (default 500).
    #[serde(default = "default_list_page_size")]
    pub list_default_page_size: u32,
    /// The largest ListAttachments page_size accepted (default 5000).
    #[serde(default = "default_list_max_page_size")]
    pub list_max_page_size: u32,
    /// TCP connections open at once (default 1024); more are closed as soon as they are
    /// accepted. The unit's `LimitNOFILE` leaves room above this.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// TCP connections from one address that are still in their TLS handshake or completed it
    /// without a client certificate (default 16); more from that address are closed at once,
    /// so a flood from one host cannot take the slots other hosts need.
    #[serde(default = "default_max_unauthenticated_per_address")]
    pub max_unauthenticated_per_address: usize,
    /// A TLS handshake must finish, and a connection without a client certificate is closed,
    /// within this many seconds (default 10): long enough to be told UNAUTHENTICATED and why.
    #[serde(default = "default_unauthenticated_secs")]
    pub unauthenticated_secs: u64,
    /// A TCP connection is asked to go away (HTTP/2 GOAWAY) after this many seconds (default
    /// 3600), so a rotated CA or a revoked client certificate stops working on live
    /// connections too: the client reconnects and handshakes with the current material. Calls
    /// in progress get `request_timeout_secs` more to finish; then the connection is closed,
    /// ending any stream still open (a WatchEvents client resumes from its last seq). At least 1.
    #[serde(default = "default_max_connection_age")]
    pub max_connection_age_secs: u64,
    /// TCP connections one client certificate identity may hold at once (default: 16, or
    /// `max_connections - reserved_connections` if less); a connection beyond it is served
    /// only to refuse every call with RESOURCE_EXHAUSTED naming this key, and is closed after
    /// `unauthenticated_secs`. 1..=`max_connections`.
    #[serde(default)]
    pub max_connections_per_identity: Option<usize>,
    /// Of `max_connections`, how many only operators (`listen.tls.operator_clients`), the
    /// control plane (`listen.tls.allowed_clients`) and peer SM hosts
    /// (`opensm_ha.peer_identities`) may use (default: a sixteenth, 64 of 1024): the nodes and
    /// any other identity hold at most `max_connections - reserved_connections` together. Less
    /// than `max_connections`.
    #[serde(default)]
    pub reserved_connections: Option<usize>,
    /// Open-ended streams (WatchEvents, Health.Watch, reflection) one client certificate
    /// identity may hold at once (default: an eighth of `max_watch_streams`, at least 1: 8 of
    /// 64); more are refused with RESOURCE_EXHAUSTED naming this key. Local callers count
    /// against `max_watch_streams` only. 1..=`max_watch_streams`.
    #[serde(default)]
    pub max_watch_streams_per_identity: Option<usize>,
    /// Of `max_watch_streams`, how many only operators, the control plane, peer SM hosts and
    /// local callers may use (default: a quarter, 16 of 64). Less than `max_watch_streams`.
    #[serde(default)]
    pub reserved_watch_streams: Option<usize>,
    /// A unary request's body must arrive within this many seconds (default 10); it is read
    /// before the request takes an in-flight slot, so a body that trickles in holds none.
    #[serde(default = "default_request_body_secs")]
    pub request_body_secs: u64,
}

fn default_max_watch_streams() -> usize {
    64
}
fn default_max_in_flight() -> usize {
    256
}
fn default_request_timeout() -> u64 {
    660
}
fn default_keepalive_interval() -> u64 {
    30
}
fn default_keepalive_timeout() -> u64 {
    20
}
fn default_watch_batch() -> usize {
    64
}
fn default_list_page_size() -> u32 {
    500
}
fn default_list_max_page_size() -> u32 {
    5000
}
fn default_max_connections() -> usize {
    1024
}
fn default_max_unauthenticated_per_address() -> usize {
    16
}
fn default_unauthenticated_secs() -> u64 {
    10
}
fn default_max_connection_age() -> u64 {
    3600
}
fn default_request_body_secs() -> u64 {
    10
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_watch_streams: default_max_watch_streams(),
            max_in_flight_requests: default_max_in_flight(),
            request_timeout_secs: default_request_timeout(),
            keepalive_interval_secs: default_keepalive_interval(),
            keepalive_timeout_secs: default_keepalive_timeout(),
            watch_max_age_secs: 0,
            watch_batch: default_watch_batch(),
            list_default_page_size: default_list_page_size(),
            list_max_page_size: default_list_max_page_size(),
            max_connections: default_max_connections(),
            max_unauthenticated_per_address: default_max_unauthenticated_per_address(),
            max_connections_per_identity: None,
            reserved_connections: None,
            max_watch_streams_per_identity: None,
            reserved_watch_streams: None,
            unauthenticated_secs: default_unauthenticated_secs(),
            max_connection_age_secs: default_max_connection_age(),
            request_body_secs: default_request_body_secs(),
        }
    }
}

impl LimitsConfig {
    /// `reserved_connections` in effect.
    pub fn reserved_connections(&self) -> usize {
        self.reserved_connections
            .unwrap_or(self.max_connections / 16)
    }

    /// `max_connections_per_identity` in effect.
    pub fn max_connections_per_identity(&self) -> usize {
        self.max_connections_per_identity.unwrap_or_else(|| {
            16.min(
                self.max_connections
                    .saturating_sub(self.reserved_connections()),
            )
            .max(1)
        })
    }

    /// `reserved_watch_streams` in effect.
    pub fn reserved_watch_streams(&self) -> usize {
        self.reserved_watch_streams
            .unwrap_or(self.max_watch_streams / 4)
    }

    /// `max_watch_streams_per_identity` in effect.
    pub fn max_watch_streams_per_identity(&self) -> usize {
        self.max_watch_streams_per_identity
            .unwrap_or((self.max_watch_streams / 8).max(1))
    }

    /// Every bound is usable: non-zero, and the request timeout outlasts the longest wait.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.max_watch_streams == 0 {
            return Err(invalid("limits.max_watch_streams", "must be at least 1"));
        }
        if self.max_in_flight_requests == 0 {
            return Err(invalid(
                "limits.max_in_flight_requests",
                "must be at least 1",
            ));
        }
        if Duration::from_secs(self.request_timeout_secs) <= crate::agent::MAX_WAIT {
            return Err(invalid(
                "limits.request_timeout_secs",
                format!(
                    "must exceed {} (the longest wait_ms a call may ask for)",
                    crate::agent::MAX_WAIT.as_secs()
                ),
            ));
        }
        if self.keepalive_interval_secs > 0 && self.keepalive_timeout_secs == 0 {
            return Err(invalid(
                "limits.keepalive_timeout_secs",
                "must be at least 1 when keepalive_interval_secs is set",
            ));
        }
        if !(1..=crate::agent::MAX_WATCH_BATCH).contains(&self.watch_batch) {
            return Err(invalid(
                "limits.watch_batch",
                format!("must be 1..={}", crate::agent::MAX_WATCH_BATCH),
            ));
        }
        if self.list_max_page_size == 0
            || !(1..=self.list_max_page_size).contains(&self.list_default_page_size)
        {
            return Err(invalid(
                "limits.list_default_page_size",
                "page sizes must be > 0 and list_default_page_size <= list_max_page_size",
            ));
        }
        if self.max_connections == 0 || self.max_unauthenticated_per_address == 0 {
            return Err(invalid(
                "limits.max_connections",
                "max_connections and max_unauthenticated_per_address must be at least 1",
            ));
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_identity()) {
            return Err(invalid(
                "limits.max_connections_per_identity",
                format!("must be 1..={} (max_connections)", self.max_connections),
            ));
        }
        if self.reserved_connections() >= self.max_connections {
            return Err(invalid(
                "limits.reserved_connections",
                format!(
                    "must be less than max_connections ({}): the nodes need some",
                    self.max_connections
                ),
            ));
        }
        if !(1..=self.max_watch_streams).contains(&self.max_watch_streams_per_identity()) {
            return Err(invalid(
                "limits.max_watch_streams_per_identity",
                format!("must be 1..={} (max_watch_streams)", self.max_watch_streams),
            ));
        }
        if self.reserved_watch_streams() >= self.max_watch_streams {
            return Err(invalid(
                "limits.reserved_watch_streams",
                format!(
                    "must be less than max_watch_streams ({}): the nodes need some",
                    self.max_watch_streams
                ),
            ));
        }
        if !(1..=300).contains(&self.unauthenticated_secs)
            || !(1..=300).contains(&self.request_body_secs)
        {
            return Err(invalid(
                "limits.unauthenticated_secs",
                "unauthenticated_secs and request_body_secs must be 1-300",
            ));
        }
        if self.max_connection_age_secs == 0 {
            return Err(invalid(
                "limits.max_connection_age_secs",
                "must be at least 1 (an hour or so in production)",
            ));
        }
        Ok(())
    }
}

/// A `[limits]` value that makes no sense, under its dotted key.
#[derive(Debug, thiserror::Error)]
#[error("invalid {key}: {reason}")]
pub struct LimitsError {
    /// The dotted key.
    pub key: &'static str,
    /// Why.
    pub reason: String,
}

fn invalid(key: &'static str, reason: impl Into<String>) -> LimitsError {
    LimitsError {
        key,
        reason: reason.into(),
    }
}
