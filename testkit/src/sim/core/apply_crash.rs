//! A crash armed for the next apply (`World::apply_crash`; `crash::Crashable` lands it).

use std::sync::Arc;
use tokio::sync::Notify;

/// A crash armed for the next apply: at its `n`-th poll, then `Notify` tells the driver.
pub type ApplyCrash = (u32, Arc<Notify>);
