//! `[ports]`: which of this host's ports belong to the fabric.

use super::error::{invalid, ConfigError};
use crate::domain::{Guid, PortSelector};
use serde::Deserialize;

/// Port selection.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PortsConfig {
    /// Device name patterns (`*` wildcard). Empty with empty `guids`: every InfiniBand port.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Port GUIDs.
    #[serde(default)]
    pub guids: Vec<String>,
}

impl PortsConfig {
    /// The port selection as a domain value.
    pub(super) fn selector(&self) -> Result<PortSelector, ConfigError> {
        let guids = self
            .guids
            .iter()
            .map(|g| g.parse::<Guid>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("ports.guids", e.to_string()))?;
        Ok(PortSelector {
            devices: self.devices.clone(),
            guids,
        })
    }
}
