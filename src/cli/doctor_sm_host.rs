//! The SM host's own checks for `doctor` (and, for the unit binding, `check-config`): its
//! OpenSM's role (a dead OpenSM is a FAIL naming the nodes it blocks), and whether OpenSM's
//! systemd unit is bound to the agent (`BindsTo=` and `After=` `fabric-agent.service`), so that
//! OpenSM never starts, or keeps running, without the agent that keeps its file current.

use super::verdict::{Check, Verdict};
use crate::proto::agent as pb;
use std::path::{Path, PathBuf};

/// The agent's unit.
pub const AGENT_UNIT: &str = "fabric-agent.service";
/// OpenSM's per-port unit (Debian's `opensm` package: `opensm@<port GUID>.service`).
pub const OPENSM_UNIT: &str = "opensm@.service";
/// The drop-in directory of OpenSM's per-port unit.
pub const DROP_IN_DIR: &str = "/etc/systemd/system/opensm@.service.d";
/// The drop-in the project ships for OpenSM's unit (`systemd/opensm-fabric-agent.conf`).
pub const DROP_IN: &str = "/etc/systemd/system/opensm@.service.d/fabric-agent.conf";

/// The OpenSM role line: FAIL when this host's OpenSM is not running and that blocks the nodes
/// (the condition's detail names them); WARN when it is proven not running, so this host's
/// writes are confirmed without it and nothing waits on it (the fabric has lost one SM's
/// redundancy); OK otherwise.
pub fn role(checks: &mut Vec<Check>, h: &pb::SmHostStatus, conditions: &[pb::Condition]) {
    if h.role == "not running" {
        let blocked = conditions
            .iter()
            .find(|c| c.kind == "OPENSM_NOT_RUNNING")
            .map_or_else(|| h.role_fallback_reason.clone(), |c| c.detail.clone());
        let verdict = if blocked.contains("does not block ACTIVE or RELEASED") {
            Verdict::Warn
        } else {
            Verdict::Fail
        };
        checks.push(Check::new(verdict, "opensm", blocked));
        return;
    }
    let source = match h.role_source.as_str() {
        "sminfo" => "SMInfo".to_owned(),
        "" => "unknown source".to_owned(),
        _ => format!("fallback: OpenSM's log; {}", h.role_fallback_reason),
    };
    checks.push(Check::new(
        Verdict::Ok,
        "opensm",
        format!("{} ({source})", h.role),
    ));
}

/// Where OpenSM's unit is read from.
pub enum UnitSource {
    /// systemd's view of the loaded `opensm@*.service` units when systemd runs and has any,
    /// else the drop-in directory.
    System,
    /// Given texts (tests).
    #[cfg(test)]
    Given {
        /// Per loaded unit: its name and `systemctl show -p BindsTo -p After ...` output.
        shown: Vec<(String, String)>,
        /// The drop-in directory.
        drop_in_dir: PathBuf,
    },
}

/// How OpenSM's unit stands towards the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// `BindsTo=` and `After=` the agent.
    Bound(String),
    /// Read, and lacking the binding.
    Unbound(String),
    /// Not readable here (no systemd instance, no drop-in).
    Unknown(String),
}

/// Judges `systemctl show` output (`Key=value` lines).
pub fn judge_show(unit: &str, show: &str) -> Binding {
    let prop = |key: &str| {
        show.lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| *k == key)
            .flat_map(|(_, v)| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let binds = prop("BindsTo").iter().any(|u| u == AGENT_UNIT);
    let after = prop("After").iter().any(|u| u == AGENT_UNIT);
    let requires = prop("Requires")
        .iter()
        .chain(prop("Requisite").iter())
        .any(|u| u == AGENT_UNIT);
    describe(binds, after, requires, &format!("systemctl show {unit}"))
}

/// Judges a drop-in file's text (`[Unit]` directives).
pub fn judge_drop_in(text: &str, path: &Path) -> Binding {
    let mut binds = false;
    let mut after = false;
    let mut requires = false;
    for line in text.lines().map(str::trim) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let names = value.split_whitespace().any(|u| u == AGENT_UNIT);
        match key.trim() {
            "BindsTo" => binds |= names,
            "After" => after |= names,
            "Requires" | "Requisite" => requires |= names,
            _ => {}
        }
    }
    describe(binds, after, requires, &path.display().to_string())
}

fn describe(binds: bool, after: bool, requires: bool, from: &str) -> Binding {
    if binds && after {
        let also = if requires { ", Requires" } else { "" };
        return Binding::Bound(format!(
            "{OPENSM_UNIT} is bound to {AGENT_UNIT} (BindsTo, After{also}; {from})"
        ));
    }
    let mut lacking = Vec::new();
    if !binds {
        lacking.push(format!("BindsTo={AGENT_UNIT}"));
    }
    if !after {
        lacking.push(format!("After={AGENT_UNIT}"));
    }
    Binding::Unbound(format!(
        "{OPENSM_UNIT} lacks {} ({from}): OpenSM can start, or keep running, while the agent that keeps its partitions file current is failed or not caught up, and read a stale file; install the drop-in {DROP_IN} (packaging: systemd/opensm-fabric-agent.conf)",
        lacking.join(" and ")
    ))
}

/// The loaded `opensm@*.service` units and their `systemctl show` output, when systemd runs.
fn shown_units() -> Vec<(String, String)> {
    if !Path::new("/run/systemd/system").exists() {
        return Vec::new();
    }
    let systemctl = |args: &[&str]| {
        std::process::Command::new("systemctl")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let list = systemctl(&[
        "list-units",
        "--all",
        "--plain",
        "--no-legend",
        "opensm@*.service",
    ]);
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|unit| {
            let show = systemctl(&[
                "show",
                unit,
                "-p",
                "BindsTo",
                "-p",
                "After",
                "-p",
                "Requires",
                "-p",
                "Requisite",
            ]);
            (unit.to_owned(), show)
        })
        .collect()
}

/// Reads OpenSM's unit binding from `source`: every loaded instance must be bound; without
/// one, the drop-ins of the template decide.
pub fn binding(source: &UnitSource) -> Binding {
    let (shown, dir) = match source {
        UnitSource::System => (shown_units(), PathBuf::from(DROP_IN_DIR)),
        #[cfg(test)]
        UnitSource::Given { shown, drop_in_dir } => (shown.clone(), drop_in_dir.clone()),
    };
    if !shown.is_empty() {
        let judged: Vec<Binding> = shown.iter().map(|(u, s)| judge_show(u, s)).collect();
        return judged
            .iter()
            .find(|b| !matches!(b, Binding::Bound(_)))
            .unwrap_or(&judged[0])
            .clone();
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "conf"));
    files.sort();
    if files.is_empty() {
        return Binding::Unknown(format!(
            "systemd shows no {OPENSM_UNIT} instance here and {} holds no drop-in: cannot tell whether OpenSM is bound to {AGENT_UNIT} (install {DROP_IN})",
            dir.display()
        ));
    }
    let text: String = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect::<Vec<_>>()
        .join("\n");
    judge_drop_in(&text, &dir)
}

/// The doctor line for the binding: FAIL when read and unbound, WARN when unknown.
pub fn opensm_unit(checks: &mut Vec<Check>, source: &UnitSource) {
    let (verdict, detail) = match binding(source) {
        Binding::Bound(d) => (Verdict::Ok, d),
        Binding::Unbound(d) => (Verdict::Fail, d),
        Binding::Unknown(d) => (Verdict::Warn, d),
    };
    checks.push(Check::new(verdict, "opensm unit", detail));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_drop_in_binds_opensm_to_the_agent() {
        let shipped = include_str!("../../systemd/opensm-fabric-agent.conf");
        let path = Path::new(DROP_IN);
        assert!(matches!(judge_drop_in(shipped, path), Binding::Bound(_)));
        // The documented Wants= drop-in does not.
        let wants = "[Unit]\nAfter=fabric-agent.service\nWants=fabric-agent.service\n";
        match judge_drop_in(wants, path) {
            Binding::Unbound(d) => assert!(d.contains("BindsTo=fabric-agent.service"), "{d}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn systemctl_show_is_judged() {
        let unit = "opensm@0x2c90300000001.service";
        let bound = "BindsTo=fabric-agent.service\nAfter=network.target fabric-agent.service\nRequires=\nRequisite=\n";
        assert!(matches!(judge_show(unit, bound), Binding::Bound(_)));
        let unbound =
            "BindsTo=\nAfter=network.target fabric-agent.service\nRequires=\nRequisite=\n";
        let dir = tempfile::tempdir().unwrap();
        let one_unbound = UnitSource::Given {
            shown: vec![
                (unit.into(), bound.into()),
                ("opensm@0x2.service".into(), unbound.into()),
            ],
            drop_in_dir: dir.path().to_owned(),
        };
        match binding(&one_unbound) {
            Binding::Unbound(d) => assert!(d.contains("opensm@0x2.service"), "{d}"),
            other => panic!("{other:?}"),
        }
        // No instance loaded: the drop-in directory decides.
        let from_dir = UnitSource::Given {
            shown: Vec::new(),
            drop_in_dir: dir.path().to_owned(),
        };
        assert!(matches!(binding(&from_dir), Binding::Unknown(_)));
        std::fs::write(
            dir.path().join("wants.conf"),
            "[Unit]\nAfter=fabric-agent.service\nWants=fabric-agent.service\n",
        )
        .unwrap();
        assert!(matches!(binding(&from_dir), Binding::Unbound(_)));
        std::fs::write(
            dir.path().join("fabric-agent.conf"),
            include_str!("../../systemd/opensm-fabric-agent.conf"),
        )
        .unwrap();
        assert!(matches!(binding(&from_dir), Binding::Bound(_)));
    }

    #[test]
    fn a_dead_opensm_fails_naming_the_nodes() {
        let mut checks = Vec::new();
        let h = pb::SmHostStatus {
            role: "not running".into(),
            role_source: "not-running".into(),
            role_fallback_reason: "OpenSM's pid 9 is gone".into(),
            ..Default::default()
        };
        let c = pb::Condition {
            kind: "OPENSM_NOT_RUNNING".into(),
            detail: "this host's OpenSM is not running (pid 9 is gone): it blocks ACTIVE and RELEASED on node1".into(),
                    };
        role(&mut checks, &h, std::slice::from_ref(&c));
        assert_eq!(checks[0].verdict, Verdict::Fail);
        assert!(checks[0].detail.contains("node1"));
        // Proven not running: this host confirms its writes without OpenSM; a warning.
        let proven = pb::Condition {
            detail: "this host's OpenSM is not running, proven (no SMInfo answer; pid 9 gone): this host still acknowledges writes, so it does not block ACTIVE or RELEASED".into(),
            ..c
        };
        let mut checks = Vec::new();
        role(&mut checks, &h, &[proven]);
        assert_eq!(checks[0].verdict, Verdict::Warn);
    }
}
