//! Whether a port this node no longer reads is still in the fabric, by the subnet manager's
//! word. A covered port missing from the port read blocks RELEASED (it may still hold the key)
//! unless the subnet administrator, asked through one of this node's ports that is still in the
//! fabric, answers that it has no NodeRecord for the port's GUID: then the port is not in the
//! subnet, and should it come back the SM sweeps it in and programs its table from the current
//! partitions before it passes traffic (as for a DOWN port).
//!
//! The SA hides from a requester every port that shares no partition with it, so that answer
//! counts only when the asking port is a full member of the default partition (see
//! [`SmpObserver::presence`]). Any other outcome (no SA path, no master SM, an asking port that
//! is a limited member, a timeout, an error status) is [`Presence::Unknown`] and the port stays
//! blocking.

use super::smp::SmpObserver;
use super::ObserverConfig;
use crate::domain::Guid;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Mutex;

/// What the subnet manager says of one port GUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// The SA has a NodeRecord for it: the port is in the subnet.
    Shown,
    /// The SA answered "no records": the port is not in the subnet.
    Gone,
    /// The SA could not be asked or gave no usable answer (why).
    Unknown(String),
}

/// Every answer [`Presence::Unknown`] for `why`.
pub fn unknown(guids: &[Guid], why: &str) -> Vec<Presence> {
    guids
        .iter()
        .map(|_| Presence::Unknown(why.to_owned()))
        .collect()
}

/// Asks the SA through a configured umad device (`[observer] sa_umad_device`) for observers
/// that read ports without one (sysfs, verbs). The device is opened at the first question and
/// kept; a failed open is retried at the next.
#[derive(Debug, Clone)]
pub struct SaPresence {
    config: ObserverConfig,
    open: Arc<Mutex<Option<Arc<SmpObserver>>>>,
}

impl SaPresence {
    /// Asks through `device` with `config`'s SMP timing.
    pub fn new(device: PathBuf, config: &ObserverConfig) -> SaPresence {
        SaPresence {
            config: ObserverConfig {
                umad_device: device,
                ..config.clone()
            },
            open: Arc::new(Mutex::new(None)),
        }
    }

    /// The configured `sa_umad_device`'s asker, if any.
    pub fn configured(config: &ObserverConfig) -> Option<SaPresence> {
        config
            .sa_umad_device
            .clone()
            .map(|device| SaPresence::new(device, config))
    }

    /// What the SA says of each of `guids`.
    pub async fn ask(&self, guids: &[Guid]) -> Vec<Presence> {
        let observer = {
            let mut open = self.open.lock().await;
            match &*open {
                Some(o) => o.clone(),
                None => match SmpObserver::open(&self.config) {
                    Ok(o) => open.insert(Arc::new(o)).clone(),
                    Err(e) => {
                        let why = format!(
                            "{} cannot be opened to ask the subnet administrator: {e}",
                            self.config.umad_device.display()
                        );
                        return unknown(guids, &why);
                    }
                },
            }
        };
        observer.presence(guids).await
    }
}

/// The answer of an observer with no way to ask.
pub async fn ask_optional(asker: Option<&SaPresence>, kind: &str, guids: &[Guid]) -> Vec<Presence> {
    match asker {
        Some(a) => a.ask(guids).await,
        None => unknown(
            guids,
            &format!(
                "the {kind} observer has no device to ask the subnet administrator through \
                 (set [observer] sa_umad_device)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_device_that_cannot_open_is_unknown_never_gone() {
        let config = ObserverConfig {
            sa_umad_device: Some("/nonexistent/umad9".into()),
            ..Default::default()
        };
        let asker = SaPresence::configured(&config).expect("configured");
        let answers = asker.ask(&[Guid(1), Guid(2)]).await;
        assert_eq!(answers.len(), 2);
        for a in answers {
            assert!(
                matches!(&a, Presence::Unknown(why) if why.contains("/nonexistent/umad9")),
                "{a:?}"
            );
        }
        let none = ask_optional(None, "sysfs", &[Guid(3)]).await;
        assert!(matches!(&none[0], Presence::Unknown(w) if w.contains("sa_umad_device")));
    }
}
