//! Remote backend: reaches the SM host's agent (`fabric.sm.v1.Partitions`).
//! Placeholder until the backend lands.

use serde::Deserialize;

/// `[subnet_manager.remote]` settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {}
