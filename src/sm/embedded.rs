//! Embedded backend: an in-process simulated subnet manager programming [`SimFabric`]'s tables.
//! The zero-dependency default for demos, laptops and soft-RoCE rigs (RoCE has no SM).
//!
//! Fault injection for tests and demos: when `fault_file` is set, every apply first reads it:
//! `unreachable` fails the apply as unavailable, `slow <ms>` delays it, `refuse <text>` refuses
//! it, `lose-reply` applies the set and then answers as unavailable (the reply was lost: the
//! agent must treat the keys as in doubt); an absent or empty file means healthy.

use super::{ApplyOutcome, InjectedFault, SmError, SmFailure, SubnetManager};
use crate::domain::{Guid, Membership, NodeMemberships, PKeyValue};
use crate::sim::SimFabric;
use async_trait::async_trait;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `[subnet_manager.embedded]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedConfig {
    /// Simulated InfiniBand ports (1-16).
    #[serde(default = "default_ports")]
    pub ports: u8,
    /// P_Key table size per port, default partition included (2-512).
    #[serde(default = "default_table_size")]
    pub pkey_table_size: usize,
    /// Time between an accepted apply and the tables changing, milliseconds.
    #[serde(default)]
    pub apply_delay_ms: u64,
    /// Optional fault-injection file (see the module docs).
    #[serde(default)]
    pub fault_file: Option<PathBuf>,
    /// The simulated ports' membership of the default partition: `limited` (0x7FFF, a
    /// well-run fabric; the default) or `full` (0xFFFF, an insecure posture to demonstrate).
    #[serde(default = "default_default_membership")]
    pub default_membership: Membership,
}

fn default_default_membership() -> Membership {
    Membership::Limited
}

fn default_ports() -> u8 {
    2
}
fn default_table_size() -> usize {
    64
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            ports: default_ports(),
            pkey_table_size: default_table_size(),
            apply_delay_ms: 0,
            fault_file: None,
            default_membership: default_default_membership(),
        }
    }
}

impl EmbeddedConfig {
    /// The default partition's entry on the simulated ports.
    pub fn default_entry(&self) -> PKeyValue {
        match self.default_membership {
            Membership::Full => PKeyValue::DEFAULT_FULL,
            Membership::Limited => PKeyValue::DEFAULT_LIMITED,
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), EmbeddedConfigError> {
        if !(1..=16).contains(&self.ports) {
            return Err(EmbeddedConfigError::Ports);
        }
        if !(2..=512).contains(&self.pkey_table_size) {
            return Err(EmbeddedConfigError::TableSize);
        }
        Ok(())
    }
}

/// Why `[subnet_manager.embedded]` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddedConfigError {
    /// `ports` out of range.
    #[error("ports must be 1-16")]
    Ports,
    /// `pkey_table_size` out of range.
    #[error("pkey_table_size must be 2-512")]
    TableSize,
}

/// The embedded subnet manager.
pub struct EmbeddedSm {
    fabric: Arc<SimFabric>,
    apply_delay: Duration,
    fault_file: Option<PathBuf>,
}

impl EmbeddedSm {
    /// Wraps a simulated fabric.
    pub fn new(fabric: Arc<SimFabric>, config: &EmbeddedConfig) -> EmbeddedSm {
        EmbeddedSm {
            fabric,
            apply_delay: Duration::from_millis(config.apply_delay_ms),
            fault_file: config.fault_file.clone(),
        }
    }

    /// Applies the injected fault before the apply; returns whether the reply is to be lost.
    async fn injected_fault(&self) -> Result<bool, SmError> {
        let Some(path) = &self.fault_file else {
            return Ok(false);
        };
        let text = tokio::fs::read_to_string(path).await.unwrap_or_default();
        let line = text.trim();
        if line == "unreachable" {
            return Err(SmError::Unreachable(injected(InjectedFault::Outage)));
        }
        if let Some(ms) = line.strip_prefix("slow ") {
            let ms = ms.trim().parse::<u64>().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(why) = line.strip_prefix("refuse ") {
            return Err(SmError::Refused(injected(InjectedFault::Refusal(
                why.to_owned(),
            ))));
        }
        Ok(line == "lose-reply")
    }
}

#[async_trait]
impl SubnetManager for EmbeddedSm {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        _generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let lose_reply = self.injected_fault().await?;
        // Each port gets the keys the set gives its GUID.
        let desired = desired.clone();
        let keys_of = move |g: Guid| -> Vec<PKeyValue> {
            desired
                .keys
                .iter()
                .filter(|(k, _)| desired.gives(**k, g))
                .map(|(k, s)| k.value(s.membership))
                .collect()
        };
        let detail = format!(
            "{} keys programmed on the simulated ports",
            keys_of_count(&keys_of, &self.fabric)
        );
        if self.apply_delay.is_zero() {
            self.fabric
                .program_ports(&keys_of)
                .map_err(|e| SmError::Refused(SmFailure::Sim(Arc::new(e))))?;
        } else {
            // Like a real SM: accept now, program the ports a little later.
            let fabric = self.fabric.clone();
            let delay = self.apply_delay;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Err(e) = fabric.program_ports(&keys_of) {
                    tracing::warn!(error = %e, "embedded SM: programming tables failed");
                }
            });
        }
        if lose_reply {
            return Err(SmError::Unreachable(injected(InjectedFault::LostReply)));
        }
        Ok(ApplyOutcome { detail })
    }
}

/// Distinct keys the simulated ports get.
fn keys_of_count(keys_of: &impl Fn(Guid) -> Vec<PKeyValue>, fabric: &SimFabric) -> usize {
    let all: std::collections::BTreeSet<PKeyValue> =
        fabric.port_guids().into_iter().flat_map(keys_of).collect();
    all.len()
}

fn injected(fault: InjectedFault) -> SmFailure {
    SmFailure::Injected {
        backend: "embedded SM",
        fault,
    }
}
