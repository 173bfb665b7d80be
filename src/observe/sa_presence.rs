//! Asking the subnet administrator whether ports are in the fabric ([`Presence`]) through a
//! configured umad device, for the observers that read ports without one (sysfs, verbs).

use super::presence::{unknown, Presence};
use super::smp::SmpObserver;
use super::ObserverConfig;
use crate::domain::Guid;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Mutex;

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
