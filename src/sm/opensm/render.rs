//! Renders typed entries as `partitions.conf` text that [`super::parse`] reads back unchanged:
//! full keyword spellings, keys as 15-bit `0x` hex, one member per line, every entry closed
//! by `;` and every line far below OpenSM's 4094-byte buffer.

use super::model::{MemberKind, PortSet};
use std::fmt::Write as _;

/// A header flag to render: one OpenSM knows (`ipoib`, `mtu`, `rate`, `sl`, `scope`, `Q_Key`,
/// `TClass`, `FlowLabel`, `defmember`, `indx0`) with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagSpec {
    /// The flag's full name.
    pub name: &'static str,
    /// Its value (`mtu=4`), if any.
    pub value: Option<String>,
}

/// One entry to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySpec {
    /// Name, 1-31 characters `[A-Za-z0-9_.-]`; `None` writes the key alone.
    pub name: Option<String>,
    /// 15-bit base, 0x0001..=0x7fff.
    pub pkey: u16,
    /// Header flags in order.
    pub flags: Vec<FlagSpec>,
    /// Members in order; an empty list renders `NONE`.
    pub members: Vec<(PortSet, MemberKind)>,
}

/// Appends one entry.
pub fn render_entry(out: &mut String, e: &EntrySpec) {
    match &e.name {
        Some(n) => {
            let _ = write!(out, "{n}={:#06x}", e.pkey);
        }
        None => {
            let _ = write!(out, "{:#06x}", e.pkey);
        }
    }
    for f in &e.flags {
        out.push_str(", ");
        out.push_str(f.name);
        if let Some(v) = &f.value {
            out.push('=');
            out.push_str(v);
        }
    }
    out.push_str(" :");
    if e.members.is_empty() {
        out.push_str(" NONE;\n");
        return;
    }
    for (i, (ports, kind)) in e.members.iter().enumerate() {
        let sep = if i + 1 == e.members.len() { ';' } else { ',' };
        let _ = write!(out, "\n    {ports}={kind}{sep}");
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::super::model::KeyOrigin;
    use super::super::parse::parse;
    use super::*;
    use crate::domain::Guid;
    use proptest::prelude::*;

    fn port_set() -> impl Strategy<Value = PortSet> {
        prop_oneof![
            (1u64..).prop_map(|g| PortSet::Guid(Guid(g))),
            Just(PortSet::All),
            Just(PortSet::AllCas),
            Just(PortSet::AllSwitches),
            Just(PortSet::AllRouters),
            Just(PortSet::SmPort),
        ]
    }

    fn kind() -> impl Strategy<Value = MemberKind> {
        prop_oneof![
            Just(MemberKind::Full),
            Just(MemberKind::Limited),
            Just(MemberKind::Both)
        ]
    }

    fn flag() -> impl Strategy<Value = FlagSpec> {
        prop_oneof![
            Just(FlagSpec {
                name: "ipoib",
                value: None
            }),
            Just(FlagSpec {
                name: "indx0",
                value: None
            }),
            (1u8..=5).prop_map(|v| FlagSpec {
                name: "mtu",
                value: Some(v.to_string())
            }),
            (2u8..=16).prop_map(|v| FlagSpec {
                name: "rate",
                value: Some(v.to_string())
            }),
            (0u8..=15).prop_map(|v| FlagSpec {
                name: "sl",
                value: Some(v.to_string())
            }),
            (1u8..=15).prop_map(|v| FlagSpec {
                name: "scope",
                value: Some(v.to_string())
            }),
            (1u32..).prop_map(|v| FlagSpec {
                name: "Q_Key",
                value: Some(format!("{v:#x}"))
            }),
            (1u8..).prop_map(|v| FlagSpec {
                name: "TClass",
                value: Some(v.to_string())
            }),
            (0u32..=0xFFFFF).prop_map(|v| FlagSpec {
                name: "FlowLabel",
                value: Some(v.to_string())
            }),
            prop_oneof![Just("full"), Just("limited")].prop_map(|v| FlagSpec {
                name: "defmember",
                value: Some(v.to_owned())
            }),
        ]
    }

    fn entries() -> impl Strategy<Value = Vec<EntrySpec>> {
        proptest::collection::btree_map(
            1u16..0x7FFF,
            (
                proptest::option::of("[A-Za-z_][A-Za-z0-9_.-]{0,30}"),
                proptest::collection::vec(flag(), 0..4),
                proptest::collection::vec((port_set(), kind()), 0..6),
            ),
            1..8,
        )
        .prop_map(|m| {
            m.into_iter()
                .map(|(pkey, (name, flags, members))| EntrySpec {
                    name,
                    pkey,
                    flags,
                    members,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn render_then_parse_round_trips(specs in entries()) {
            let mut text = String::new();
            for e in &specs {
                render_entry(&mut text, e);
            }
            let conf = parse(text.as_bytes()).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            prop_assert_eq!(conf.entries.len(), specs.len());
            for (got, want) in conf.entries.iter().zip(&specs) {
                prop_assert_eq!(got.pkey, want.pkey);
                prop_assert_eq!(got.key_origin, KeyOrigin::Given);
                prop_assert_eq!(&got.name, &want.name);
                let flags: Vec<_> = got.flags.iter().map(|f| (f.name.clone(), f.value.clone())).collect();
                let want_flags: Vec<_> = want.flags.iter().map(|f| (f.name.to_owned(), f.value.clone())).collect();
                prop_assert_eq!(flags, want_flags);
                let members: Vec<_> = got.members.iter().map(|m| (m.ports, m.kind)).collect();
                prop_assert_eq!(&members, &want.members);
            }
            // Only `both` members and 0x7fff merges may warn; rendering adds no surprise.
            for w in &conf.warnings {
                prop_assert!(matches!(w.kind, super::super::model::WarningKind::BothMembership
                    | super::super::model::WarningKind::MergedIntoDefault), "{}", w);
            }
        }
    }
}
