//! Repairing whatever OpenSM rejected, whenever it happened: what is kept beside the partitions
//! file and in the commit state so a rejection is found and repaired after a restart, and the
//! words an operator is shown.
//!
//! - The log mark ([`super::store::LogMark`]) is persisted with every commit state: a rejection
//!   OpenSM logged while the agent was down lies after it and is repaired at start.
//! - The bytes of the last file of the agent's that OpenSM rejected are kept as
//!   `.<name>.fabric-agent-rejected`: a restarted agent holds them back again
//!   ([`RejectedFile`]: written again at once only when they take away from the accepted file).
//! - An operator's rejected edit raises `PARTITIONS_FILE_REJECTED` with OpenSM's lines and the
//!   strict parser's line and reason, until the operator's part of the file changes again and
//!   OpenSM accepts the result.

use super::model::{Entry, MemberKind, PartitionsConf};
use super::parse::parse;
use super::region::split_region;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the bytes of the last file of the agent's that OpenSM rejected are kept.
pub fn rejected_bytes_path(partitions_file: &Path) -> PathBuf {
    let name = partitions_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "partitions.conf".into());
    partitions_file.with_file_name(format!(".{name}.fabric-agent-rejected"))
}

/// The operator's part of a file: everything outside the agent's region (the whole file when
/// its markers are broken).
pub fn operator_part(file: &[u8]) -> Vec<u8> {
    match split_region(file) {
        Ok(parts) => {
            let mut out = parts.before;
            out.extend_from_slice(&parts.after);
            out
        }
        Err(_) => file.to_vec(),
    }
}

/// Whether `file` only takes away from `accepted` (a file OpenSM accepted): the same operator
/// part, and every member of every entry is a member of an entry of `accepted` with the same
/// key, header flags and multicast groups, with the same or a wider membership there. Such a
/// file adds nothing OpenSM has not accepted, so OpenSM's verdict on it cannot be a rejection of
/// something it adds: a rejection of these bytes was not caused by them, and they are written
/// again (a release always goes through). `false` when either file does not parse.
pub fn takes_away_only(accepted: &[u8], file: &[u8]) -> bool {
    if operator_part(accepted) != operator_part(file) {
        return false;
    }
    let (Ok(old), Ok(new)) = (parse(accepted), parse(file)) else {
        return false;
    };
    new.entries.iter().all(|e| {
        e.members.iter().all(|m| {
            same_entries(&old, e).any(|a| {
                a.members
                    .iter()
                    .any(|o| o.ports == m.ports && breadth(o.kind) >= breadth(m.kind))
            })
        })
    })
}

/// The entries of `conf` with `entry`'s key, header flags and multicast groups.
fn same_entries<'a>(conf: &'a PartitionsConf, entry: &'a Entry) -> impl Iterator<Item = &'a Entry> {
    let same_groups = |a: &Entry| {
        a.multicast_groups.len() == entry.multicast_groups.len()
            && a.multicast_groups
                .iter()
                .zip(&entry.multicast_groups)
                .all(|(x, y)| x.mgid == y.mgid && x.flags == y.flags)
    };
    conf.entries
        .iter()
        .filter(move |a| a.pkey == entry.pkey && a.flags == entry.flags && same_groups(a))
}

/// How much a membership grants: limited, full, both (full and limited with
/// `allow_both_pkeys`).
fn breadth(kind: MemberKind) -> u8 {
    match kind {
        MemberKind::Limited => 0,
        MemberKind::Full => 1,
        MemberKind::Both => 2,
    }
}

/// The strict parser's verdict on a rejected file, with the line it names quoted (cut to 120
/// characters): what the operator needs to fix.
pub fn describe(file: &[u8]) -> String {
    match parse(file) {
        Ok(_) => "the strict parser accepts it".into(),
        Err(e) => {
            let quoted = usize::try_from(e.line)
                .ok()
                .filter(|n| *n > 0)
                .and_then(|n| file.split(|b| *b == b'\n').nth(n - 1))
                .map(|l| {
                    let text = String::from_utf8_lossy(l);
                    let text: String = text.trim_end_matches('\r').chars().take(120).collect();
                    format!(": {text:?}")
                })
                .unwrap_or_default();
            format!("line {}: {}{quoted}", e.line, e.message)
        }
    }
}

/// The first hold on bytes OpenSM rejected; it doubles with each rejection of the same bytes.
const REJECTED_HOLD_FIRST: Duration = Duration::from_secs(60);
/// The longest hold on bytes OpenSM rejected.
const REJECTED_HOLD_MAX: Duration = Duration::from_secs(600);

/// The last file OpenSM rejected, and until when it is held back.
///
/// OpenSM's verdict is a property of the bytes it reads, and the agent writes only bytes the
/// strict parser (OpenSM's own parser, re-implemented) accepts: a rejection of them is most
/// likely not caused by them (an error line of a sweep that read something else). Writing them
/// again opens a fail-open window if OpenSM does reject them, so:
/// - bytes that only take away from the last accepted file ([`takes_away_only`]: a release) are
///   written again at once: they add nothing OpenSM did not accept, and a release must go
///   through;
/// - other rejected bytes are held back: not written again before the hold ends (1 min, doubling
///   with each rejection of the same bytes in a row, at most 10 min), so a file OpenSM does
///   reject costs at most one fail-open window per hold, and a rejection not caused by the bytes
///   does not stall the node for good.
#[derive(Debug)]
pub struct RejectedFile {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Rejections of these bytes in a row.
    times: u32,
    /// The bytes are not written again before this (unless they only take away).
    hold_until: tokio::time::Instant,
}

impl RejectedFile {
    /// `bytes` rejected (again, when `earlier` held the same bytes).
    pub fn after(earlier: Option<RejectedFile>, bytes: Vec<u8>) -> RejectedFile {
        let times = earlier
            .filter(|e| e.bytes == bytes)
            .map_or(1, |e| e.times.saturating_add(1));
        let hold = REJECTED_HOLD_FIRST
            .saturating_mul(1 << (times - 1).min(16))
            .min(REJECTED_HOLD_MAX);
        RejectedFile {
            bytes,
            times,
            hold_until: tokio::time::Instant::now() + hold,
        }
    }

    /// Whether the hold still keeps `bytes` from being written (`accepted`: the last accepted
    /// file): the time left, `None` when they may be written.
    pub fn holds(&self, bytes: &[u8], accepted: Option<&[u8]>) -> Option<Duration> {
        if self.bytes != bytes || accepted.is_some_and(|a| takes_away_only(a, bytes)) {
            return None;
        }
        let left = self
            .hold_until
            .saturating_duration_since(tokio::time::Instant::now());
        (!left.is_zero()).then_some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_the_line_and_quotes_it() {
        let text = b"Default=0x7fff : ALL=full ;\nbroken=0x0c0c : 0xzz ;\n";
        let d = describe(text);
        assert!(d.starts_with("line 2: "), "{d}");
        assert!(d.contains("\"broken=0x0c0c : 0xzz ;\""), "{d}");
        assert_eq!(
            describe(b"Default=0x7fff : ALL=full ;\n"),
            "the strict parser accepts it"
        );
    }

    #[test]
    fn a_file_takes_away_only_when_each_member_was_accepted_as_wide() {
        use super::super::region::{BEGIN_MARKER, END_MARKER};
        let file = |region: &str| {
            format!("op=0x1 : ALL;\n{BEGIN_MARKER}\n{region}{END_MARKER}\n").into_bytes()
        };
        let accepted = file("t=0x2 : 0x10=full, 0x11 ;\nu=0x3 : 0x10 ;\n");
        for (region, only) in [
            ("", true),
            ("t=0x2 : 0x10=full ;\n", true),
            ("t=0x2 : 0x10, 0x11 ;\n", true),
            ("renamed=0x2 : 0x11 ;\nu=0x3 : 0x10 ;\n", true),
            ("t=0x2 : 0x11=full ;\n", false),
            ("t=0x2 : 0x12 ;\n", false),
            ("t=0x4 : 0x10 ;\n", false),
            ("t=0x2, ipoib : 0x10 ;\n", false),
            ("t=0x2 : 0xzz ;\n", false),
        ] {
            assert_eq!(takes_away_only(&accepted, &file(region)), only, "{region}");
        }
        let other_operator = format!("op=0x1 : ALL=full;\n{BEGIN_MARKER}\n{END_MARKER}\n");
        assert!(!takes_away_only(&accepted, other_operator.as_bytes()));
    }

    #[test]
    fn operator_part_drops_the_region() {
        use super::super::region::{BEGIN_MARKER, END_MARKER};
        let file = format!("op=0x1 : ALL;\n{BEGIN_MARKER}\nt=0x2 : ALL;\n{END_MARKER}\n# after\n");
        assert_eq!(operator_part(file.as_bytes()), b"op=0x1 : ALL;\n# after\n");
        assert_eq!(
            rejected_bytes_path(Path::new("/etc/opensm/partitions.conf")),
            Path::new("/etc/opensm/.partitions.conf.fabric-agent-rejected")
        );
    }
}
