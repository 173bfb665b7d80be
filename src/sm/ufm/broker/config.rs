//! `[subnet_manager.ufm_broker]`: whether a `ufm` backend host serves `fabric.sm.v1` to the
//! fabric's nodes (the UFM broker). Needs `backend = "ufm"` and a TCP listener with mTLS.

use serde::Deserialize;

/// `[subnet_manager.ufm_broker]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Serve `fabric.sm.v1.Partitions` to the nodes, each node's set going to UFM through this
    /// host's credential. Default false.
    #[serde(default)]
    pub enabled: bool,
}
