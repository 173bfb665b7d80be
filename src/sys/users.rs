//! User and group lookups for the unix socket's peer-credential policy (the credentials
//! themselves come from SO_PEERCRED through tokio's `UnixStream::peer_cred`).

use nix::unistd::{Gid, Group, User};

/// Resolves a group given by name or numeric gid.
pub fn group_id(name_or_gid: &str) -> Result<u32, String> {
    if let Ok(gid) = name_or_gid.parse::<u32>() {
        return Ok(gid);
    }
    match Group::from_name(name_or_gid) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("group {name_or_gid:?} does not exist")),
        Err(e) => Err(format!("looking up group {name_or_gid:?}: {e}")),
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
pub fn group_member_uids(gid: u32) -> Result<Vec<u32>, String> {
    let group = match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(g)) => g,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(format!("looking up group {gid}: {e}")),
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
        assert!(group_id("no-such-group-fabric").is_err());
        // nobody (65534) is no supplementary member of root's group.
        assert!(!group_member_uids(0).unwrap().contains(&65534));
        assert!(group_member_uids(4_000_000_000).unwrap().is_empty());
    }
}
