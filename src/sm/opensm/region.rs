//! The agent's region of `partitions.conf`: one marked block the agent rewrites, every other
//! byte kept as the operator wrote it.
//!
//! The region holds one entry per tenant key naming the port GUIDs of every node that wants it,
//! each with its membership. When the operator's part has no Default entry the region adds one,
//! `Default=0x7fff, ipoib : ALL=limited, SELF=full;` by default: an explicit Default keeps the
//! file meaningful even when no tenant key is left (OpenSM treats an empty or comment-only file as
//! broken and gives every port full default membership), tenant ports stay *limited* members of
//! the default partition (they reach the SM and SA, which are full members, but not each other),
//! and the SM host's own port (`SELF`) is a full member as OpenSM needs.
//!
//! Tenant entries are named `fa.<key>`: a name no operator entry is expected to use, so a
//! keyless operator entry (whose key OpenSM looks up by name) never resolves to a tenant's
//! partition and pulls its ports into it. The partition name a node requests is stored with its
//! set but never written to the file: the file's bytes depend only on keys, memberships and
//! ports, so a set that changes only a name leaves the file as OpenSM last accepted it (no
//! write, no sweep), and a node cannot make OpenSM sweep by renaming a key it holds.
//!
//! Before anything is written the whole composed file is parsed back with the strict parser and
//! refused unless it loads, has an explicit Default entry, adds no surprise of its own, puts no
//! more keys on any agent-managed port than its table holds, leaves every operator partition with
//! exactly the key and members it has without the region, and gives every tenant key exactly the
//! members the region lists.

use super::model::{
    EffectivePartition, MemberKind, ParseError, PartitionsConf, PortSet, Warning, DEFAULT_BASE,
};
use super::parse::{parse, parse_part};
use super::render::{render_entry, EntrySpec, FlagSpec};
use crate::domain::{Guid, Membership, PKey, KEY_NAME_MAX};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// Prefix of every tenant entry's name in the region.
pub const TENANT_NAME_PREFIX: &str = "fa.";

/// The name of a tenant key's entry: `fa.<4 hex digits>`. `requested`, the name the nodes gave
/// the partition, is not part of it (see the module doc): it is kept in the store and the API
/// only.
pub fn tenant_entry_name(key: PKey, requested: &str) -> String {
    let _ = requested;
    let mut name = format!("{TENANT_NAME_PREFIX}{:04x}", key.base());
    name.truncate(KEY_NAME_MAX);
    name
}

/// Where the operator's part gives every port full membership of the default partition
/// (`Default=0x7fff : ALL=full`, also written `A=f`, `ALL_CAS=full`, `both`, or through
/// `defmember=full`): every tenant could reach every other through it. `None` when it does not.
pub fn default_grants_all_full(conf: &PartitionsConf) -> Option<FullDefault> {
    conf.entries
        .iter()
        .filter(|e| e.pkey == DEFAULT_BASE)
        .flat_map(|e| e.members.iter())
        .find(|m| {
            matches!(m.ports, PortSet::All | PortSet::AllCas)
                && matches!(m.kind, MemberKind::Full | MemberKind::Both)
        })
        .map(|m| FullDefault::Operator {
            line: m.line,
            ports: m.ports,
            kind: m.kind,
        })
}

/// A Default entry that makes every port a full member of the default partition, so every
/// tenant port can reach every other through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FullDefault {
    /// The operator's entry, at `line` of the file.
    #[error("line {line} of the partitions file makes {ports} a {kind} member of the default partition (0x7fff): every tenant port can reach every other through it")]
    Operator {
        /// Its line in the file.
        line: u32,
        /// The member token's ports (`ALL` or `ALL_CAS`).
        ports: PortSet,
        /// Its membership (`full` or `both`).
        kind: MemberKind,
    },
    /// The region's own entry, because the config says `default_membership = "full"`.
    #[error("default_membership = \"full\" makes the region's Default entry ALL=full: every tenant port can reach every other through the default partition")]
    Configured,
}
/// First line of the agent's region.
pub const BEGIN_MARKER: &str = "# BEGIN fabric-agent managed region: do not edit";
/// Last line of the agent's region.
pub const END_MARKER: &str = "# END fabric-agent managed region";

/// A port's P_Key table would overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{} would need {needed} P_Key table entries (the default partition and operator entries included) but holds {capacity}", match .port { Some(g) => format!("port {g}"), None => "every port".to_owned() })]
pub struct TableOverflow {
    /// The port, or `None` when every port of the set would overflow (too many keys).
    pub port: Option<Guid>,
    /// Entries needed.
    pub needed: usize,
    /// Entries the table holds.
    pub capacity: usize,
}

/// What is wrong with the operator's part of the partitions file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OperatorFileProblem {
    /// OpenSM would drop it.
    #[error("{0} (OpenSM would load the default configuration instead)")]
    Parse(#[source] ParseError),
    /// The part before the region ends inside an entry.
    #[error("the last entry before the fabric-agent region has no closing ';'")]
    OpenEntryAtEnd,
    /// The markers are not one BEGIN followed by one END (or none).
    #[error("expected no fabric-agent markers or exactly one {BEGIN_MARKER:?} line followed by one {END_MARKER:?} line; found {begins} and {ends}")]
    Markers {
        /// BEGIN lines found.
        begins: usize,
        /// END lines found.
        ends: usize,
    },
}

/// Why the composed file fails the final check.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ComposedProblem {
    /// OpenSM would drop the whole file.
    #[error("{0}")]
    Parse(#[source] ParseError),
    /// The file has no explicit Default entry.
    #[error("no explicit Default entry")]
    NoDefault,
    /// The region's own text draws a warning.
    #[error("the region itself warns: {0}")]
    RegionWarns(Warning),
    /// A tenant key is missing from the parsed file.
    #[error("key {0} missing after parse")]
    KeyMissing(PKey),
    /// A tenant key's members differ in the parsed file.
    #[error("key {0}: members differ after parse")]
    MembersDiffer(PKey),
}

/// How the region and the operator's part would interfere.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Collision {
    /// An operator partition's members would change with the region in place.
    #[error("the operator's partition {key:#06x} ({name}) would change members with the region in place: {before} before, {after} after")]
    OperatorMembers {
        /// The operator partition's key.
        key: u16,
        /// Its name ("?" when unnamed).
        name: String,
        /// Members without the region.
        before: usize,
        /// Members with it.
        after: usize,
    },
    /// An operator entry resolves to a tenant key and changes its members.
    #[error("tenant key {key} would hold {got} members in the composed file instead of the region's {want} (an operator entry resolves to it)")]
    TenantMembers {
        /// The tenant key.
        key: PKey,
        /// Members in the composed file.
        got: usize,
        /// Members in the region.
        want: usize,
    },
    /// The composed file defines a partition neither part does.
    #[error("the composed file defines partition {0:#06x}, which neither the operator's part nor the region does")]
    ExtraPartition(u16),
}

/// Why a file cannot be (re)written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegionError {
    /// The operator's part does not load in OpenSM, or the markers are damaged.
    #[error("operator's partitions file is broken: {0}")]
    OperatorFile(#[source] OperatorFileProblem),
    /// A tenant key is already defined by the operator's part.
    #[error("key {key} is defined by the operator's entry on line {line} of the partitions file; the agent does not manage it")]
    OperatorKey {
        /// The key.
        key: PKey,
        /// The operator entry's line.
        line: u32,
    },
    /// A port would hold more keys than its table.
    #[error("{0}")]
    TableFull(TableOverflow),
    /// The composed file failed the final check (a bug: nothing was written).
    #[error("composed file refused: {0}")]
    Composed(#[source] ComposedProblem),
    /// The region would change an operator partition's key or members, or an operator entry
    /// would add members to a tenant key (nothing was written).
    #[error("refused, nothing written: {0}")]
    Collision(#[source] Collision),
}

/// The operator's bytes around the region.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OperatorParts {
    /// Everything before the region's first line.
    pub before: Vec<u8>,
    /// Everything after the region's last line.
    pub after: Vec<u8>,
}

impl OperatorParts {
    /// The operator's part as OpenSM would read it without the region. A part without entries
    /// is fine (the region completes it); one that ends inside an entry is not, since the
    /// region's text would continue that entry.
    pub fn parse(&self) -> Result<PartitionsConf, RegionError> {
        let broken = |e| RegionError::OperatorFile(OperatorFileProblem::Parse(e));
        let before = parse_part(&self.before).map_err(broken)?;
        if before.open_entry_at_end {
            return Err(RegionError::OperatorFile(
                OperatorFileProblem::OpenEntryAtEnd,
            ));
        }
        let mut all = self.before.clone();
        all.extend_from_slice(&self.after);
        parse_part(&all).map_err(broken)
    }
}

fn lines_with_offsets(file: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut off = 0;
    file.split_inclusive(|&b| b == b'\n').map(move |l| {
        let start = off;
        off += l.len();
        (start, l)
    })
}

fn is_marker(line: &[u8], marker: &str) -> bool {
    line.strip_suffix(b"\n").unwrap_or(line) == marker.as_bytes()
}

/// Splits a file into the operator's parts. No markers: the whole file is the operator's and the
/// region goes at the end. One BEGIN followed by one END: the region is between them.
pub fn split_region(file: &[u8]) -> Result<OperatorParts, RegionError> {
    let begins: Vec<(usize, &[u8])> = lines_with_offsets(file)
        .filter(|(_, l)| is_marker(l, BEGIN_MARKER))
        .collect();
    let ends: Vec<(usize, &[u8])> = lines_with_offsets(file)
        .filter(|(_, l)| is_marker(l, END_MARKER))
        .collect();
    match (begins.as_slice(), ends.as_slice()) {
        ([], []) => {
            let mut before = file.to_vec();
            if !before.is_empty() && !before.ends_with(b"\n") {
                before.push(b'\n');
            }
            Ok(OperatorParts {
                before,
                after: Vec::new(),
            })
        }
        ([(b, _)], [(e, end_line)]) if e > b => Ok(OperatorParts {
            before: file[..*b].to_vec(),
            after: file[e + end_line.len()..].to_vec(),
        }),
        _ => Err(RegionError::OperatorFile(OperatorFileProblem::Markers {
            begins: begins.len(),
            ends: ends.len(),
        })),
    }
}

/// One tenant key in the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantEntry {
    /// Entry name (already safe to render).
    pub name: String,
    /// Member ports and their membership.
    pub members: BTreeMap<Guid, Membership>,
}

/// The region's content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionPlan {
    /// The Default entry's `ALL` membership, when the region must supply a Default entry.
    pub default_entry: Option<Membership>,
    /// Tenant keys with at least one member.
    pub tenants: BTreeMap<PKey, TenantEntry>,
}

impl RegionPlan {
    /// Every GUID the region names.
    pub fn guids(&self) -> impl Iterator<Item = Guid> + '_ {
        let mut all: Vec<Guid> = self
            .tenants
            .values()
            .flat_map(|t| t.members.keys().copied())
            .collect();
        all.sort();
        all.dedup();
        all.into_iter()
    }
}

fn member_kind(m: Membership) -> MemberKind {
    match m {
        Membership::Full => MemberKind::Full,
        Membership::Limited => MemberKind::Limited,
    }
}

/// Renders the region, markers included.
pub fn render_region(plan: &RegionPlan) -> String {
    let mut out = String::new();
    out.push_str(BEGIN_MARKER);
    out.push('\n');
    out.push_str("# Written by fabric-agent from the memberships nodes asked for; edits here are overwritten.\n");
    if let Some(all) = plan.default_entry {
        render_entry(
            &mut out,
            &EntrySpec {
                name: Some("Default".into()),
                pkey: DEFAULT_BASE,
                flags: vec![FlagSpec {
                    name: "ipoib",
                    value: None,
                }],
                members: vec![
                    (PortSet::All, member_kind(all)),
                    (PortSet::SmPort, MemberKind::Full),
                ],
            },
        );
    }
    for (key, t) in &plan.tenants {
        render_entry(
            &mut out,
            &EntrySpec {
                name: Some(t.name.clone()),
                pkey: key.base(),
                flags: Vec::new(),
                members: t
                    .members
                    .iter()
                    .map(|(g, m)| (PortSet::Guid(*g), member_kind(*m)))
                    .collect(),
            },
        );
    }
    out.push_str(END_MARKER);
    out.push('\n');
    out
}

/// The operator's parts with the region between them.
pub fn compose(parts: &OperatorParts, region: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.before.len() + region.len() + parts.after.len());
    out.extend_from_slice(&parts.before);
    out.extend_from_slice(region.as_bytes());
    out.extend_from_slice(&parts.after);
    out
}

/// Limits the composed file must respect.
#[derive(Debug, Clone, Copy)]
pub struct TableLimits {
    /// P_Key table entries per port (default partition included).
    pub table_size: usize,
    /// Whether OpenSM runs with `allow_both_pkeys`.
    pub allow_both_pkeys: bool,
}

/// Checks that no tenant key is one the operator's part defines.
pub fn check_operator_keys<'a>(
    operator: &PartitionsConf,
    keys: impl IntoIterator<Item = &'a PKey>,
) -> Result<(), RegionError> {
    for k in keys {
        if let Some(e) = operator.entries.iter().find(|e| e.pkey == k.base()) {
            return Err(RegionError::OperatorKey {
                key: *k,
                line: e.line,
            });
        }
    }
    Ok(())
}

fn member_set(p: Option<&EffectivePartition>) -> BTreeSet<(PortSet, MemberKind)> {
    p.map(|p| p.members.iter().map(|m| (m.ports, m.kind)).collect())
        .unwrap_or_default()
}

/// Checks that the composed file (`whole`) leaves every partition the operator's part defines
/// (`operator`, parsed without the region) with the same key and members, and gives each tenant
/// key exactly the region's members: no entry of one side resolved to the other by name or key.
pub fn check_operator_unchanged(
    operator: &PartitionsConf,
    whole: &PartitionsConf,
    plan: &RegionPlan,
) -> Result<(), RegionError> {
    let before = operator.effective();
    let after = whole.effective();
    let operator_keys: BTreeSet<u16> = operator.keys().collect();
    for key in &operator_keys {
        let was = member_set(before.get(key));
        let now = member_set(after.get(key));
        if was != now {
            return Err(RegionError::Collision(Collision::OperatorMembers {
                key: *key,
                name: before.get(key).map_or("?", |p| p.name.as_str()).to_owned(),
                before: was.len(),
                after: now.len(),
            }));
        }
    }
    for (key, t) in &plan.tenants {
        let want: BTreeSet<(PortSet, MemberKind)> = t
            .members
            .iter()
            .map(|(g, m)| (PortSet::Guid(*g), member_kind(*m)))
            .collect();
        let got = member_set(after.get(&key.base()));
        if want != got {
            return Err(RegionError::Collision(Collision::TenantMembers {
                key: *key,
                got: got.len(),
                want: want.len(),
            }));
        }
    }
    let expected: BTreeSet<u16> = operator_keys
        .iter()
        .copied()
        .chain(plan.tenants.keys().map(|k| k.base()))
        .chain([DEFAULT_BASE])
        .collect();
    let found: BTreeSet<u16> = after.keys().copied().collect();
    if let Some(extra) = found.difference(&expected).next() {
        return Err(RegionError::Collision(Collision::ExtraPartition(*extra)));
    }
    Ok(())
}

/// Parses the composed file back and refuses it unless OpenSM will load it as planned.
pub fn check_composed(
    bytes: &[u8],
    region: &str,
    plan: &RegionPlan,
    limits: TableLimits,
) -> Result<PartitionsConf, RegionError> {
    let composed = |p| RegionError::Composed(p);
    let whole = parse(bytes).map_err(|e| composed(ComposedProblem::Parse(e)))?;
    if !whole.has_explicit_default() {
        return Err(composed(ComposedProblem::NoDefault));
    }
    let own = parse_part(region.as_bytes()).map_err(|e| composed(ComposedProblem::Parse(e)))?;
    if let Some(w) = own.warnings.first() {
        return Err(composed(ComposedProblem::RegionWarns(w.clone())));
    }
    for (key, t) in &plan.tenants {
        let e = own
            .entries
            .iter()
            .find(|e| e.pkey == key.base())
            .ok_or(RegionError::Composed(ComposedProblem::KeyMissing(*key)))?;
        if e.members.len() != t.members.len() {
            return Err(RegionError::Composed(ComposedProblem::MembersDiffer(*key)));
        }
    }
    for guid in plan.guids() {
        let n = whole.table_entries_for(guid, limits.allow_both_pkeys);
        if n > limits.table_size {
            return Err(RegionError::TableFull(TableOverflow {
                port: Some(guid),
                needed: n,
                capacity: limits.table_size,
            }));
        }
    }
    Ok(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(keys: &[(u32, u64, Membership)]) -> RegionPlan {
        let mut p = RegionPlan {
            default_entry: Some(Membership::Limited),
            tenants: BTreeMap::new(),
        };
        for (k, g, m) in keys {
            let key = PKey::new(*k).unwrap();
            p.tenants
                .entry(key)
                .or_insert_with(|| TenantEntry {
                    name: format!("t{k}"),
                    members: BTreeMap::new(),
                })
                .members
                .insert(Guid(*g), *m);
        }
        p
    }

    #[test]
    fn split_without_markers_takes_the_whole_file() {
        let parts = split_region(b"a=0x1 : ALL;").unwrap();
        assert_eq!(parts.before, b"a=0x1 : ALL;\n");
        assert!(parts.after.is_empty());
    }

    #[test]
    fn compose_then_split_keeps_operator_bytes() {
        let parts = OperatorParts {
            before: b"# ops\nstorage=0x10 : ALL=full;\n".to_vec(),
            after: b"\n# tail comment\n".to_vec(),
        };
        let p = plan(&[(1, 0x10, Membership::Full), (1, 0x11, Membership::Limited)]);
        let region = render_region(&p);
        let file = compose(&parts, &region);
        assert_eq!(split_region(&file).unwrap(), parts);
        let conf = check_composed(
            &file,
            &region,
            &p,
            TableLimits {
                table_size: 64,
                allow_both_pkeys: false,
            },
        )
        .unwrap();
        assert!(conf.has_explicit_default());
    }

    #[test]
    fn damaged_markers_are_refused() {
        let f = format!("{END_MARKER}\n{BEGIN_MARKER}\n");
        assert!(split_region(f.as_bytes()).is_err());
        let f = format!("{BEGIN_MARKER}\n");
        assert!(split_region(f.as_bytes()).is_err());
    }

    #[test]
    fn empty_region_still_has_default() {
        let p = plan(&[]);
        let region = render_region(&p);
        let file = compose(&OperatorParts::default(), &region);
        assert!(check_composed(
            &file,
            &region,
            &p,
            TableLimits {
                table_size: 64,
                allow_both_pkeys: false
            }
        )
        .is_ok());
        let no_default = RegionPlan::default();
        let region = render_region(&no_default);
        let file = compose(&OperatorParts::default(), &region);
        assert!(check_composed(
            &file,
            &region,
            &no_default,
            TableLimits {
                table_size: 64,
                allow_both_pkeys: false
            }
        )
        .is_err());
    }

    #[test]
    fn table_overflow_is_refused() {
        let keys: Vec<_> = (1..=3).map(|k| (k, 0x10, Membership::Full)).collect();
        let p = plan(&keys);
        let region = render_region(&p);
        let file = compose(&OperatorParts::default(), &region);
        let err = check_composed(
            &file,
            &region,
            &p,
            TableLimits {
                table_size: 3,
                allow_both_pkeys: false,
            },
        )
        .unwrap_err();
        assert!(matches!(err, RegionError::TableFull(_)), "{err}");
    }

    #[test]
    fn operator_keys_and_open_entries() {
        let parts = OperatorParts {
            before: b"storage=0x10 : ALL=full;\n".to_vec(),
            after: Vec::new(),
        };
        let op = parts.parse().unwrap();
        assert!(check_operator_keys(&op, [&PKey::new(0x10).unwrap()]).is_err());
        let open = OperatorParts {
            before: b"storage=0x10 : ALL=full\n".to_vec(),
            after: Vec::new(),
        };
        assert!(open.parse().is_err());
    }
}
