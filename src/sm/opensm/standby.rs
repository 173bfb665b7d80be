//! A standby OpenSM's file, or a dead OpenSM's: confirmed without a sweep.
//!
//! A standby OpenSM programs nothing and ignores SIGHUP, so it never logs the `SUBNET UP` lines
//! the sweep fence waits for: on an SM host whose OpenSM is standby every write would stay
//! unconfirmed. But a standby reads the partitions file in the first heavy sweep after it enters
//! MASTER, and every write is in place before its checkpoint is taken; so on such a host a write
//! is confirmed when OpenSM's own log says it is in STANDBY (its last `Entering ... state` line)
//! and the process is alive and named `process_name` (it is sent a SIGHUP through a pidfd,
//! which a standby ignores and a just-promoted master turns into a sweep).
//!
//! With `sminfo_umad_device` configured, "in STANDBY" means the SM's own SMInfo, read after the
//! write ([`super::sminfo`]), said STANDBY; the log is not consulted. Without it, OpenSM's log
//! decides, as above.
//!
//! **A dead OpenSM.** When that same read, started after the write, got no answer from a
//! working device *and* OpenSM's configured pid (`pid_file`/`pid`) is proven to name no live
//! OpenSM, checked after the read ([`super::sminfo::SmRole::proven_not_running`]), the write is
//! confirmed too: the file is in place for whatever OpenSM starts next. An SM that does not
//! answer SMInfo is not bound to the port and programs nothing; an OpenSM started later binds,
//! then reads the partitions file in its first heavy sweep, so after this write. Without both
//! settings nothing is proven. It is decided afresh for every write: once OpenSM answers SMInfo
//! or its pid lives again, writes go back to the standby check and the sweep fence (SIGHUP,
//! then OpenSM's own `SUBNET UP` lines). Without it, an SM host whose OpenSM died but whose
//! agent lives would never acknowledge a write (SIGHUP to a gone pid), and nothing fences a host
//! whose agent answers: every attach and release on the fabric would wait for that OpenSM.
//!
//! A master, an OpenSM still discovering, one that cannot be seen, or one not proven dead goes
//! through the sweep fence as before.

use super::opensm_state::OpenSmState;
use super::reload::{OpenSmReloader, ReloadError, ReloadReport, Reloader, Unsignalled};
use super::sminfo::ReadFailure;
use super::OpenSmConfig;
use crate::mad::SmInfoRepr;
use async_trait::async_trait;
use std::sync::Arc;

/// The [`Reloader`] of an SM host with peers: a standby OpenSM's write is confirmed without a
/// sweep (module docs); everything else is the inner reloader's.
pub struct StandbyAware {
    inner: Arc<dyn Reloader>,
    role: Arc<super::sminfo::SmRole>,
    pid: OpenSmReloader,
    process_name: String,
}

impl StandbyAware {
    /// Wraps `inner`; OpenSM's role comes from `role`, its pid from `config`.
    pub fn new(
        inner: Arc<dyn Reloader>,
        role: Arc<super::sminfo::SmRole>,
        config: &OpenSmConfig,
    ) -> StandbyAware {
        StandbyAware {
            inner,
            role,
            pid: OpenSmReloader::new(config),
            process_name: config.process_name.clone(),
        }
    }

    /// Whether OpenSM is standby, from `fresh` (a read started after the write) when SMInfo is
    /// configured, else from its log.
    fn standby(&self, fresh: Option<&Result<SmInfoRepr, ReadFailure>>) -> bool {
        match fresh {
            Some(Ok(info)) => super::sminfo::state_of(info) == OpenSmState::Standby,
            Some(Err(_)) => false,
            None => self.role.log_state() == OpenSmState::Standby,
        }
    }

    /// Signals a standby OpenSM (a just-promoted master sweeps); `Ok(false)` when not standby.
    fn standby_alive(
        &self,
        fresh: Option<&Result<SmInfoRepr, ReadFailure>>,
    ) -> Result<bool, ReloadError> {
        if !self.standby(fresh) {
            return Ok(false);
        }
        let pid = self.pid.opensm_pid()?;
        crate::sys::process::send_sighup_if_named(pid, &self.process_name).map_err(|e| {
            ReloadError::Unreachable(match e {
                crate::sys::process::NamedSignalError::Kernel(e) => Unsignalled::Signal {
                    pid,
                    source: Arc::new(e),
                },
                other => Unsignalled::NotOpenSm(Arc::new(other)),
            })
        })?;
        Ok(true)
    }
}

#[async_trait]
impl Reloader for StandbyAware {
    fn checkpoint(&self) -> u64 {
        self.inner.checkpoint()
    }

    async fn reload(&self, checkpoint: u64) -> Result<ReloadReport, ReloadError> {
        // Started after the write (module docs): any answer or silence is about the file as
        // it is now.
        let fresh = self.role.read_sminfo_classified().await;
        if self.standby_alive(fresh.as_ref())? {
            tracing::debug!(
                by_sminfo = self.role.reads_sminfo(),
                "OpenSM is standby: the file is in place for its takeover"
            );
            return Ok(ReloadReport { file_read: true });
        }
        if let Some(why) = self.role.proven_not_running(fresh.as_ref()) {
            tracing::info!(
                opensm = %why,
                "OpenSM is not running (its port does not answer SMInfo, its pid is gone): the file is in place for the OpenSM that starts next"
            );
            return Ok(ReloadReport { file_read: true });
        }
        self.inner.reload(checkpoint).await
    }

    fn rejections_since(&self, offset: u64) -> (Vec<String>, u64) {
        self.inner.rejections_since(offset)
    }

    fn log_identity(&self) -> Option<(u64, u64)> {
        self.inner.log_identity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the sweep-fence reloads it is asked for, and answers "not read".
    struct Fence(std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl Reloader for Fence {
        fn checkpoint(&self) -> u64 {
            0
        }
        async fn reload(&self, _: u64) -> Result<ReloadReport, ReloadError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(ReloadReport { file_read: false })
        }
    }

    #[tokio::test]
    async fn with_sminfo_configured_the_log_never_confirms_a_standby() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("opensm.log");
        std::fs::write(
            &log,
            "Dec 04 12:00:00 000000 [AB12] 0x80 -> Entering STANDBY state\n",
        )
        .unwrap();
        let role = Arc::new(super::super::sminfo::SmRole::with_sminfo(
            Arc::new(super::super::opensm_state::LogStateReader::new(log)),
            dir.path().join("no-umad0"),
        ));
        let fence = Arc::new(Fence(Default::default()));
        let aware = StandbyAware::new(fence.clone(), role.clone(), &OpenSmConfig::default());
        // The log says STANDBY, but SMInfo cannot be read: the sweep fence decides.
        let fresh = role.read_sminfo_classified().await;
        assert!(!aware.standby(fresh.as_ref()));
        let report = aware.reload(0).await.unwrap();
        assert!(!report.file_read);
        assert_eq!(fence.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(matches!(
            role.current().source,
            super::super::sminfo::RoleSource::LogFallback { .. }
        ));
    }

    fn gone() -> Option<super::super::sminfo::PidCheck> {
        Some(Box::new(|| {
            Err(super::super::sminfo::PidDown {
                reason: "OpenSM's pid 7 is gone (no such process)".into(),
                proven: true,
            })
        }))
    }

    #[tokio::test]
    async fn a_gone_pid_without_a_silent_port_goes_through_the_sweep_fence() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("opensm.log");
        std::fs::write(&log, "x -> Entering MASTER state\n").unwrap();
        let log = Arc::new(super::super::opensm_state::LogStateReader::new(log));
        // No SMInfo device: a gone pid alone proves nothing (a stale pid file).
        let from_log =
            Arc::new(super::super::sminfo::SmRole::from_log(log.clone()).with_pid_check(gone()));
        // A device that fails (not "no answer"): nothing is known of the SM.
        let failing = Arc::new(
            super::super::sminfo::SmRole::with_sminfo(log, dir.path().join("no-umad0"))
                .with_pid_check(gone()),
        );
        for role in [from_log, failing] {
            let fence = Arc::new(Fence(Default::default()));
            let aware = StandbyAware::new(fence.clone(), role.clone(), &OpenSmConfig::default());
            let report = aware.reload(0).await.unwrap();
            assert!(!report.file_read);
            assert_eq!(fence.0.load(std::sync::atomic::Ordering::SeqCst), 1);
            // Status still says `not running` (the pid is gone).
            assert!(role.not_running().is_some());
        }
    }

    #[test]
    fn reader_follows_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("opensm.log");
        let r = super::super::opensm_state::LogStateReader::new(log.clone());
        assert_eq!(r.state(), OpenSmState::Unknown);
        std::fs::write(
            &log,
            "Dec 04 12:00:00 000000 [AB12] 0x80 -> Entering DISCOVERING state\nDec 04 12:00:01 000000 [AB12] 0x80 -> Entering STANDBY state\n",
        )
        .unwrap();
        assert_eq!(r.state(), OpenSmState::Standby);
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str("Dec 04 12:00:02 000000 [AB12] 0x02 -> SUBNET UP\n");
        std::fs::write(&log, &text).unwrap();
        assert_eq!(r.state(), OpenSmState::Standby);
        text.push_str("Dec 04 12:00:00 000000 [AB12] 0x80 -> Entering MASTER state\n");
        std::fs::write(&log, &text).unwrap();
        assert_eq!(r.state(), OpenSmState::Master);
        std::fs::write(&log, "y\n").unwrap();
        assert_eq!(r.state(), OpenSmState::Unknown);
    }
}
