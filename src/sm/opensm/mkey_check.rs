//! The fabric's own protection of P_Key tables, on an OpenSM SM host: OpenSM's M_Key settings
//! (`m_key`, `m_key_protection_level`, `m_key_lease_period`, `m_key_per_port` in
//! `opensm.conf`), reported by `doctor`.
//!
//! The agent's authority model holds only if a port's P_Key table is written by the SM alone.
//! With M_Key 0 (OpenSM's default) a port accepts a SubnSet from anyone, so root on a tenant
//! host can write its own port's P_Key table with its own SMPs and join any partition,
//! whatever the partitions file says; with protection level 0 a SubnGet returns the M_Key to
//! anyone, so it protects nothing either. Either is reported as a WARN naming the setting and
//! what to do; the HCA's SMP firewall (firmware that drops SMPs from non-SM hosts) also closes
//! it, which this check cannot see.

use super::log_check::conf_keys;
use super::OpenSmConfig;
use std::path::{Path, PathBuf};

/// OpenSM's configuration file when `opensm_conf` is not set.
const DEFAULT_CONF: &str = "/etc/opensm/opensm.conf";

/// One line of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MKeyFinding {
    /// Something an operator must act on (or could not be verified).
    pub warn: bool,
    /// What was found and, for a WARN, what to do.
    pub detail: String,
}

impl MKeyFinding {
    fn ok(detail: String) -> MKeyFinding {
        MKeyFinding {
            warn: false,
            detail,
        }
    }
    fn warn(detail: String) -> MKeyFinding {
        MKeyFinding { warn: true, detail }
    }
}

/// Reads OpenSM's configuration (`opensm_conf`, else `/etc/opensm/opensm.conf`) and judges
/// its M_Key settings; a file that cannot be read is a WARN (not verified).
pub fn verify(config: &OpenSmConfig) -> Vec<MKeyFinding> {
    let path: PathBuf = config
        .opensm_conf
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONF));
    match std::fs::read_to_string(&path) {
        Ok(text) => judge(&text, &path),
        Err(e) => vec![MKeyFinding::warn(format!(
            "OpenSM's M_Key settings not verified: {}: {e}; set opensm_conf to OpenSM's configuration file",
            path.display()
        ))],
    }
}

/// A number as OpenSM's configuration writes it (`0x...` or decimal).
fn number(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

/// The M_Key settings of OpenSM's configuration `text` (read from `origin`), judged. Keys
/// absent take OpenSM's defaults (all 0).
pub fn judge(text: &str, origin: &Path) -> Vec<MKeyFinding> {
    let keys = conf_keys(text);
    let origin = origin.display();
    let mut out = Vec::new();
    let value = |key: &str| -> Result<u64, String> {
        match keys.get(key) {
            None => Ok(0),
            Some(v) => number(v).ok_or_else(|| v.clone()),
        }
    };
    let bad = |key: &str, v: String| {
        MKeyFinding::warn(format!(
            "{origin}: {key} {v:?} is not a number OpenSM reads; set it (see the M_Key advice)"
        ))
    };
    let (m_key, level, lease) = match (
        value("m_key"),
        value("m_key_protection_level"),
        value("m_key_lease_period"),
    ) {
        (Ok(k), Ok(l), Ok(p)) => (k, l, p),
        (Err(v), _, _) => return vec![bad("m_key", v)],
        (_, Err(v), _) => return vec![bad("m_key_protection_level", v)],
        (_, _, Err(v)) => return vec![bad("m_key_lease_period", v)],
    };
    let per_port = keys
        .get("m_key_per_port")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if m_key == 0 {
        out.push(MKeyFinding::warn(format!(
            "{origin}: m_key is 0 (OpenSM's default): ports accept SubnSet from any host, so root on a tenant host can write its own port's P_Key table and join any partition, whatever the partitions file says; set m_key to a secret non-zero value (m_key_per_port TRUE derives one per port), m_key_protection_level 2, and restart OpenSM, or make sure every HCA's firmware drops SMPs from non-SM hosts (SMP firewall)"
        )));
    }
    match level {
        0 => out.push(MKeyFinding::warn(format!(
            "{origin}: m_key_protection_level is 0: any host's SubnGet(PortInfo) returns the M_Key, so the key protects nothing; set m_key_protection_level 2 (1 hides the key from Get, 2 also refuses Get without it)"
        ))),
        1 | 2 => {}
        other => out.push(MKeyFinding::warn(format!(
            "{origin}: m_key_protection_level {other} is not a level (0-2); set 2"
        ))),
    }
    if out.is_empty() {
        out.push(MKeyFinding::ok(format!(
            "{origin}: m_key set ({}), m_key_protection_level {level}, m_key_lease_period {lease}{}",
            if per_port { "per port" } else { "one key" },
            if lease == 0 { " (protection never lapses)" } else { " s" }
        )));
    } else {
        out.push(MKeyFinding::ok(format!(
            "{origin}: m_key {}, m_key_protection_level {level}, m_key_lease_period {lease}",
            if m_key == 0 { "0" } else { "set" }
        )));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warns(text: &str) -> Vec<String> {
        judge(text, Path::new("/etc/opensm/opensm.conf"))
            .into_iter()
            .filter(|f| f.warn)
            .map(|f| f.detail)
            .collect()
    }

    #[test]
    fn opensm_defaults_are_two_warns_naming_the_settings() {
        for text in [
            "",
            "m_key 0x0000000000000000\nm_key_protection_level 0\nm_key_lease_period 0\n",
        ] {
            let w = warns(text);
            assert_eq!(w.len(), 2, "{w:?}");
            assert!(
                w[0].contains("m_key is 0") && w[0].contains("P_Key table"),
                "{w:?}"
            );
            assert!(w[0].contains("SMP firewall"), "{w:?}");
            assert!(w[1].contains("m_key_protection_level is 0"), "{w:?}");
        }
    }

    #[test]
    fn a_key_with_protection_passes_and_each_gap_is_named() {
        let good = "m_key 0x1234abcd00000001\nm_key_protection_level 2\nm_key_lease_period 60\n";
        assert!(warns(good).is_empty());
        let all = judge(good, Path::new("/x"));
        assert!(
            all[0].detail.contains("m_key_protection_level 2"),
            "{all:?}"
        );
        let unprotected = good.replace("level 2", "level 0");
        assert_eq!(warns(&unprotected).len(), 1);
        assert!(warns(&unprotected)[0].contains("m_key_protection_level is 0"));
        let zero = good.replace("0x1234abcd00000001", "0");
        assert_eq!(warns(&zero).len(), 1);
        assert!(warns(&zero)[0].contains("m_key is 0"));
        // The last line wins, as in OpenSM.
        assert!(warns(&format!("{good}m_key 0x0\n"))[0].contains("m_key is 0"));
        assert!(warns(&good.replace("level 2", "level 7"))[0].contains("not a level"));
        assert!(warns(&good.replace("0x1234abcd00000001", "zz"))[0].contains("not a number"));
    }

    #[test]
    fn an_unreadable_configuration_is_not_verified() {
        let dir = tempfile::tempdir().unwrap();
        let config = OpenSmConfig {
            opensm_conf: Some(dir.path().join("missing.conf")),
            ..OpenSmConfig::default()
        };
        let f = verify(&config);
        assert!(f.len() == 1 && f[0].warn && f[0].detail.contains("not verified"));
        std::fs::write(
            dir.path().join("missing.conf"),
            "m_key 0x5\nm_key_protection_level 1\n",
        )
        .unwrap();
        assert!(verify(&config).iter().all(|f| !f.warn));
    }
}
