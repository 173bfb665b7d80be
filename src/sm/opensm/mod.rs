//! OpenSM backend (SM host): owns a marked region of OpenSM's partitions file.
//! Placeholder until the backend lands; see issue "OpenSM backend".

use serde::Deserialize;

/// `[subnet_manager.opensm]` settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OpenSmConfig {}
