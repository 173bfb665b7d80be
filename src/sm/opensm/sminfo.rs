//! The SM host's OpenSM role from the SM's own SMInfo.
//!
//! With `[subnet_manager.opensm_ha] sminfo_umad_device` set, the agent asks the SM bound to its
//! own port what it is: `SubnGet(SMInfo)` (attribute 0x0020) by directed route with 0 hops over
//! that umad device, and reads the SMState field (master, standby, discovering, not active).
//! The Get is answered by the SM software on the port, not by the HCA: no answer means no SM
//! runs there (or the device failed), never "standby".
//!
//! Two uses:
//! - **the standby write confirmation** ([`super::standby::StandbyAware`]) reads SMInfo afresh
//!   after every write: only an answer of STANDBY to a read started after the file was in place
//!   confirms it as a standby's; a failed read confirms nothing (the sweep fence then decides);
//! - **status** (`GetNode`'s `sm_host.role`, `fabric_agent_sm_host_role`) shows the last read,
//!   refreshed every [`POLL`] and by every confirmation.
//!
//! Without the setting, or while the SMInfo read fails, status shows the state OpenSM's log last
//! announced (`Entering ... state`), labelled as that fallback with its reason; the write
//! confirmation uses the log only when no device is configured.
//!
//! Reads run one at a time (a session registers agents on the device, and under umad2sim two
//! live sessions of one process steal each other's answers), each on a blocking thread.

use super::opensm_state::{LogStateReader, OpenSmState};
use super::sa_client::{SaError, SaSession, SaTiming};
use crate::mad::sm_info::sm_state;
use crate::mad::SmInfoRepr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How often status refreshes the SMInfo read.
pub const POLL: Duration = Duration::from_secs(1);

/// One read's timing: 500 ms per answer, two further attempts, 2 s in all.
const TIMING: SaTiming = SaTiming {
    timeout: Duration::from_millis(500),
    retries: 2,
    deadline: Duration::from_secs(2),
};

/// The state an SMInfo answer carries.
pub fn state_of(info: &SmInfoRepr) -> OpenSmState {
    match info.sm_state {
        sm_state::MASTER => OpenSmState::Master,
        sm_state::STANDBY => OpenSmState::Standby,
        sm_state::DISCOVERING => OpenSmState::Discovering,
        _ => OpenSmState::NotActive,
    }
}

/// Where the role shown came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleSource {
    /// The SM's SMInfo on the local port, read at `at`.
    SmInfo {
        /// When the read was answered.
        at: SystemTime,
        /// The SM's port GUID.
        guid: u64,
        /// Its priority.
        priority: u8,
    },
    /// OpenSM's log lines: no SMInfo device is configured, or the last SMInfo read failed
    /// (`reason`).
    LogFallback {
        /// Why SMInfo was not used.
        reason: String,
    },
}

impl RoleSource {
    /// `sminfo` or `opensm-log`, for status and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            RoleSource::SmInfo { .. } => "sminfo",
            RoleSource::LogFallback { .. } => "opensm-log",
        }
    }
}

/// The role as status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// The state.
    pub state: OpenSmState,
    /// Where it came from.
    pub source: RoleSource,
}

/// Reads SMInfo of the local port over a umad device, one read at a time.
#[derive(Debug)]
pub struct SmInfoReader {
    device: PathBuf,
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl SmInfoReader {
    /// Reads over `device`.
    pub fn new(device: PathBuf) -> SmInfoReader {
        SmInfoReader {
            device,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    /// The device.
    pub fn device(&self) -> &std::path::Path {
        &self.device
    }

    /// One SMInfo read, started now (after any read still running).
    pub async fn read(&self) -> Result<SmInfoRepr, String> {
        let _turn = self.one_at_a_time.lock().await;
        let device = self.device.clone();
        tokio::task::spawn_blocking(move || -> Result<SmInfoRepr, SaError> {
            SaSession::open(&device, TIMING)?.sm_info()
        })
        .await
        .map_err(|e| format!("SMInfo read thread: {e}"))?
        .map_err(|e| format!("SMInfo on {}: {e}", self.device.display()))
    }
}

/// This host's OpenSM role: SMInfo when configured, OpenSM's log as the labelled fallback.
pub struct SmRole {
    log: Arc<LogStateReader>,
    sminfo: Option<SmInfoReader>,
    last: Mutex<Option<Result<(SmInfoRepr, SystemTime), String>>>,
}

impl SmRole {
    /// The role from `log` only (no SMInfo device configured).
    pub fn from_log(log: Arc<LogStateReader>) -> SmRole {
        SmRole {
            log,
            sminfo: None,
            last: Mutex::new(None),
        }
    }

    /// The role from SMInfo over `device`, `log` as the fallback.
    pub fn with_sminfo(log: Arc<LogStateReader>, device: PathBuf) -> SmRole {
        SmRole {
            log,
            sminfo: Some(SmInfoReader::new(device)),
            last: Mutex::new(None),
        }
    }

    /// Whether SMInfo is configured.
    pub fn reads_sminfo(&self) -> bool {
        self.sminfo.is_some()
    }

    /// A fresh SMInfo read (kept for status); `None` when no device is configured.
    pub async fn read_sminfo(&self) -> Option<Result<SmInfoRepr, String>> {
        let reader = self.sminfo.as_ref()?;
        let read = reader.read().await;
        let kept = read.clone().map(|i| (i, SystemTime::now()));
        if let Err(e) = &kept {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if !matches!(&*last, Some(Err(was)) if was == e) {
                tracing::warn!(error = %e, "cannot read this host's SM role over SMInfo; status shows OpenSM's log as a fallback");
            }
            *last = Some(kept);
        } else {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
        }
        Some(read)
    }

    /// The state OpenSM's log last announced.
    pub fn log_state(&self) -> OpenSmState {
        self.log.state()
    }

    /// The role as status shows it: the last SMInfo answer when configured and it answered,
    /// otherwise the log's, labelled with why.
    pub fn current(&self) -> Role {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let reason = match (&self.sminfo, last) {
            (None, _) => "sminfo_umad_device is not set".to_owned(),
            (Some(r), None) => format!("SMInfo on {} not read yet", r.device().display()),
            (Some(_), Some(Ok((info, at)))) => {
                return Role {
                    state: state_of(&info),
                    source: RoleSource::SmInfo {
                        at,
                        guid: info.guid,
                        priority: info.priority,
                    },
                }
            }
            (Some(_), Some(Err(e))) => e,
        };
        Role {
            state: self.log_state(),
            source: RoleSource::LogFallback { reason },
        }
    }

    /// Refreshes the SMInfo read every `every` until `stopped` turns true (returns at once
    /// when no device is configured).
    pub async fn run(
        self: Arc<Self>,
        every: Duration,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        if self.sminfo.is_none() {
            return;
        }
        loop {
            self.read_sminfo().await;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.changed() => return,
            }
            if *stopped.borrow() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: u8) -> SmInfoRepr {
        SmInfoRepr {
            guid: 0x100001,
            sm_key: 0,
            act_count: 7,
            priority: 15,
            sm_state: state,
        }
    }

    #[test]
    fn states_from_sminfo() {
        assert_eq!(state_of(&info(sm_state::MASTER)), OpenSmState::Master);
        assert_eq!(state_of(&info(sm_state::STANDBY)), OpenSmState::Standby);
        assert_eq!(
            state_of(&info(sm_state::DISCOVERING)),
            OpenSmState::Discovering
        );
        assert_eq!(
            state_of(&info(sm_state::NOT_ACTIVE)),
            OpenSmState::NotActive
        );
        assert_eq!(state_of(&info(9)), OpenSmState::NotActive);
    }

    #[tokio::test]
    async fn a_failed_read_falls_back_to_the_log_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("opensm.log");
        std::fs::write(&log, "x -> Entering STANDBY state\n").unwrap();
        let reader = Arc::new(LogStateReader::new(log));
        let plain = SmRole::from_log(reader.clone());
        assert!(plain.read_sminfo().await.is_none());
        assert_eq!(
            plain.current(),
            Role {
                state: OpenSmState::Standby,
                source: RoleSource::LogFallback {
                    reason: "sminfo_umad_device is not set".into()
                }
            }
        );
        let role = SmRole::with_sminfo(reader, dir.path().join("no-umad0"));
        assert!(matches!(
            role.current().source,
            RoleSource::LogFallback { reason } if reason.contains("not read yet")
        ));
        let read = role.read_sminfo().await.expect("configured");
        assert!(read.is_err());
        let now = role.current();
        assert_eq!(now.state, OpenSmState::Standby);
        match now.source {
            RoleSource::LogFallback { reason } => {
                assert!(reason.contains("no-umad0"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_answer_is_the_role() {
        let dir = tempfile::tempdir().unwrap();
        let role = SmRole::with_sminfo(
            Arc::new(LogStateReader::new(dir.path().join("opensm.log"))),
            dir.path().join("umad0"),
        );
        *role.last.lock().unwrap() = Some(Ok((info(sm_state::MASTER), SystemTime::UNIX_EPOCH)));
        let r = role.current();
        assert_eq!(r.state, OpenSmState::Master);
        assert_eq!(r.source.as_str(), "sminfo");
    }
}
