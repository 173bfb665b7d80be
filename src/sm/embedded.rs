//! Embedded backend: an in-process simulated subnet manager programming [`SimFabric`]'s tables.
//! The zero-dependency default for demos, laptops and soft-RoCE rigs (RoCE has no SM).
//!
//! Fault injection for tests and demos: when `fault_file` is set, every apply first reads it:
//! `unreachable` fails the apply as unavailable, `slow <ms>` delays it, `refuse <text>` refuses
//! it, `lose-reply` applies the set and then answers as unavailable (the reply was lost: the
//! agent must treat the keys as in doubt); an absent or empty file means healthy. While the
//! reconciler backs off after a failure, a change of the file is announced
//! ([`SubnetManager::cause_changed`]) and the current set is sent at once.
//!
//! Fencing, like the real backends: an apply with a generation lower than the highest one
//! accepted (or the same one with another set) is refused with [`SmError::StaleGeneration`].
//! With `apply_delay_ms`, an accepted set lands on the tables later, in generation order: a
//! delayed set never lands after a newer one did (it is dropped, as a real SM never programs a
//! replaced set). The highest generation is held in memory: a restarted agent's generations lie
//! above every one it sent before (its apply ledger reserves them).

use super::{ApplyOutcome, InjectedFault, SmError, SmFailure, SubnetManager};
use crate::domain::{Guid, Membership, NodeMemberships, PKeyValue};
use crate::embedded_fabric::SimFabric;
use async_trait::async_trait;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
    /// The fault file's text as the last apply read it (None: no apply read it yet).
    fault_seen: Mutex<Option<String>>,
    fence: Arc<Mutex<Fence>>,
}

/// How often [`SubnetManager::cause_changed`] re-reads the fault file while the reconciler
/// waits out a failure.
const FAULT_POLL: Duration = Duration::from_millis(200);

/// The generations seen: what the fencing compares against.
#[derive(Default)]
struct Fence {
    /// The highest generation accepted, and its keys.
    accepted: Option<(u64, NodeMemberships)>,
    /// The highest generation programmed onto the tables.
    landed: u64,
}

impl Fence {
    /// Accepts `set` at `generation`, or refuses an older generation (or the same one with
    /// another set).
    fn accept(&mut self, generation: u64, set: &NodeMemberships) -> Result<(), SmError> {
        if let Some((stored, held)) = &self.accepted {
            if generation < *stored || (generation == *stored && held != set) {
                return Err(SmError::StaleGeneration {
                    sent: generation,
                    stored: *stored,
                });
            }
        }
        self.accepted = Some((generation, set.clone()));
        Ok(())
    }

    /// Programs each port's keys unless a newer generation already landed.
    fn land(
        &mut self,
        fabric: &SimFabric,
        generation: u64,
        keys_of: &impl Fn(Guid) -> Vec<PKeyValue>,
    ) -> Result<bool, crate::embedded_fabric::SimError> {
        if generation < self.landed {
            return Ok(false);
        }
        fabric.program_ports(keys_of)?;
        self.landed = generation;
        Ok(true)
    }
}

impl EmbeddedSm {
    /// Wraps a simulated fabric.
    pub fn new(fabric: Arc<SimFabric>, config: &EmbeddedConfig) -> EmbeddedSm {
        EmbeddedSm {
            fabric,
            apply_delay: Duration::from_millis(config.apply_delay_ms),
            fault_file: config.fault_file.clone(),
            fault_seen: Mutex::new(None),
            fence: Arc::default(),
        }
    }

    /// Applies the injected fault before the apply; returns whether the reply is to be lost.
    async fn injected_fault(&self) -> Result<bool, SmError> {
        let Some(path) = &self.fault_file else {
            return Ok(false);
        };
        let text = read_fault(path).await;
        *self.fault_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(text.clone());
        let line = text.as_str();
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

    async fn cause_changed(&self) {
        let Some(path) = &self.fault_file else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(FAULT_POLL).await;
            let seen = self
                .fault_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(seen) = seen {
                if seen != read_fault(path).await {
                    return;
                }
            }
        }
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let lose_reply = self.injected_fault().await?;
        // Each port gets the keys the set gives its GUID.
        let set = desired.clone();
        let keys_of = move |g: Guid| -> Vec<PKeyValue> {
            set.keys
                .iter()
                .filter(|(k, _)| set.gives(**k, g))
                .map(|(k, s)| k.value(s.membership))
                .collect()
        };
        let detail = format!(
            "{} keys programmed on the simulated ports",
            keys_of_count(&keys_of, &self.fabric)
        );
        {
            let mut fence = self.fence.lock().unwrap_or_else(|p| p.into_inner());
            fence.accept(generation, desired)?;
            if self.apply_delay.is_zero() {
                fence
                    .land(&self.fabric, generation, &keys_of)
                    .map_err(|e| SmError::Refused(SmFailure::Sim(Arc::new(e))))?;
            }
        }
        if !self.apply_delay.is_zero() {
            // Like a real SM: accept now, program the ports a little later, never over a
            // newer set.
            let fabric = self.fabric.clone();
            let fence = self.fence.clone();
            let delay = self.apply_delay;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut fence = fence.lock().unwrap_or_else(|p| p.into_inner());
                match fence.land(&fabric, generation, &keys_of) {
                    Ok(true) => {}
                    Ok(false) => tracing::debug!(
                        generation,
                        "embedded SM: a newer set landed first; dropped"
                    ),
                    Err(e) => tracing::warn!(error = %e, "embedded SM: programming tables failed"),
                }
            });
        }
        if lose_reply {
            return Err(SmError::Unreachable(injected(InjectedFault::LostReply)));
        }
        Ok(ApplyOutcome {
            detail,
            acknowledged_by: Vec::new(),
        })
    }
}

/// Distinct keys the simulated ports get.
fn keys_of_count(keys_of: &impl Fn(Guid) -> Vec<PKeyValue>, fabric: &SimFabric) -> usize {
    let all: std::collections::BTreeSet<PKeyValue> =
        fabric.port_guids().into_iter().flat_map(keys_of).collect();
    all.len()
}

/// The fault file's first meaningful text, trimmed; empty when absent or unreadable (healthy).
async fn read_fault(path: &std::path::Path) -> String {
    tokio::fs::read_to_string(path)
        .await
        .map(|t| t.trim().to_owned())
        .unwrap_or_default()
}

fn injected(fault: InjectedFault) -> SmFailure {
    SmFailure::Injected {
        backend: "embedded SM",
        fault,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{KeySetting, NodeId, PKey};
    use crate::embedded_fabric::{PersistError, SimPersistence};
    use std::collections::BTreeMap;

    struct Nowhere;
    impl SimPersistence for Nowhere {
        fn load(&self) -> Option<Vec<Vec<u16>>> {
            None
        }
        fn save(&self, _: &[Vec<u16>]) -> Result<(), PersistError> {
            Ok(())
        }
    }

    fn set(fabric: &SimFabric, keys: &[u16]) -> NodeMemberships {
        NodeMemberships {
            node_id: NodeId::parse("node1").unwrap(),
            port_guids: fabric.port_guids(),
            keys: keys
                .iter()
                .map(|k| {
                    let setting = KeySetting {
                        membership: Membership::Full,
                        name: String::new(),
                        ports: None,
                    };
                    (PKey::new(u32::from(*k)).unwrap(), setting)
                })
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn holds(fabric: &SimFabric, key: u16) -> bool {
        fabric
            .inventory()
            .ports
            .iter()
            .all(|p| p.pkeys.iter().any(|v| v.0 & 0x7fff == key))
    }

    fn sm(delay_ms: u64) -> (Arc<SimFabric>, EmbeddedSm) {
        let fabric = Arc::new(SimFabric::new(
            "node1",
            2,
            8,
            PKeyValue::DEFAULT_LIMITED,
            Box::new(Nowhere),
        ));
        let config = EmbeddedConfig {
            apply_delay_ms: delay_ms,
            ..EmbeddedConfig::default()
        };
        (fabric.clone(), EmbeddedSm::new(fabric, &config))
    }

    #[tokio::test]
    async fn an_older_generation_is_refused_like_the_real_backends() {
        let (fabric, sm) = sm(0);
        sm.apply(&set(&fabric, &[0x12]), 5).await.unwrap();
        assert!(holds(&fabric, 0x12));
        // A retry of the same set at the same generation is fine; another set is not.
        sm.apply(&set(&fabric, &[0x12]), 5).await.unwrap();
        for (keys, generation) in [(&[][..], 4), (&[0x13][..], 5)] {
            match sm.apply(&set(&fabric, keys), generation).await {
                Err(SmError::StaleGeneration { sent, stored }) => {
                    assert_eq!((sent, stored), (generation, 5));
                }
                other => panic!("generation {generation} must be refused: {other:?}"),
            }
        }
        assert!(holds(&fabric, 0x12), "a refused set changes nothing");
        sm.apply(&set(&fabric, &[]), 6).await.unwrap();
        assert!(!holds(&fabric, 0x12));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_stale_apply_never_lands_after_a_newer_one() {
        let (fabric, sm) = sm(100);
        // K at generation 7, then its release at 8: both accepted now, landing later.
        sm.apply(&set(&fabric, &[0x12]), 7).await.unwrap();
        sm.apply(&set(&fabric, &[]), 8).await.unwrap();
        assert!(!holds(&fabric, 0x12), "nothing landed yet");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            !holds(&fabric, 0x12),
            "the newest set is what the tables hold"
        );
        assert_eq!(sm.fence.lock().unwrap().landed, 8);
        // However the timers fire, generation 7 arriving after 8 landed programs nothing.
        let landed = sm
            .fence
            .lock()
            .unwrap()
            .land(&fabric, 7, &|_| vec![PKeyValue(0x8012)])
            .unwrap();
        assert!(!landed);
        assert!(
            !holds(&fabric, 0x12),
            "a stale set never lands after a newer one"
        );
        // And a stale apply is refused before it is ever scheduled.
        assert!(matches!(
            sm.apply(&set(&fabric, &[0x12]), 7).await,
            Err(SmError::StaleGeneration { sent: 7, stored: 8 })
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!holds(&fabric, 0x12));
    }

    #[tokio::test]
    async fn a_changed_fault_file_is_announced_and_an_unchanged_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let fault = dir.path().join("fault");
        std::fs::write(&fault, "refuse not today\n").unwrap();
        let fabric = Arc::new(SimFabric::new(
            "node1",
            2,
            8,
            PKeyValue::DEFAULT_LIMITED,
            Box::new(Nowhere),
        ));
        let config = EmbeddedConfig {
            fault_file: Some(fault.clone()),
            ..EmbeddedConfig::default()
        };
        let sm = EmbeddedSm::new(fabric.clone(), &config);
        let refused = sm.apply(&set(&fabric, &[0x12]), 1).await;
        assert!(matches!(refused, Err(SmError::Refused(_))), "{refused:?}");
        // The same fault (whitespace aside): nothing to announce.
        std::fs::write(&fault, "refuse not today").unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(600), sm.cause_changed()).await;
        assert!(quiet.is_err(), "an unchanged fault is no news");
        // Cleared: announced within a poll or two.
        std::fs::write(&fault, "").unwrap();
        tokio::time::timeout(Duration::from_secs(2), sm.cause_changed())
            .await
            .expect("a cleared fault is announced");
        sm.apply(&set(&fabric, &[0x12]), 2).await.unwrap();
    }
}
