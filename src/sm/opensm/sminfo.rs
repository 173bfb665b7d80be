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
//! live sessions of one process steal each other's answers), each on a blocking thread. Under
//! umad2sim the device must have no other user in the process (the SMP observer, the ownership
//! check): the shim crashes the process once one of them closes its fd, so `check-config` and
//! `serve` refuse that (`umad.shared_device`, [`crate::sys::umad::umad2sim_in_process`]).

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
    /// This host's OpenSM is not running: its pid (`pid_file`/`pid`) is gone, or SMInfo on its
    /// port got no answer while no live pid says otherwise. The state is then the log's last
    /// word, which is not current.
    NotRunning {
        /// How it was seen.
        reason: String,
    },
}

impl RoleSource {
    /// `sminfo` or `opensm-log`, for status and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            RoleSource::SmInfo { .. } => "sminfo",
            RoleSource::LogFallback { .. } => "opensm-log",
            RoleSource::NotRunning { .. } => "not-running",
        }
    }

    /// Why the role is not the SM's own answer (the fallback's or not-running's reason).
    pub fn reason(&self) -> Option<&str> {
        match self {
            RoleSource::SmInfo { .. } => None,
            RoleSource::LogFallback { reason } | RoleSource::NotRunning { reason } => Some(reason),
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
        self.read_classified().await.map_err(|f| f.message)
    }

    /// [`SmInfoReader::read`], telling "no answer" (no SM bound to the port) from a failure of
    /// the device itself.
    pub async fn read_classified(&self) -> Result<SmInfoRepr, ReadFailure> {
        let _turn = self.one_at_a_time.lock().await;
        let device = self.device.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<SmInfoRepr, SaError> {
            SaSession::open(&device, TIMING)?.sm_info()
        })
        .await
        .map_err(|e| ReadFailure {
            message: format!("SMInfo read thread: {e}"),
            no_answer: false,
        })?;
        read.map_err(|e| ReadFailure {
            no_answer: matches!(e, SaError::Timeout { .. } | SaError::Deadline { .. }),
            message: format!("SMInfo on {}: {e}", self.device.display()),
        })
    }
}

/// A peer SM port check's timing: 500 ms per answer, two further attempts, 4 s for the whole
/// session (the local port, the SA's NodeRecord, then SMInfo).
const PEER_TIMING: SaTiming = SaTiming {
    timeout: Duration::from_millis(500),
    retries: 2,
    deadline: Duration::from_secs(4),
};

/// What the fabric says of a peer's SM port ([`SmInfoReader::check_peer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerSmCheck {
    /// No SM runs there: the port is not in the SA's view (down or gone), or a LID-routed
    /// SMInfo Get to it got no answer. The evidence, for humans.
    Silent(String),
    /// An SM answered SMInfo on the port, in this state (it could become master).
    Answers(OpenSmState),
    /// The check could not be made (this host's port knows no SM, the SA did not answer, the
    /// device failed): proves nothing.
    Unknown(String),
}

impl SmInfoReader {
    /// Checks the SM on the port with GUID `guid` (another SM host's): the local port's SM LID,
    /// the SA's NodeRecord of `guid` (absent: the port is down or gone), then a LID-routed
    /// `SubnGet(SMInfo)` to its LID. One session, after any read still running.
    pub async fn check_peer(&self, guid: u64) -> PeerSmCheck {
        use super::sa_client::SaError as E;
        let _turn = self.one_at_a_time.lock().await;
        let device = self.device.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let mut session = match SaSession::open(&device, PEER_TIMING) {
                Ok(s) => s,
                Err(e) => return PeerSmCheck::Unknown(format!("{}: {e}", device.display())),
            };
            let local = match session.local_port() {
                Ok(l) => l,
                Err(e) => return PeerSmCheck::Unknown(format!("this host's port: {e}")),
            };
            let record = match session.node_record(local.sm_lid, guid) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    return PeerSmCheck::Silent(format!(
                        "port {guid:#018x} is not in the SA's view of the fabric (SM LID {}): down or gone",
                        local.sm_lid
                    ))
                }
                Err(e) => return PeerSmCheck::Unknown(format!("SA NodeRecord of {guid:#018x}: {e}")),
            };
            match session.sm_info_at(record.lid) {
                Ok(info) => PeerSmCheck::Answers(state_of(&info)),
                Err(e @ (E::Timeout { .. } | E::Deadline { .. })) => PeerSmCheck::Silent(format!(
                    "SMInfo to port {guid:#018x} (LID {}): {e}",
                    record.lid
                )),
                Err(e) => PeerSmCheck::Unknown(format!(
                    "SMInfo to port {guid:#018x} (LID {}): {e}",
                    record.lid
                )),
            }
        })
        .await;
        checked.unwrap_or_else(|e| PeerSmCheck::Unknown(format!("SMInfo check thread: {e}")))
    }
}

/// Why an SMInfo read failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFailure {
    /// For humans and status.
    pub message: String,
    /// The device worked and nothing answered: no SM runs on the port.
    pub no_answer: bool,
}

/// Why OpenSM's configured pid does not name a live OpenSM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidDown {
    /// For humans and status.
    pub reason: String,
    /// The pid was read and names no live OpenSM: no such process, another program (the pid
    /// was recycled) or a zombie. False when the pid itself could not be had (the pid file is
    /// missing or unreadable, holds no pid) or the process could not be looked at: then it is
    /// not known, only not seen.
    pub proven: bool,
}

impl std::fmt::Display for PidDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl From<String> for PidDown {
    /// A reason only: not seen running, not proven gone.
    fn from(reason: String) -> PidDown {
        PidDown {
            reason,
            proven: false,
        }
    }
}

impl From<&str> for PidDown {
    /// A reason only: not seen running, not proven gone.
    fn from(reason: &str) -> PidDown {
        PidDown::from(reason.to_owned())
    }
}

/// Whether OpenSM's process is alive (`Ok(pid)`), from its configured pid.
pub type PidCheck = Box<dyn Fn() -> Result<i32, PidDown> + Send + Sync>;

/// The pid check of `config` when it names OpenSM's pid (`pid_file` or `pid`); `None` when it
/// does not (then only SMInfo can say OpenSM is not running, and it is never proven not
/// running: [`SmRole::proven_not_running`]).
pub fn pid_check(config: &super::config::OpenSmConfig) -> Option<PidCheck> {
    if config.pid_file.is_none() && config.pid.is_none() {
        return None;
    }
    let config = config.clone();
    Some(Box::new(move || pid_state(&config)))
}

/// Whether the pid from `config`'s `pid_file`/`pid` is a live process (not a zombie) called
/// `process_name`; `Err` says why not and whether that is proven ([`PidDown::proven`]). "No
/// such process" comes from the kernel (`kill(pid, 0)`: ESRCH), not from `/proc`, which a
/// `hidepid` mount hides other users' processes from.
pub fn pid_state(config: &super::config::OpenSmConfig) -> Result<i32, PidDown> {
    let pid = super::reload::OpenSmReloader::new(config)
        .opensm_pid()
        .map_err(|e| PidDown::from(e.to_string()))?;
    let gone = |reason: String| PidDown {
        reason,
        proven: true,
    };
    if let Err(nix::errno::Errno::ESRCH) =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
    {
        return Err(gone(format!(
            "OpenSM's pid {pid} is gone (no such process)"
        )));
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map_err(|e| PidDown::from(format!("OpenSM's pid {pid} cannot be looked at ({e})")))?;
    let want: String = config.process_name.chars().take(15).collect();
    if comm.trim_end_matches('\n') != want {
        return Err(gone(format!(
            "OpenSM's pid {pid} is {:?}, not {:?}",
            comm.trim_end(),
            config.process_name
        )));
    }
    // A SIGKILLed child that nobody reaped stays a zombie: signals still "succeed".
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    if matches!(state, Some("Z") | Some("X")) {
        return Err(gone(format!("OpenSM's pid {pid} has exited (a zombie)")));
    }
    Ok(pid)
}

/// This host's OpenSM role: SMInfo when configured, OpenSM's log as the labelled fallback.
pub struct SmRole {
    log: Arc<LogStateReader>,
    sminfo: Option<SmInfoReader>,
    last: Mutex<Option<Result<(SmInfoRepr, SystemTime), ReadFailure>>>,
    pid: Option<PidCheck>,
}

impl SmRole {
    /// The role from `log` only (no SMInfo device configured).
    pub fn from_log(log: Arc<LogStateReader>) -> SmRole {
        SmRole {
            log,
            sminfo: None,
            last: Mutex::new(None),
            pid: None,
        }
    }

    /// Also checks OpenSM's pid (see [`pid_check`]): a pid that is gone shows `not running`.
    pub fn with_pid_check(self, pid: Option<PidCheck>) -> SmRole {
        SmRole { pid, ..self }
    }

    /// The role from SMInfo over `device`, `log` as the fallback.
    pub fn with_sminfo(log: Arc<LogStateReader>, device: PathBuf) -> SmRole {
        SmRole {
            log,
            sminfo: Some(SmInfoReader::new(device)),
            last: Mutex::new(None),
            pid: None,
        }
    }

    /// The SMInfo reader, when a device is configured (peer checks share its turn).
    pub fn reader(&self) -> Option<&SmInfoReader> {
        self.sminfo.as_ref()
    }

    /// Whether SMInfo is configured.
    pub fn reads_sminfo(&self) -> bool {
        self.sminfo.is_some()
    }

    /// A fresh SMInfo read (kept for status); `None` when no device is configured.
    pub async fn read_sminfo(&self) -> Option<Result<SmInfoRepr, String>> {
        self.read_sminfo_classified()
            .await
            .map(|read| read.map_err(|f| f.message))
    }

    /// [`SmRole::read_sminfo`], telling "no answer" from a failed device ([`ReadFailure`]).
    pub async fn read_sminfo_classified(&self) -> Option<Result<SmInfoRepr, ReadFailure>> {
        let reader = self.sminfo.as_ref()?;
        let read = reader.read_classified().await;
        let kept = read.clone().map(|i| (i, SystemTime::now()));
        if let Err(e) = &kept {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if !matches!(&*last, Some(Err(was)) if was == e) {
                tracing::warn!(error = %e.message, no_answer = e.no_answer, "cannot read this host's SM role over SMInfo; status shows OpenSM's log as a fallback, or not running");
            }
            *last = Some(kept);
        } else {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
        }
        Some(read)
    }

    /// [`SmRole::proven_not_running`] on the last SMInfo read (status's, refreshed every
    /// [`POLL`] and by every write), for the standing condition.
    pub fn proven_not_running_last(&self) -> Option<String> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let last = last.map(|read| read.map(|(info, _)| info));
        self.proven_not_running(last.as_ref())
    }

    /// Sets the last SMInfo read, as a read would (tests of the users of the role).
    #[cfg(test)]
    pub(crate) fn set_last_read(&self, read: Result<SmInfoRepr, ReadFailure>) {
        *self.last.lock().unwrap() = Some(read.map(|i| (i, SystemTime::now())));
    }

    /// Why this host's OpenSM is *proven* not running, given `fresh`, the SMInfo read (from
    /// [`SmRole::read_sminfo_classified`]) started after the fact to be judged (a write): that
    /// read got no answer from a working device ([`ReadFailure::no_answer`]) **and** OpenSM's
    /// configured pid is proven to name no live OpenSM ([`PidDown::proven`]), checked now,
    /// after the read. `None` otherwise: an SM answered (in any state), the device failed, no
    /// device or no pid is configured, the pid lives, or it could not be had.
    ///
    /// Both are needed: a silent port alone may be an OpenSM too busy to answer, a gone pid
    /// alone may be a stale pid file beside an OpenSM that runs. Weaker than
    /// [`SmRole::not_running`] (status), which takes either.
    pub fn proven_not_running(
        &self,
        fresh: Option<&Result<SmInfoRepr, ReadFailure>>,
    ) -> Option<String> {
        let silent = match fresh? {
            Err(f) if f.no_answer => &f.message,
            _ => return None,
        };
        match (self.pid.as_ref()?)() {
            Err(PidDown {
                reason,
                proven: true,
            }) => Some(format!("{reason}; {silent}")),
            _ => None,
        }
    }

    /// The state OpenSM's log last announced.
    pub fn log_state(&self) -> OpenSmState {
        self.log.state()
    }

    /// The role as status shows it: the last SMInfo answer when configured and it answered,
    /// otherwise the log's, labelled with why.
    pub fn current(&self) -> Role {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(reason) = self.not_running_with(last.as_ref()) {
            return Role {
                state: self.log_state(),
                source: RoleSource::NotRunning { reason },
            };
        }
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
            (Some(_), Some(Err(e))) => e.message,
        };
        Role {
            state: self.log_state(),
            source: RoleSource::LogFallback { reason },
        }
    }

    /// Why this host's OpenSM is not running, when it is seen not to be: its configured pid is
    /// gone (or names another program, or a zombie), or SMInfo on its port got no answer and
    /// no configured pid says OpenSM lives. `None` when it runs or nothing can tell.
    pub fn not_running(&self) -> Option<String> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.not_running_with(last.as_ref())
    }

    fn not_running_with(
        &self,
        last: Option<&Result<(SmInfoRepr, SystemTime), ReadFailure>>,
    ) -> Option<String> {
        if matches!(last, Some(Ok(_))) {
            return None; // the SM itself answered on the port
        }
        let pid = self.pid.as_ref().map(|check| check());
        let silent = match last {
            Some(Err(f)) if f.no_answer => Some(f.message.clone()),
            _ => None,
        };
        match (pid, silent) {
            (Some(Err(gone)), Some(sminfo)) => Some(format!("{gone}; {sminfo}")),
            (Some(Err(gone)), None) => Some(gone.reason),
            (Some(Ok(_)), _) => None,
            (None, Some(sminfo)) => Some(sminfo),
            (None, None) => None,
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
        std::fs::write(
            &log,
            "Dec 04 12:00:00 000000 [AB12] 0x80 -> Entering STANDBY state\n",
        )
        .unwrap();
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
    fn a_gone_pid_or_a_silent_port_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(LogStateReader::new(dir.path().join("opensm.log")));
        std::fs::write(
            dir.path().join("opensm.log"),
            "x -> Entering MASTER state\n",
        )
        .unwrap();
        let gone =
            || -> Option<PidCheck> { Some(Box::new(|| Err("OpenSM's pid 7 is gone".into()))) };
        let alive = || -> Option<PidCheck> { Some(Box::new(|| Ok(7))) };
        // The pid is gone: not running, whatever the log last said.
        let role = SmRole::from_log(log.clone()).with_pid_check(gone());
        let r = role.current();
        assert_eq!(r.source.as_str(), "not-running");
        assert!(role.not_running().unwrap().contains("pid 7 is gone"));
        // SMInfo got no answer and no pid is configured: not running.
        let role = SmRole::with_sminfo(log.clone(), dir.path().join("umad0"));
        *role.last.lock().unwrap() = Some(Err(ReadFailure {
            message: "SMInfo on umad0: no answer after 3 attempts".into(),
            no_answer: true,
        }));
        assert!(role.not_running().unwrap().contains("no answer"));
        // ... but a live pid says it runs: the labelled fallback.
        let role = role.with_pid_check(alive());
        assert_eq!(role.not_running(), None);
        assert_eq!(role.current().source.as_str(), "opensm-log");
        // A device that failed says nothing about OpenSM.
        let role = SmRole::with_sminfo(log.clone(), dir.path().join("umad0"));
        *role.last.lock().unwrap() = Some(Err(ReadFailure {
            message: "cannot open umad0".into(),
            no_answer: false,
        }));
        assert_eq!(role.not_running(), None);
        // The SM's own answer wins over a stale pid file.
        let role = SmRole::with_sminfo(log, dir.path().join("umad0")).with_pid_check(gone());
        *role.last.lock().unwrap() = Some(Ok((info(sm_state::MASTER), SystemTime::UNIX_EPOCH)));
        assert_eq!(role.not_running(), None);
    }

    fn no_answer() -> Result<SmInfoRepr, ReadFailure> {
        Err(ReadFailure {
            message: "SMInfo on umad0: no answer after 3 attempts".into(),
            no_answer: true,
        })
    }

    fn role_with(pid: Option<PidCheck>) -> SmRole {
        let dir = std::env::temp_dir();
        SmRole::with_sminfo(
            Arc::new(LogStateReader::new(dir.join("no-such-opensm.log"))),
            dir.join("umad0"),
        )
        .with_pid_check(pid)
    }

    fn proven_gone() -> Option<PidCheck> {
        Some(Box::new(|| {
            Err(PidDown {
                reason: "OpenSM's pid 7 is gone (no such process)".into(),
                proven: true,
            })
        }))
    }

    #[test]
    fn proven_not_running_needs_a_silent_port_and_a_gone_pid() {
        // Both: proven, with both facts in the reason.
        let why = role_with(proven_gone())
            .proven_not_running(Some(&no_answer()))
            .expect("both facts hold");
        assert!(
            why.contains("pid 7 is gone") && why.contains("no answer"),
            "{why}"
        );
        // The pid is gone but the SM answered (whatever its state): it runs.
        for state in [
            sm_state::MASTER,
            sm_state::STANDBY,
            sm_state::DISCOVERING,
            sm_state::NOT_ACTIVE,
        ] {
            let answered = Ok(info(state));
            assert_eq!(
                role_with(proven_gone()).proven_not_running(Some(&answered)),
                None
            );
        }
        // The pid is gone but the device failed: nothing is known of the SM.
        let failed = Err(ReadFailure {
            message: "cannot open umad0".into(),
            no_answer: false,
        });
        assert_eq!(
            role_with(proven_gone()).proven_not_running(Some(&failed)),
            None
        );
        // No SMInfo device: no read, no proof.
        assert_eq!(role_with(proven_gone()).proven_not_running(None), None);
    }

    #[test]
    fn a_silent_port_with_a_live_unknown_or_unconfigured_pid_is_not_proven() {
        let silent = no_answer();
        // A live pid: OpenSM runs (too busy to answer, or not bound yet).
        let alive = role_with(Some(Box::new(|| Ok(7))));
        assert_eq!(alive.proven_not_running(Some(&silent)), None);
        // A pid file that cannot be read says nothing about the process.
        let unknown = role_with(Some(Box::new(|| {
            Err("pid file /run/opensm.pid: No such file or directory".into())
        })));
        assert_eq!(unknown.proven_not_running(Some(&silent)), None);
        // No pid configured.
        assert_eq!(role_with(None).proven_not_running(Some(&silent)), None);
        // Status still shows each of them as it did.
        *unknown.last.lock().unwrap() = Some(silent.clone().map(|i| (i, SystemTime::now())));
        assert!(unknown.not_running().is_some());
    }

    fn pid_config(pid: i32, name: &str) -> super::super::config::OpenSmConfig {
        super::super::config::OpenSmConfig {
            pid: Some(pid),
            process_name: name.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn pid_state_proves_only_what_it_saw() {
        let me = i32::try_from(std::process::id()).unwrap();
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let comm = comm.trim_end();
        // This process, under its own name: alive.
        assert_eq!(pid_state(&pid_config(me, comm)), Ok(me));
        // The pid runs another program: that OpenSM is gone (a recycled pid).
        let other = pid_state(&pid_config(me, "opensm")).unwrap_err();
        assert!(other.proven, "{other}");
        // An exited, reaped child: no such process.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = i32::try_from(child.id()).unwrap();
        child.wait().unwrap();
        let gone = pid_state(&pid_config(dead, "true")).unwrap_err();
        assert!(gone.proven && gone.reason.contains("gone"), "{gone}");
        // An exited child nobody reaped: a zombie.
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        let zpid = i32::try_from(zombie.id()).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let z = loop {
            match pid_state(&pid_config(zpid, "true")) {
                Err(z) if z.reason.contains("zombie") => break z,
                _ if std::time::Instant::now() > until => panic!("no zombie"),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        assert!(z.proven, "{z}");
        zombie.wait().unwrap();
        // A missing pid file: not known, only not seen.
        let dir = tempfile::tempdir().unwrap();
        let missing = pid_state(&super::super::config::OpenSmConfig {
            pid_file: Some(dir.path().join("opensm.pid")),
            ..Default::default()
        })
        .unwrap_err();
        assert!(!missing.proven, "{missing}");
        // ... nor a pid file holding no pid.
        std::fs::write(dir.path().join("opensm.pid"), "x\n").unwrap();
        let garbage = pid_state(&super::super::config::OpenSmConfig {
            pid_file: Some(dir.path().join("opensm.pid")),
            ..Default::default()
        })
        .unwrap_err();
        assert!(!garbage.proven, "{garbage}");
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
