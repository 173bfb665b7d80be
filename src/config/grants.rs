//! `[grants]`: the control plane's signed grants (`fabric.grant.v1`). On the SM host (backend
//! `opensm`), `require = true` makes every key in a node's set need a valid, unconsumed grant for
//! that node, key and membership; on a node it makes every attach carry one. `keys` are the
//! control plane's Ed25519 public keys by id (several at once, for rotation).
//!
//! Without the section, grants are not required (today's behaviour for labs and demos): the
//! agent logs a loud warning at start, and `check-config` says so. Production configurations
//! set `require = true` (the packaged `config.toml` does).

use super::error::{invalid, ConfigError};
use crate::domain::{is_grant_id, FabricName, GrantKey, GrantKeys, GrantPolicy};
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

impl GrantsConfig {
    /// Checks the section and loads the keys (reading key files).
    pub(super) fn validate(&self, default_fabric: &FabricName) -> Result<GrantPolicy, ConfigError> {
        let fabric = match &self.fabric {
            Some(f) => FabricName::parse(f).map_err(|e| invalid("grants.fabric", e.to_string()))?,
            None => default_fabric.clone(),
        };
        let mut keys = Vec::new();
        for k in &self.keys {
            if !is_grant_id(&k.id) {
                return Err(invalid(
                    "grants.keys",
                    format!("key id {:?} is not 1-128 characters [A-Za-z0-9._:-]", k.id),
                ));
            }
            let text = match (&k.public_key, &k.public_key_file) {
                (Some(t), None) => t.clone(),
                (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| {
                    invalid(
                        "grants.keys",
                        format!("key {:?}: cannot read {}: {e}", k.id, path.display()),
                    )
                })?,
                _ => {
                    return Err(invalid(
                        "grants.keys",
                        format!(
                            "key {:?}: set exactly one of public_key, public_key_file",
                            k.id
                        ),
                    ))
                }
            };
            let mut key = decode_public_key(&k.id, &text).map_err(|e| invalid("grants.keys", e))?;
            key.not_before_unix_ms = unix_ms(&k.id, "not_before", &k.not_before)?;
            key.not_after_unix_ms = unix_ms(&k.id, "not_after", &k.not_after)?;
            if let (Some(b), Some(a)) = (key.not_before_unix_ms, key.not_after_unix_ms) {
                if b > a {
                    return Err(invalid(
                        "grants.keys",
                        format!("key {:?}: not_before is after not_after", k.id),
                    ));
                }
            }
            keys.push(key);
        }
        let keys = GrantKeys::new(keys)
            .map_err(|id| invalid("grants.keys", format!("key id {id:?} is listed twice")))?;
        if self.require && keys.is_empty() {
            return Err(invalid(
                "grants.keys",
                "require = true needs at least one [[grants.keys]] entry (the control plane's public key)",
            ));
        }
        Ok(GrantPolicy {
            require: self.require,
            fabric,
            keys,
        })
    }
}
