//! User and group lookups for the unix socket's peer-credential policy (the credentials
//! themselves come from SO_PEERCRED through tokio's `UnixStream::peer_cred`).

use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
use std::ffi::CString;

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

/// Whether the user `uid` (whose primary group at connect time was `primary_gid`) is a member
/// of `gid`, counting the supplementary groups of its passwd entry.
pub fn in_group(uid: u32, primary_gid: u32, gid: u32) -> bool {
    if primary_gid == gid {
        return true;
    }
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(uid)) else {
        return false;
    };
    let Ok(name) = CString::new(user.name) else {
        return false;
    };
    getgrouplist(&name, Gid::from_raw(primary_gid))
        .map(|groups| groups.iter().any(|g| g.as_raw() == gid))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_resolve() {
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(group_id("no-such-group-fabric").is_err());
        assert!(in_group(0, 0, 0));
        // nobody (65534) is not in root's group.
        assert!(!in_group(65534, 65534, 0));
    }
}
