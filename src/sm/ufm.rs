//! UFM backend: NVIDIA UFM REST. Placeholder until the backend lands.

use serde::Deserialize;

/// `[subnet_manager.ufm]` settings.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UfmConfig {}
