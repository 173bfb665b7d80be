//! Repairing whatever OpenSM rejected, whenever it happened: what is kept beside the partitions
//! file and in the commit state so a rejection is found and repaired after a restart, and the
//! words an operator is shown.
//!
//! - The log mark ([`super::store::LogMark`]) is persisted with every commit state: a rejection
//!   OpenSM logged while the agent was down lies after it and is repaired at start.
//! - The bytes of the last file of the agent's that OpenSM rejected are kept as
//!   `.<name>.fabric-agent-rejected`: a restarted agent holds back again what they add to the
//!   accepted file ([`RejectedFile`]: written again at once only when they take away from it;
//!   every other change is written without the held additions meanwhile).
//! - An operator's rejected edit raises `PARTITIONS_FILE_REJECTED` with OpenSM's lines and the
//!   strict parser's line and reason, until the operator's part of the file changes again and
//!   OpenSM accepts the result.

use super::model::{Entry, MemberKind, PartitionsConf, PortSet, DEFAULT_BASE};
use super::parse::{parse, parse_part};
use super::region::split_region;
use crate::domain::{Guid, Membership, NodeId, NodeMemberships};
use std::collections::{BTreeMap, BTreeSet};
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

/// A (key base, port) member of the agent's region.
pub type RegionMember = (u16, Guid);

/// The members of the agent's region of `file` (every tenant entry's port GUIDs, with the
/// membership each grants: `both` as full); empty when the file has no region, `None` when its
/// region does not parse.
pub fn region_members(file: &[u8]) -> Option<BTreeMap<RegionMember, Membership>> {
    let parts = split_region(file).ok()?;
    let end = file.len().checked_sub(parts.after.len())?;
    let mut out = BTreeMap::new();
    if parts.before.len() >= end {
        return Some(out);
    }
    let region = parse_part(&file[parts.before.len()..end]).ok()?;
    for e in region.entries.iter().filter(|e| e.pkey != DEFAULT_BASE) {
        for m in &e.members {
            if let PortSet::Guid(g) = m.ports {
                let kind = match m.kind {
                    MemberKind::Limited => Membership::Limited,
                    MemberKind::Full | MemberKind::Both => Membership::Full,
                };
                // Full is the smaller (wider) membership: the widest listing wins.
                let held = out.entry((e.pkey, g)).or_insert(kind);
                *held = (*held).min(kind);
            }
        }
    }
    Some(out)
}

/// Every (key, port) `set` gives.
fn members_of_set(set: &NodeMemberships) -> BTreeSet<RegionMember> {
    set.keys
        .keys()
        .flat_map(|k| set.guids_for(*k).into_iter().map(move |g| (k.base(), g)))
        .collect()
}

/// The members of `file`'s region that `accepted`'s region does not hold as wide (a new
/// (key, port), or limited widened to full): what `file` adds to the accepted file. Empty when
/// either region does not parse.
pub fn region_additions(accepted: &[u8], file: &[u8]) -> BTreeSet<RegionMember> {
    let (Some(old), Some(new)) = (region_members(accepted), region_members(file)) else {
        return BTreeSet::new();
    };
    new.into_iter()
        .filter(|(id, m)| old.get(id).is_none_or(|o| o > m))
        .map(|(id, _)| id)
        .collect()
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
/// Rejections in a row of the same additions after which they are refused until the set of a
/// node they belong to changes: every retry of a file OpenSM does reject is a fail-open window.
pub const REJECTED_LIMIT: u32 = 3;

/// The last file OpenSM rejected, and until when what it added is held back.
///
/// OpenSM's verdict is a property of the bytes it reads, and the agent writes only bytes the
/// strict parser (OpenSM's own parser, re-implemented) accepts: a rejection of them is most
/// likely not caused by them (an error line of a sweep that read something else). Writing them
/// again opens a fail-open window if OpenSM does reject them, so:
/// - bytes that only take away from the last accepted file ([`takes_away_only`]: a release) are
///   written again at once: they add nothing OpenSM did not accept, and a release must go
///   through;
/// - what the rejected file added to the accepted one ([`RejectedFile::additions`]: the
///   (key, port)s of the nodes whose additions it carried) is held back: not written again
///   before the hold ends (1 min, doubling with each rejection of the same bytes or of the
///   same additions in a row, at most 10 min), so a file OpenSM does reject costs at most one
///   fail-open window per hold, and a rejection not caused by the bytes does not stall the node
///   for good. Meanwhile every other change is written without them (see
///   [`super::isolation::without_held`]): another node's release does not wait for the hold.
/// - after [`REJECTED_LIMIT`] rejections in a row of the same additions, the hold has no end:
///   they are refused ([`RejectedFile::refused`]) until the set of a node they belong to
///   changes ([`RejectedFile::lift_changed`]); that node's additions then get one more write,
///   and a rejection of them refuses them again at once. The rejection condition stands
///   meanwhile. So the fail-open windows a file OpenSM rejects can cost are bounded: at most
///   [`REJECTED_LIMIT`], then one per change of the node's set.
#[derive(Debug)]
pub struct RejectedFile {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// What the rejected file added to the file accepted then (and what an earlier rejection
    /// still held when this one came): held back until the hold ends. Empty when the rejected
    /// file took nothing new, or when no accepted file was known or either does not parse (the
    /// exact bytes are held back then, as [`RejectedFile::holds`] says).
    pub additions: BTreeSet<RegionMember>,
    /// Rejections of these bytes (or additions) in a row.
    times: u32,
    /// Neither the bytes nor the additions are written again before this (unless the bytes
    /// only take away).
    hold_until: tokio::time::Instant,
    /// Additions refused earlier whose node's set changed since (written once more): a
    /// rejection of any of them refuses again at once.
    lifted: BTreeSet<RegionMember>,
    /// Once refused: the sets of the nodes the held additions belong to, as they stood
    /// ([`RejectedFile::note_sets`]); a node whose set differs lifts its additions.
    refused_sets: Option<BTreeMap<NodeId, NodeMemberships>>,
}

impl RejectedFile {
    /// `bytes` rejected (again, when `earlier` held the same bytes or some of the same
    /// additions) while `accepted` was the last accepted file.
    pub fn after(
        earlier: Option<RejectedFile>,
        bytes: Vec<u8>,
        accepted: Option<&[u8]>,
    ) -> RejectedFile {
        let now = tokio::time::Instant::now();
        let mut additions = accepted.map_or_else(BTreeSet::new, |a| region_additions(a, &bytes));
        let again = earlier.as_ref().is_some_and(|e| {
            e.bytes == bytes
                || !e.additions.is_disjoint(&additions)
                || !e.lifted.is_disjoint(&additions)
        });
        let times = match &earlier {
            Some(e) if again => e.times.saturating_add(1),
            // What stands refused stays refused, with whatever joins it in the hold.
            Some(e) if e.refused() && !e.additions.is_empty() => e.times,
            _ => 1,
        };
        let lifted = earlier
            .as_ref()
            .filter(|_| again)
            .map(|e| e.lifted.clone())
            .unwrap_or_default();
        // What an earlier rejection still holds stays held: its node's addition is not written
        // again early because another file was rejected since.
        if let Some(e) = earlier.filter(|e| e.hold_until > now || e.refused()) {
            additions.extend(e.additions);
        }
        let hold = REJECTED_HOLD_FIRST
            .saturating_mul(1 << (times - 1).min(16))
            .min(REJECTED_HOLD_MAX);
        RejectedFile {
            bytes,
            additions,
            times,
            hold_until: now + hold,
            lifted,
            refused_sets: None,
        }
    }

    /// Whether the additions are refused: rejected [`REJECTED_LIMIT`] times in a row, held
    /// until a node's set changes rather than for a time.
    pub fn refused(&self) -> bool {
        self.times >= REJECTED_LIMIT
    }

    /// Rejections of these bytes or additions in a row.
    pub fn times(&self) -> u32 {
        self.times
    }

    /// Once refused, notes the sets of the nodes (of `nodes`) the held additions belong to, as
    /// they stand now; done once, at the first commit after the refusal.
    pub fn note_sets<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'a NodeId, &'a NodeMemberships)>,
    ) {
        if !self.refused() || self.refused_sets.is_some() {
            return;
        }
        let sets = nodes
            .into_iter()
            .filter(|(_, set)| !members_of_set(set).is_disjoint(&self.additions))
            .map(|(id, set)| (id.clone(), set.clone()))
            .collect();
        self.refused_sets = Some(sets);
    }

    /// Lifts the refusal of the additions of every noted node whose set now (`set_of`)
    /// differs from the noted one (or that is gone): they may be written once more. Returns
    /// the nodes lifted.
    pub fn lift_changed<'a>(
        &mut self,
        set_of: impl Fn(&NodeId) -> Option<&'a NodeMemberships>,
    ) -> Vec<NodeId> {
        let Some(sets) = self.refused_sets.as_mut() else {
            return Vec::new();
        };
        let changed: Vec<NodeId> = sets
            .iter()
            .filter(|(id, set)| set_of(id) != Some(*set))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &changed {
            if let Some(old) = sets.remove(id) {
                let mine: BTreeSet<RegionMember> = members_of_set(&old)
                    .intersection(&self.additions)
                    .copied()
                    .collect();
                self.additions.retain(|m| !mine.contains(m));
                self.lifted.extend(mine);
            }
        }
        changed
    }

    /// Whether the hold still keeps `bytes` from being written (`accepted`: the last accepted
    /// file): the time left, `None` when they may be written.
    pub fn holds(&self, bytes: &[u8], accepted: Option<&[u8]>) -> Option<Duration> {
        if self.bytes != bytes || accepted.is_some_and(|a| takes_away_only(a, bytes)) {
            return None;
        }
        self.left()
    }

    /// The additions held back now and the time left, `None` when none are.
    pub fn held_additions(&self) -> Option<(&BTreeSet<RegionMember>, Duration)> {
        if self.additions.is_empty() {
            return None;
        }
        self.left().map(|left| (&self.additions, left))
    }

    fn left(&self) -> Option<Duration> {
        if self.refused() {
            // Refused: no end in time; only a changed set lifts it. Exact bytes (no accepted
            // file to tell the additions) stay held: any changed set changes them.
            return (!self.additions.is_empty() || self.lifted.is_empty())
                .then_some(REJECTED_HOLD_MAX);
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
    fn a_rejected_file_holds_back_what_it_added_and_keeps_an_earlier_hold() {
        use super::super::region::{BEGIN_MARKER, END_MARKER};
        let file = |region: &str| {
            format!("op=0x1 : ALL;\n{BEGIN_MARKER}\n{region}{END_MARKER}\n").into_bytes()
        };
        let g = |n: u64| Guid(n);
        let accepted = file("t=0x2 : 0x10=full, 0x11=limited ;\n");
        // 0x10 released, 0x11 widened, 0x12 new on key 2, key 3 new: the last three are added.
        let rejected = file("t=0x2 : 0x11=full, 0x12 ;\nu=0x3 : 0x10 ;\n");
        assert_eq!(
            region_additions(&accepted, &rejected),
            BTreeSet::from([(0x2, g(0x11)), (0x2, g(0x12)), (0x3, g(0x10))])
        );
        assert!(region_additions(&accepted, &file("")).is_empty());
        assert!(region_additions(&accepted, b"broken=0x2 : 0xzz ;\n").is_empty());
        assert_eq!(
            region_members(b"Default=0x7fff : ALL ;\n"),
            Some(BTreeMap::new())
        );
        let first = RejectedFile::after(None, rejected.clone(), Some(&accepted));
        let (held, left) = first.held_additions().unwrap();
        assert_eq!(held.len(), 3);
        assert!(left > Duration::from_secs(59));
        // A later rejection of another file keeps what the first one still holds, and counts as
        // a rejection of the same additions (the hold doubles) when they overlap.
        let other = file("t=0x2 : 0x10=full, 0x11=limited ;\nv=0x4 : 0x13 ;\n");
        let second = RejectedFile::after(Some(first), other.clone(), Some(&accepted));
        assert_eq!(second.additions.len(), 4);
        assert_eq!(second.times, 1);
        let third = RejectedFile::after(Some(second), other, Some(&accepted));
        assert_eq!(third.times, 2);
        assert!(third.held_additions().unwrap().1 > Duration::from_secs(119));
        // Without an accepted file nothing is known to be added: the exact bytes are held.
        let blind = RejectedFile::after(None, rejected.clone(), None);
        assert!(blind.held_additions().is_none());
        assert!(blind.holds(&rejected, None).is_some());
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
