//! The subcommands' arguments, `--pkey` parsing, and the local `check-config` / `ports`.

use super::output;
use super::preflight::Preflight;
use crate::config::Config;
use crate::proto::agent as pb;
use clap::Args;
use std::path::Path;
use std::process::ExitCode;

/// `attach` arguments.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The instance on this node.
    #[arg(long)]
    pub instance: String,
    /// Partition id (`ibpart_...`).
    #[arg(long)]
    pub partition: String,
    /// Partition name.
    #[arg(long)]
    pub name: String,
    /// Owning workspace.
    #[arg(long)]
    pub workspace: String,
    /// Owning account.
    #[arg(long)]
    pub account: String,
    /// The partition's fabric (default: this node's fabric).
    #[arg(long)]
    pub fabric: Option<String>,
    /// P_Key base in hex as InfiniBand tools print it: 0x0a12 or 0a12 (0x0001..=0x7ffe; never
    /// decimal). Membership is --limited, not bit 15.
    #[arg(long, value_parser = parse_pkey)]
    pub pkey: u32,
    /// Limited instead of full membership.
    #[arg(long)]
    pub limited: bool,
    /// Wait up to this long (at most 10m) for ACTIVE; exit 75 if it is not reached. A
    /// duration such as 30s, 5m or 1m30s; a bare number is seconds.
    #[arg(long, value_parser = parse_wait, value_name = "DURATION")]
    pub wait: Option<std::time::Duration>,
    /// The control plane's signed grant for this attachment: the base64 `fabric-agent grant
    /// sign` prints, or @FILE holding it.
    #[arg(long)]
    pub grant: Option<String>,
    /// A port of the instance (repeat for each): DEVICE/PORT (`mlx5_0/1`) or a port GUID
    /// (`0x0002c903000e0b72`). None: every fabric port of the node.
    #[arg(long = "port", value_parser = parse_port)]
    pub ports: Vec<PortArg>,
}

/// A port as `attach --port` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortArg {
    /// `mlx5_0/1`.
    Device(String, u32),
    /// A port GUID, passed on as written.
    Guid(String),
}

fn parse_port(s: &str) -> Result<PortArg, String> {
    if let Some((device, port)) = s.rsplit_once('/') {
        let n: u32 = port
            .parse()
            .map_err(|_| format!("{s:?}: the port number after '/' must be 1-255"))?;
        if device.is_empty() || !(1..=255).contains(&n) {
            return Err(format!("{s:?} is not DEVICE/PORT (e.g. mlx5_0/1)"));
        }
        return Ok(PortArg::Device(device.to_owned(), n));
    }
    s.parse::<crate::domain::Guid>()
        .map_err(|_| format!("{s:?} is neither DEVICE/PORT (mlx5_0/1) nor a port GUID"))?;
    Ok(PortArg::Guid(s.to_owned()))
}

/// `release` arguments.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The terminated instance.
    #[arg(long)]
    pub instance: String,
    /// Wait up to this long (at most 10m) for RELEASED; exit 75 if it is not reached. A
    /// duration such as 30s, 5m or 1m30s; a bare number is seconds.
    #[arg(long, value_parser = parse_wait, value_name = "DURATION")]
    pub wait: Option<std::time::Duration>,
}

/// `attachments` filters.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this state.
    #[arg(long, value_enum, ignore_case = true)]
    pub state: Option<StateArg>,
    /// Only this partition id.
    #[arg(long)]
    pub partition: Option<String>,
    /// Only this instance.
    #[arg(long)]
    pub instance: Option<String>,
}

/// An attachment state, as `--state` takes it (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateArg {
    /// Stored, not yet applied.
    Pending,
    /// Applied; the port tables are being read.
    Programming,
    /// Confirmed in every fabric port's table.
    Active,
    /// Was ACTIVE; a port's table lost the key.
    Drifted,
    /// Release requested; not yet confirmed gone.
    Releasing,
    /// Confirmed gone.
    Released,
    /// Refused for good.
    Failed,
}

impl StateArg {
    /// The API's state.
    pub fn to_pb(self) -> pb::AttachmentState {
        use pb::AttachmentState as S;
        match self {
            StateArg::Pending => S::Pending,
            StateArg::Programming => S::Programming,
            StateArg::Active => S::Active,
            StateArg::Drifted => S::Drifted,
            StateArg::Releasing => S::Releasing,
            StateArg::Released => S::Released,
            StateArg::Failed => S::Failed,
        }
    }
}

/// `get` arguments.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The instance whose attachment to show.
    #[arg(value_name = "INSTANCE")]
    pub instance: String,
}

/// The longest `--wait` (the daemon's own bound).
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Parses a `--wait`: a human duration (`30s`, `5m`, `1m30s`, as systemd and kubectl write
/// them) or a bare number of seconds, at most [`MAX_WAIT`].
pub fn parse_wait(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let d = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        t.parse::<u64>()
            .map(std::time::Duration::from_secs)
            .map_err(|e| format!("{s:?}: {e}"))?
    } else {
        humantime::parse_duration(t).map_err(|e| {
            format!("{s:?} is not a duration ({e}): write e.g. 30s, 5m or 1m30s (a bare number is seconds)")
        })?
    };
    if d > MAX_WAIT {
        return Err(format!(
            "{s:?} is longer than the longest wait, {}",
            humantime::format_duration(MAX_WAIT)
        ));
    }
    Ok(d)
}

/// `check-config` arguments.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Only parse and validate the file; skip the checks of this host's paths and PEM files
    /// (for a config written for another host, e.g. a package's example).
    #[arg(long)]
    pub syntax: bool,
}

/// `events` arguments.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Start after this sequence number.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep streaming live events.
    #[arg(long)]
    pub follow: bool,
}

/// A `--pkey` argument that is not a tenant P_Key base; each says what was understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PKeyArgError {
    /// Not 1-4 hex digits.
    #[error(
        "{0:?} is not a P_Key: give 1-4 hex digits, e.g. 0x0a12 or 0a12 (P_Keys are always hex)"
    )]
    NotHex(String),
    /// Reads as 0.
    #[error("{0:?} read as 0x0000, which is not a valid P_Key")]
    Zero(String),
    /// The full-membership bit alone (base 0).
    #[error(
        "{0:?} read as 0x8000: that is only the full-membership bit, and base 0x0000 is not a \
         P_Key; give a base 0x0001..0x7ffe (e.g. 0x0a12; membership is --limited or full by \
         default)"
    )]
    MembershipBitOnly(String),
    /// The default partition's key.
    #[error("{text:?} read as {value:#06x}, the default partition, which no tenant may claim")]
    Default {
        /// The argument.
        text: String,
        /// What it read as.
        value: u32,
    },
    /// The full-membership bit is set.
    #[error(
        "{text:?} read as {value:#06x}, which has the full-membership bit set: give the base {:#06x} \
         (membership is --limited or full by default)",
        .value & 0x7fff
    )]
    MembershipBit {
        /// The argument.
        text: String,
        /// What it read as.
        value: u32,
    },
}

/// Parses a P_Key base the way InfiniBand tools write keys: hex, with or without `0x`, 1-4
/// digits, never decimal. A value with the membership bit set or outside 0x0001..=0x7ffe is
/// refused with what was understood.
pub fn parse_pkey(s: &str) -> Result<u32, PKeyArgError> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(PKeyArgError::NotHex(s.to_owned()));
    }
    let value = u32::from_str_radix(digits, 16).expect("checked hex digits");
    let text = s.to_owned();
    match value {
        0 => Err(PKeyArgError::Zero(text)),
        0x8000 => Err(PKeyArgError::MembershipBitOnly(text)),
        0x7fff | 0xffff => Err(PKeyArgError::Default { text, value }),
        0x8001.. => Err(PKeyArgError::MembershipBit { text, value }),
        _ => Ok(value),
    }
}

/// `check-config`: loads and validates the file, then runs every check `serve` runs before it
/// binds ([`Preflight`]); exit 64 when anything fails. `--json` prints one object in the shape
/// `doctor --json` prints too (`super::verdict`): `{"config", "ok", "verdict", "error"?, "node"?,
/// "fabric"?, "backend"?, "observer"?, "checks": [{"check", "verdict", "ok", "detail"}]}`.
pub fn check_config(path: &Path, args: &CheckConfigArgs, json: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            if json {
                let mut v = super::verdict::summary(&[super::verdict::Check::new(
                    super::verdict::Verdict::Fail,
                    "config",
                    e.to_string(),
                )]);
                v["config"] = path.display().to_string().into();
                v["error"] = e.to_string().into();
                output::json(&v);
            } else {
                eprintln!("error: {e}");
            }
            return ExitCode::from(super::exit::CONFIG);
        }
    };
    let preflight = if args.syntax {
        Preflight::default()
    } else {
        Preflight::run(&config)
    };
    if json {
        let mut v = super::verdict::summary(&preflight.checks);
        v["config"] = path.display().to_string().into();
        v["node"] = config.node_id.as_str().into();
        v["fabric"] = config.fabric.as_str().into();
        v["backend"] = super::loaded::backend_name(&config).into();
        v["observer"] = super::loaded::observer_name(&config).into();
        output::json(&v);
    } else if preflight.ok() {
        println!(
            "{}: ok ({}; {})",
            path.display(),
            super::loaded::summary(&config),
            if args.syntax {
                "syntax only".to_owned()
            } else {
                format!("{} host checks passed", preflight.checks.len())
            }
        );
    } else {
        for c in preflight.failures() {
            eprintln!("error: {}: {}", c.check, c.detail);
        }
    }
    if !json {
        for c in preflight
            .checks
            .iter()
            .filter(|c| c.verdict == super::verdict::Verdict::Warn)
        {
            eprintln!("warning: {}: {}", c.check, c.detail);
        }
    }
    if preflight.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::exit::CONFIG)
    }
}

/// `ports`: reads the ports through the configured observer, without the daemon.
pub async fn ports(path: &Path, format: super::Format) -> ExitCode {
    let config = match super::loaded::load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match crate::daemon::read_ports_once(&config).await {
        Ok((kind, inventory)) => {
            let ports: Vec<pb::Port> = inventory
                .ports
                .iter()
                .map(crate::api::agent_v1::convert::port_to_pb)
                .collect();
            output::ports(kind, &ports, format);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_are_human_durations_or_seconds() {
        assert_eq!(parse_wait("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_wait("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_wait("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_wait("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_wait("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_wait("11m").unwrap_err().contains("10m"));
        assert!(parse_wait("soon").unwrap_err().contains("30s"));
        assert!(parse_wait("").is_err());
    }

    #[test]
    fn pkeys_are_hex_as_infiniband_tools_write_them() {
        assert_eq!(parse_pkey("0x0a12"), Ok(0x0a12));
        assert_eq!(parse_pkey("0X0A12"), Ok(0x0a12));
        assert_eq!(parse_pkey("0a12"), Ok(0x0a12));
        assert_eq!(parse_pkey("7ffe"), Ok(0x7ffe));
        assert_eq!(
            parse_pkey("1234"),
            Ok(0x1234),
            "bare digits are hex, never decimal"
        );
        assert_eq!(parse_pkey("012"), Ok(0x12));
        for bad in [
            "", "0x", "12345", "0x1g", "-1", "18z", "1.5", "0", "7fff", "0xffff",
        ] {
            assert!(parse_pkey(bad).is_err(), "{bad:?}");
        }
        let e = parse_pkey("0x8a12").unwrap_err();
        assert_eq!(
            e,
            PKeyArgError::MembershipBit {
                text: "0x8a12".into(),
                value: 0x8a12
            }
        );
        let e = parse_pkey("0x8000").unwrap_err();
        assert!(
            e.to_string().contains("only the full-membership bit"),
            "{e}"
        );
        assert!(!e.to_string().contains("give the base 0x0000"), "{e}");
        // The message says which base was meant.
        assert!(e.to_string().contains("0x0a12"), "{e}");
    }
}
