//! The store's mirror: a small side file next to the database (`state.redb.mirror`) that
//! repeats the store's id, its write counter, the newest event seq and the highest reserved
//! apply generation after every write. At open, a database whose id differs from the mirror's,
//! or whose counter is behind it, is not the store the agent last wrote: it was restored from a
//! copy (or replaced), and [`super::Store`] starts a new log epoch instead of reusing sequence
//! numbers and generations that were already handed out.
//!
//! The mirror is written after the database commit (temp file + fsync + rename + directory
//! fsync), so a crash in between leaves the database ahead of the mirror, which is not a
//! rollback. A restore of the whole directory, mirror included, is not detectable here; the
//! fabric side's newer generation is the evidence then (see the README's truth rules).

use super::StoreError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What the mirror holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MirrorState {
    /// The store's id (32 hex digits), created with the database and never changed.
    #[serde(with = "hex_u128")]
    pub store_id: u128,
    /// Write transactions committed so far.
    pub commits: u64,
    /// The newest event seq.
    pub last_seq: u64,
    /// The highest apply generation reserved (every generation up to it may have been sent).
    pub generation_reserved: u64,
}

/// The side file of one database.
pub(super) struct Mirror {
    path: PathBuf,
}

impl Mirror {
    /// The mirror of the database at `db`.
    pub fn of(db: &Path) -> Mirror {
        let mut name = db.file_name().unwrap_or_default().to_os_string();
        name.push(".mirror");
        Mirror {
            path: db.with_file_name(name),
        }
    }

    /// The mirror's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mirrored state; None when there is no side file yet.
    pub fn read(&self) -> Result<Option<MirrorState>, StoreError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError::Mirror {
                    path: self.path.clone(),
                    why: format!("does not decode ({e}); remove it only if the database beside it is the newest"),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Replaces the side file durably: temp file, fsync, rename, directory fsync.
    pub fn write(&self, state: &MirrorState) -> std::io::Result<()> {
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.write_all(&serde_json::to_vec(state).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Why a database is not the one the mirror describes, or None when it is.
pub(super) fn rolled_back(db: &MirrorState, mirror: &MirrorState) -> Option<String> {
    if db.store_id != mirror.store_id {
        return Some(format!(
            "the database is not the one last written here (store id {:032x}, the mirror names {:032x}): it was replaced",
            db.store_id, mirror.store_id
        ));
    }
    (db.commits < mirror.commits).then(|| {
        format!(
            "the database is older than the last one written here ({} of {} writes, events up to seq {} of {}): it was restored from a copy",
            db.commits, mirror.commits, db.last_seq, mirror.last_seq
        )
    })
}

mod hex_u128 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:032x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        let text = String::deserialize(d)?;
        u128::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(id: u128, commits: u64) -> MirrorState {
        MirrorState {
            store_id: id,
            commits,
            last_seq: commits,
            generation_reserved: 0,
        }
    }

    #[test]
    fn round_trips_and_detects_older_or_other_databases() {
        let dir = tempfile::tempdir().unwrap();
        let m = Mirror::of(&dir.path().join("state.redb"));
        assert_eq!(m.read().unwrap(), None);
        let s = state(7, 3);
        m.write(&s).unwrap();
        assert_eq!(m.read().unwrap(), Some(s));
        assert!(m.path().ends_with("state.redb.mirror"));
        assert_eq!(rolled_back(&state(7, 3), &s), None);
        assert_eq!(
            rolled_back(&state(7, 4), &s),
            None,
            "ahead is a crash, not a rollback"
        );
        assert!(rolled_back(&state(7, 2), &s).unwrap().contains("restored"));
        assert!(rolled_back(&state(8, 9), &s).unwrap().contains("replaced"));
        std::fs::write(m.path(), b"{").unwrap();
        assert!(matches!(m.read(), Err(StoreError::Mirror { .. })));
    }
}
