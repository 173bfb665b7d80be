//! `[subnet_manager.opensm]`: the SM host's OpenSM settings, their defaults and their checks.

use super::ownership::{self, OwnershipConfig};
use crate::domain::Membership;
use serde::Deserialize;
use std::path::PathBuf;

/// How the agent makes OpenSM re-read the file.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReloadMethod {
    /// SIGHUP to OpenSM's pid (from `pid_file` or `pid`).
    #[default]
    Sighup,
    /// `resweep heavy` on OpenSM's loopback console (`console loopback`, `console_port`).
    Console,
}

/// `[subnet_manager.opensm]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSmConfig {
    /// OpenSM's `partition_config_file`.
    #[serde(default = "default_partitions_file")]
    pub partitions_file: PathBuf,
    /// OpenSM's `log_file`, read for `PARSE ERROR` lines after each reload.
    #[serde(default = "default_log_file")]
    pub log_file: PathBuf,
    /// OpenSM's own configuration file (`opensm.conf`, as given to `opensm -F`): when set, its
    /// `log_file` and `partition_config_file` must name the same files as `log_file` and
    /// `partitions_file`, and it must set `force_log_flush TRUE`, or the agent refuses to start
    /// (see [`super::log_check`]). Unset: the running OpenSM's `-F` file is read when there is one.
    #[serde(default)]
    pub opensm_conf: Option<PathBuf>,
    /// The operator's own partitions file (e.g. `/etc/opensm/partitions.operator.conf`). Set:
    /// the agent alone writes `partitions_file`, composed of this file (validated with the
    /// strict parser first; refused with its line and reason, the previous live file kept) and
    /// the agent's region. Unset: the operator's part is edited in place in `partitions_file`
    /// (see [`super::operator`]).
    #[serde(default)]
    pub operator_file: Option<PathBuf>,
    /// How to force a heavy sweep.
    #[serde(default)]
    pub reload: ReloadMethod,
    /// File holding OpenSM's pid (read before every signal).
    #[serde(default)]
    pub pid_file: Option<PathBuf>,
    /// OpenSM's pid, when there is no pid file.
    #[serde(default)]
    pub pid: Option<i32>,
    /// The process name (`/proc/PID/comm`) the pid must have before it is sent SIGHUP (default
    /// `opensm`): a stale pid file or a recycled pid never gets a signal meant for OpenSM.
    #[serde(default = "default_process_name")]
    pub process_name: String,
    /// OpenSM's loopback console port (`reload = "console"`).
    #[serde(default = "default_console_port")]
    pub console_port: u16,
    /// How long to watch OpenSM's log after a write for its confirmation, milliseconds: two
    /// heavy sweeps ending after the write (see [`super::reload`]). The watch ends early at the second
    /// `SUBNET UP` or an error line. Default 2000.
    #[serde(default = "default_reload_check_ms")]
    pub reload_check_ms: u64,
    /// P_Key table entries per port, default partition included (ibsim 64, ConnectX mlx5 128).
    #[serde(default = "default_table_size")]
    pub pkey_table_size: usize,
    /// Whether OpenSM runs with `allow_both_pkeys` (a `both` member then takes two entries).
    #[serde(default)]
    pub allow_both_pkeys: bool,
    /// `ALL` membership of the Default entry the region adds when the operator's part has none
    /// (`SELF`, the SM's port, is always full). Limited keeps tenant ports from reaching each
    /// other through the default partition.
    #[serde(default = "default_membership")]
    pub default_membership: Membership,
    /// Merge requests arriving during a write + sweep into the next one (off: one write and one
    /// sweep per request, for comparison).
    #[serde(default = "default_true")]
    pub group_commit: bool,
    /// Group commit: how long a commit group waits for the next request of a burst before it
    /// is written, milliseconds. The group is written once no request arrived (and none is
    /// still being admitted) for this long, or at `commit_linger_max_ms`. 0: written at once.
    /// Default 5 (a lone request's write + heavy sweep takes 100 ms or more).
    #[serde(default = "default_commit_linger_ms")]
    pub commit_linger_ms: u64,
    /// The longest a commit group waits for a burst to end, milliseconds. Default 200.
    #[serde(default = "default_commit_linger_max_ms")]
    pub commit_linger_max_ms: u64,
    /// The shortest time between two admissions of one node's changes, milliseconds: a node
    /// whose set changes faster has its requests held until its next slot, where they enter
    /// one commit together (none lost, none answered before it is committed); other nodes are
    /// not held. Bounds the writes and sweeps one node can cause. 0: no bound. Default 250.
    #[serde(default = "default_node_commit_interval_ms")]
    pub node_commit_interval_ms: u64,
    /// How often to look at OpenSM's log for a file it rejected on a sweep the agent did not
    /// trigger (an operator's edit that breaks the file), milliseconds; such a rejection is
    /// repaired at once (last accepted file restored, OpenSM signalled). 0: only at the next
    /// commit. Default 2000.
    #[serde(default = "default_watch_ms")]
    pub watch_ms: u64,
    /// Port ownership checks on claims from other nodes (`[subnet_manager.opensm.ownership]`).
    #[serde(default)]
    pub ownership: OwnershipConfig,
    /// Whether tenant keys are served while the Default entry grants `ALL=full`. Not read from
    /// this section: the daemon copies the top-level `allow_full_default` here.
    #[serde(skip)]
    pub allow_full_default: bool,
    /// The grant policy (`[grants]`): when it requires grants, every key in a node's set needs a
    /// valid, unconsumed grant. Not read from this section: the daemon copies `[grants]` here.
    /// `None`: grants are not required.
    #[serde(skip)]
    pub grants: Option<crate::domain::GrantPolicy>,
}

fn default_partitions_file() -> PathBuf {
    PathBuf::from("/etc/opensm/partitions.conf")
}
fn default_log_file() -> PathBuf {
    PathBuf::from("/var/log/opensm.log")
}
fn default_process_name() -> String {
    "opensm".into()
}
fn default_console_port() -> u16 {
    10000
}
fn default_reload_check_ms() -> u64 {
    2000
}
fn default_table_size() -> usize {
    64
}
fn default_membership() -> Membership {
    Membership::Limited
}
fn default_true() -> bool {
    true
}
fn default_commit_linger_ms() -> u64 {
    5
}
fn default_commit_linger_max_ms() -> u64 {
    200
}
fn default_node_commit_interval_ms() -> u64 {
    250
}
fn default_watch_ms() -> u64 {
    2000
}

impl Default for OpenSmConfig {
    fn default() -> Self {
        OpenSmConfig {
            partitions_file: default_partitions_file(),
            log_file: default_log_file(),
            opensm_conf: None,
            operator_file: None,
            reload: ReloadMethod::default(),
            pid_file: None,
            pid: None,
            process_name: default_process_name(),
            console_port: default_console_port(),
            reload_check_ms: default_reload_check_ms(),
            pkey_table_size: default_table_size(),
            allow_both_pkeys: false,
            default_membership: default_membership(),
            group_commit: true,
            commit_linger_ms: default_commit_linger_ms(),
            commit_linger_max_ms: default_commit_linger_max_ms(),
            node_commit_interval_ms: default_node_commit_interval_ms(),
            watch_ms: default_watch_ms(),
            ownership: OwnershipConfig::default(),
            allow_full_default: false,
            grants: None,
        }
    }
}

impl OpenSmConfig {
    /// Checks ranges and that a SIGHUP reload knows where OpenSM's pid is.
    pub fn validate(&self) -> Result<(), OpenSmConfigError> {
        if !(2..=512).contains(&self.pkey_table_size) {
            return Err(OpenSmConfigError::TableSize);
        }
        if self.reload == ReloadMethod::Sighup && self.pid_file.is_none() && self.pid.is_none() {
            return Err(OpenSmConfigError::SighupWithoutPid);
        }
        if matches!(self.pid, Some(p) if p <= 1) {
            return Err(OpenSmConfigError::Pid);
        }
        if self.process_name.is_empty() || self.process_name.contains(['/', '\n']) {
            return Err(OpenSmConfigError::ProcessName);
        }
        if self.reload_check_ms > 60_000 {
            return Err(OpenSmConfigError::ReloadCheck);
        }
        if self.commit_linger_max_ms > 10_000 || self.commit_linger_ms > self.commit_linger_max_ms {
            return Err(OpenSmConfigError::CommitLinger);
        }
        Ok(self.ownership.validate()?)
    }
}

/// Why `[subnet_manager.opensm]` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenSmConfigError {
    /// `pkey_table_size` out of range.
    #[error("pkey_table_size must be 2-512")]
    TableSize,
    /// `process_name` empty or not a bare name.
    #[error("process_name must be a program's name (as in /proc/PID/comm), without '/'")]
    ProcessName,
    /// SIGHUP reload without a way to find OpenSM's pid.
    #[error("reload = \"sighup\" needs pid_file or pid")]
    SighupWithoutPid,
    /// `pid` 0 or 1.
    #[error("pid must be above 1")]
    Pid,
    /// `reload_check_ms` too long.
    #[error("reload_check_ms must be at most 60000")]
    ReloadCheck,
    /// `commit_linger_ms` above `commit_linger_max_ms`, or the maximum above 10 s.
    #[error("commit_linger_ms must be at most commit_linger_max_ms, and that at most 10000")]
    CommitLinger,
    /// The `ownership` table is refused.
    #[error(transparent)]
    Ownership(#[from] ownership::OwnershipConfigError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_validates() {
        let c: OpenSmConfig = toml::from_str(
            "partitions_file = \"/x/p.conf\"\npid_file = \"/run/opensm.pid\"\nreload = \"sighup\"\npkey_table_size = 128\n",
        )
        .unwrap();
        assert!(c.validate().is_ok());
        assert!(c.group_commit);
        assert_eq!(c.default_membership, Membership::Limited);
        assert!(OpenSmConfig::default().validate().is_err());
        assert!(toml::from_str::<OpenSmConfig>("bogus = 1").is_err());
        assert_eq!((c.commit_linger_ms, c.commit_linger_max_ms), (5, 200));
        for (linger, max, ok) in [
            (0, 0, true),
            (200, 200, true),
            (201, 200, false),
            (5, 10_001, false),
        ] {
            let c = OpenSmConfig {
                commit_linger_ms: linger,
                commit_linger_max_ms: max,
                pid: Some(2),
                ..OpenSmConfig::default()
            };
            assert_eq!(c.validate().is_ok(), ok, "{linger} {max}");
        }
    }
}
