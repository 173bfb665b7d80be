//! The members of one partition as OpenSM's last accepted partitions file names them: the
//! fallback view for `ListPartitionMembers` when the SA cannot be asked (source
//! `partitions-file-fallback`; see [`super::sa_members`]). Pure: parses bytes.

use super::model::{MemberKind, PortSet};
use super::parse::parse;
use crate::domain::{Guid, PKey};

/// One port the file puts in the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMember {
    /// The port.
    pub guid: Guid,
    /// Full membership (`both` counts as full).
    pub full: bool,
}

/// The ports named by GUID in every entry of `pkey` (group members such as `ALL_CAS` are not
/// ports and are not listed). `None` when the file does not parse.
pub fn members_of(file: &[u8], pkey: PKey) -> Option<Vec<FileMember>> {
    let conf = parse(file).ok()?;
    let mut out: Vec<FileMember> = Vec::new();
    for entry in conf
        .entries
        .iter()
        .filter(|e| e.pkey & 0x7fff == pkey.base())
    {
        for m in &entry.members {
            if let PortSet::Guid(guid) = m.ports {
                let full = m.kind != MemberKind::Limited;
                match out.iter_mut().find(|o| o.guid == guid) {
                    Some(o) => o.full |= full,
                    None => out.push(FileMember { guid, full }),
                }
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_guid_members_of_one_key() {
        let file = b"Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n\
            t1=0x0a11 : 0x0002c903000e0b71=full, 0x0002c903000e0b72=limited ;\n\
            t2=0x0b22 : 0x0002c903000e0b73=full ;\n";
        let m = members_of(file, PKey::new(0x0a11).unwrap()).unwrap();
        assert_eq!(m.len(), 2);
        assert!(m[0].full && !m[1].full);
        assert_eq!(
            members_of(file, PKey::new(0x0c33).unwrap()).unwrap(),
            vec![]
        );
        assert!(members_of(b"t1=0x0a11 : nonsense", PKey::new(0x0a11).unwrap()).is_none());
    }
}
