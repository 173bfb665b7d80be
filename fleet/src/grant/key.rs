//! Ed25519 signing-key files: a 32-byte seed, raw or base64 text, readable by its owner only.

use base64::Engine;
use rand::RngCore;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or created.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Group or others may read or write the file.
    #[error("{}: mode {mode:04o} lets group or others read the signing key; chmod 600 it", .path.display())]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The content is neither 32 raw bytes nor base64 of 32 bytes.
    #[error("{}: not an Ed25519 seed (32 raw bytes or their base64)", .path.display())]
    Format {
        /// The file.
        path: PathBuf,
    },
}

/// One signing key as configured: its id and seed file.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKeyFile {
    /// The key id verifiers know the public key by.
    pub id: String,
    /// The seed file.
    pub file: PathBuf,
}

/// Reads a seed file, refusing one group or others can read or write.
pub fn load_seed(path: &Path) -> Result<[u8; 32], KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Mode {
            path: path.to_owned(),
            mode,
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    parse_seed(&bytes).ok_or_else(|| KeyError::Format {
        path: path.to_owned(),
    })
}

/// 32 raw bytes, or base64 (standard alphabet) of 32 bytes with surrounding whitespace.
fn parse_seed(bytes: &[u8]) -> Option<[u8; 32]> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(text.trim()) {
            if let Ok(seed) = <[u8; 32]>::try_from(decoded.as_slice()) {
                return Some(seed);
            }
        }
    }
    <[u8; 32]>::try_from(bytes).ok()
}

/// A fresh random seed from the operating system's generator.
pub fn generate_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    // ThreadRng is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut seed);
    seed
}

/// Writes a seed as base64 into a new file with mode 0600 (never overwrites).
pub fn write_seed(path: &Path, seed: &[u8; 32]) -> Result<(), KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    let text = base64::engine::general_purpose::STANDARD.encode(seed);
    file.write_all(format!("{text}\n").as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn seed_round_trips_and_mode_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k1.seed");
        let seed = generate_seed();
        write_seed(&path, &seed).unwrap();
        assert_eq!(load_seed(&path).unwrap(), seed);
        assert!(matches!(write_seed(&path, &seed), Err(KeyError::Io { .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            load_seed(&path),
            Err(KeyError::Mode { mode: 0o640, .. })
        ));
    }

    #[test]
    fn raw_seed_is_accepted_and_garbage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("raw");
        std::fs::write(&raw, [7u8; 32]).unwrap();
        std::fs::set_permissions(&raw, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_seed(&raw).unwrap(), [7u8; 32]);
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "not a key\n").unwrap();
        std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(matches!(load_seed(&bad), Err(KeyError::Format { .. })));
    }
}
