//! User and group lookups for the unix socket's peer-credential policy (the credentials
//! themselves come from SO_PEERCRED through tokio's `UnixStream::peer_cred`).

use nix::unistd::{Gid, Group, User};

/// Why a group could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// No group has this name.
    #[error("group {0:?} does not exist")]
    NoSuchGroup(String),
    /// The group database could not be read.
    #[error("looking up group {group}: {source}")]
    Lookup {
        /// The group's name (quoted) or gid.
        group: String,
        /// What the lookup said.
        source: nix::Error,
    },
}

/// Resolves a group given by name or numeric gid.
pub fn group_id(name_or_gid: &str) -> Result<u32, GroupError> {
    if let Ok(gid) = name_or_gid.parse::<u32>() {
        return Ok(gid);
    }
    match Group::from_name(name_or_gid) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(GroupError::NoSuchGroup(name_or_gid.to_owned())),
        Err(source) => Err(GroupError::Lookup {
            group: format!("{name_or_gid:?}"),
            source,
        }),
    }
}

/// This process's effective uid and gid.
pub fn own_ids() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// The uids of the users listed as supplementary members of group `gid` (its member list in
/// the group database; users whose primary group it is are not listed there). Names that do
/// not resolve are skipped.
pub fn group_member_uids(gid: u32) -> Result<Vec<u32>, GroupError> {
    let group = match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(g)) => g,
        Ok(None) => return Ok(Vec::new()),
        Err(source) => {
            return Err(GroupError::Lookup {
                group: gid.to_string(),
                source,
            })
        }
    };
    Ok(group
        .mem
        .iter()
        .filter_map(|name| User::from_name(name).ok().flatten())
        .map(|u| u.uid.as_raw())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_resolve() {
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert_eq!(
            group_id("no-such-group-fabric"),
            Err(GroupError::NoSuchGroup("no-such-group-fabric".into()))
        );
        // nobody (65534) is no supplementary member of root's group.
        assert!(!group_member_uids(0).unwrap().contains(&65534));
        assert!(group_member_uids(4_000_000_000).unwrap().is_empty());
    }
}
