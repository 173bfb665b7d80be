//! `[grants]`: the control plane's signed grants (`fabric.grant.v1`). On the SM host (backend
//! `opensm`), `require = true` makes every key in a node's set need a valid, unconsumed grant for
//! that node, key and membership; on a node it makes every attach carry one. `keys` are the
//! control plane's Ed25519 public keys by id (several at once, for rotation).
//!
//! Without the section, grants are not required (today's behaviour for labs and demos): the
//! agent logs a loud warning at start, and `check-config` says so. Production configurations
//! set `require = true` (the packaged `config.toml` does).

use super::error::{invalid, ConfigError};
use crate::domain::{is_grant_id, FabricName, GrantKey, GrantKeys, GrantLifetime, GrantPolicy};
use base64::Engine;
use serde::Deserialize;
use std::path::PathBuf;

/// `[grants]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsConfig {
    /// Whether keys need grants (SM host) and attaches need one (node). Default false.
    #[serde(default)]
    pub require: bool,
    /// The fabric grants must name; defaults to the top-level `fabric`.
    #[serde(default)]
    pub fabric: Option<String>,
    /// The control plane's public keys.
    #[serde(default)]
    pub keys: Vec<GrantKeyConfig>,
    /// How long after its issue a grant may still be admitted for the first time (a duration,
    /// e.g. `"1h"`; default `"1h"`). A grant already admitted for its node keeps
    /// working; an older never-used one is refused.
    #[serde(default)]
    pub max_age: Option<String>,
    /// The clock disagreement tolerated between the control plane (which stamps the issue
    /// time) and this host (default `"5m"`).
    #[serde(default)]
    pub max_clock_skew: Option<String>,
}

/// `max_age` when not set: a grant is signed when the control plane decides an attach and
/// presented at once; an hour covers a node agent's retries and restarts.
pub const DEFAULT_MAX_AGE: &str = "1h";
/// `max_clock_skew` when not set.
pub const DEFAULT_MAX_CLOCK_SKEW: &str = "5m";
/// The longest `max_age` accepted.
pub const MAX_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// The longest `max_clock_skew` accepted.
pub const MAX_MAX_CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(3600);

/// Parses a `[grants]` duration and checks it against `min..=max`.
fn duration(
    field: &'static str,
    text: Option<&str>,
    default: &str,
    min: std::time::Duration,
    max: std::time::Duration,
) -> Result<u64, ConfigError> {
    let t = text.unwrap_or(default);
    let d = humantime::parse_duration(t).map_err(|e| {
        invalid(
            field,
            format!("{t:?} is not a duration (e.g. \"1h\", \"30m\"): {e}"),
        )
    })?;
    if d < min || d > max {
        return Err(invalid(
            field,
            format!(
                "{t:?} is outside {}..={}",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One `[[grants.keys]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantKeyConfig {
    /// The key id grants name (1-128 characters `[A-Za-z0-9._:-]`).
    pub id: String,
    /// The 32-byte Ed25519 public key, base64 (standard alphabet).
    #[serde(default)]
    pub public_key: Option<String>,
    /// A file holding the base64 public key (what `fabric-agent grant keygen` writes).
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
    /// Grants issued before this (RFC 3339) are refused.
    #[serde(default)]
    pub not_before: Option<String>,
    /// Grants issued after this (RFC 3339) are refused: a retired key.
    #[serde(default)]
    pub not_after: Option<String>,
}

/// Decodes a base64 Ed25519 public key (surrounding whitespace ignored).
pub fn decode_public_key(id: &str, text: &str) -> Result<GrantKey, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("key {id:?}: not base64: {e}"))?;
    GrantKey::from_bytes(id, &bytes)
        .ok_or_else(|| format!("key {id:?}: not a 32-byte Ed25519 public key"))
}

fn unix_ms(id: &str, field: &str, text: &Option<String>) -> Result<Option<u64>, ConfigError> {
    let Some(t) = text else { return Ok(None) };
    let at = humantime::parse_rfc3339(t).map_err(|e| {
        invalid(
            "grants.keys",
            format!("key {id:?}: {field} {t:?} is not an RFC 3339 time: {e}"),
        )
    })?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Ok(Some(u64::try_from(ms).unwrap_or(u64::MAX)))
}

/// The defaults of `max_age` and `max_clock_skew`.
fn default_lifetime() -> GrantLifetime {
    GrantLifetime {
        max_age_ms: 3_600_000,
        max_clock_skew_ms: 300_000,
    }
}

/// `[grants]` checked: everything but the key files, which [`GrantsSettings::load`] reads (at
/// start and in `check-config`'s host checks, like TLS files; `check-config --syntax` does not).
#[derive(Debug, Clone)]
pub struct GrantsSettings {
    /// Whether grants are required.
    pub require: bool,
    /// The fabric grants must name.
    pub fabric: FabricName,
    /// A grant's first-admission lifetime and the clock skew tolerated.
    pub lifetime: GrantLifetime,
    keys: Vec<GrantKeyConfig>,
}

impl GrantsSettings {
    /// Grants not required, no keys.
    pub fn off(fabric: FabricName) -> GrantsSettings {
        GrantsSettings {
            require: false,
            fabric,
            lifetime: default_lifetime(),
            keys: Vec::new(),
        }
    }

    /// Reads the key files and builds the policy.
    pub fn load(&self) -> Result<GrantPolicy, ConfigError> {
        let mut keys = Vec::new();
        for k in &self.keys {
            keys.push(k.load(true)?);
        }
        let keys = GrantKeys::new(keys)
            .map_err(|id| invalid("grants.keys", format!("key id {id:?} is listed twice")))?
            .with_lifetime(self.lifetime);
        Ok(GrantPolicy {
            require: self.require,
            fabric: self.fabric.clone(),
            keys,
        })
    }
}

impl GrantKeyConfig {
    /// The key, with its file read when `read_files`; without, a file key is only checked for
    /// its other fields (`None`).
    fn load(&self, read_files: bool) -> Result<GrantKey, ConfigError> {
        let text = match (&self.public_key, &self.public_key_file) {
            (Some(t), None) => t.clone(),
            (None, Some(path)) if read_files => std::fs::read_to_string(path).map_err(|e| {
                invalid(
                    "grants.keys",
                    format!("key {:?}: cannot read {}: {e}", self.id, path.display()),
                )
            })?,
            (None, Some(_)) => {
                // A placeholder point for the syntax check: the file is read at start.
                base64::engine::general_purpose::STANDARD.encode(
                    ed25519_dalek::SigningKey::from_bytes(&[1; 32])
                        .verifying_key()
                        .as_bytes(),
                )
            }
            _ => {
                return Err(invalid(
                    "grants.keys",
                    format!(
                        "key {:?}: set exactly one of public_key, public_key_file",
                        self.id
                    ),
                ))
            }
        };
        let mut key = decode_public_key(&self.id, &text).map_err(|e| invalid("grants.keys", e))?;
        key.not_before_unix_ms = unix_ms(&self.id, "not_before", &self.not_before)?;
        key.not_after_unix_ms = unix_ms(&self.id, "not_after", &self.not_after)?;
        if let (Some(b), Some(a)) = (key.not_before_unix_ms, key.not_after_unix_ms) {
            if b > a {
                return Err(invalid(
                    "grants.keys",
                    format!("key {:?}: not_before is after not_after", self.id),
                ));
            }
        }
        Ok(key)
    }
}

impl GrantsConfig {
    /// Checks the section (ids, one key source each, inline keys, times; key files are read by
    /// [`GrantsSettings::load`]).
    pub(super) fn validate(
        &self,
        default_fabric: &FabricName,
    ) -> Result<GrantsSettings, ConfigError> {
        let fabric = match &self.fabric {
            Some(f) => FabricName::parse(f).map_err(|e| invalid("grants.fabric", e.to_string()))?,
            None => default_fabric.clone(),
        };
        let mut seen = std::collections::BTreeSet::new();
        for k in &self.keys {
            if !is_grant_id(&k.id) {
                return Err(invalid(
                    "grants.keys",
                    format!("key id {:?} is not 1-128 characters [A-Za-z0-9._:-]", k.id),
                ));
            }
            if !seen.insert(k.id.as_str()) {
                return Err(invalid(
                    "grants.keys",
                    format!("key id {:?} is listed twice", k.id),
                ));
            }
            k.load(false)?;
        }
        if self.require && self.keys.is_empty() {
            return Err(invalid(
                "grants.keys",
                "require = true needs at least one [[grants.keys]] entry (the control plane's public key)",
            ));
        }
        let lifetime = GrantLifetime {
            max_age_ms: duration(
                "grants.max_age",
                self.max_age.as_deref(),
                DEFAULT_MAX_AGE,
                std::time::Duration::from_secs(1),
                MAX_MAX_AGE,
            )?,
            max_clock_skew_ms: duration(
                "grants.max_clock_skew",
                self.max_clock_skew.as_deref(),
                DEFAULT_MAX_CLOCK_SKEW,
                std::time::Duration::ZERO,
                MAX_MAX_CLOCK_SKEW,
            )?,
        };
        Ok(GrantsSettings {
            require: self.require,
            fabric,
            lifetime,
            keys: self.keys.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(extra: &str) -> Result<GrantsSettings, ConfigError> {
        let c: GrantsConfig = toml::from_str(extra).unwrap();
        c.validate(&FabricName::parse("fab1").unwrap())
    }

    #[test]
    fn the_lifetime_defaults_and_is_bounded() {
        let d = section("").unwrap().lifetime;
        assert_eq!((d.max_age_ms, d.max_clock_skew_ms), (3_600_000, 300_000));
        let s = section("max_age = \"2h\"\nmax_clock_skew = \"30s\"\n").unwrap();
        assert_eq!(
            (s.lifetime.max_age_ms, s.lifetime.max_clock_skew_ms),
            (7_200_000, 30_000)
        );
        for (bad, field) in [
            ("max_age = \"0s\"", "grants.max_age"),
            ("max_age = \"30days\"", "grants.max_age"),
            ("max_age = \"soon\"", "grants.max_age"),
            ("max_clock_skew = \"2h\"", "grants.max_clock_skew"),
        ] {
            let e = section(bad).unwrap_err().to_string();
            assert!(e.contains(field), "{bad}: {e}");
        }
        assert_eq!(
            section("").unwrap().load().unwrap().keys.lifetime(),
            Some(d)
        );
    }
}
