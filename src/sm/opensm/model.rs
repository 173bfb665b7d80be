//! The typed model of an OpenSM 3.3 `partitions.conf`, as OpenSM itself reads it.
//!
//! [`PartitionsConf`] is what [`super::parse`] returns for a file OpenSM loads: every entry in
//! file order with its resolved P_Key, plus the quiet surprises ([`Warning`]) an operator should
//! see. A file OpenSM would drop (falling back to `Default=0x7fff : ALL=full`) is a
//! [`ParseError`] instead.

use crate::domain::Guid;
use std::collections::BTreeMap;
use std::fmt;
use thiserror::Error;

/// The default partition's base.
pub const DEFAULT_BASE: u16 = 0x7FFF;

/// Which ports a member token selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortSet {
    /// One port GUID.
    Guid(Guid),
    /// `ALL`: every port.
    All,
    /// `ALL_CAS`: every channel-adapter port.
    AllCas,
    /// `ALL_SWITCHES`: every switch port.
    AllSwitches,
    /// `ALL_ROUTERS`: every router port.
    AllRouters,
    /// `SELF`: the SM's own port.
    SmPort,
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSet::Guid(g) => write!(f, "{g}"),
            PortSet::All => f.write_str("ALL"),
            PortSet::AllCas => f.write_str("ALL_CAS"),
            PortSet::AllSwitches => f.write_str("ALL_SWITCHES"),
            PortSet::AllRouters => f.write_str("ALL_ROUTERS"),
            PortSet::SmPort => f.write_str("SELF"),
        }
    }
}

/// A member's membership as written. `Both` is full membership unless OpenSM runs with
/// `allow_both_pkeys`, when the port gets both values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemberKind {
    /// Bit 15 set.
    Full,
    /// Bit 15 clear.
    Limited,
    /// Both entries (with `allow_both_pkeys`), else full.
    Both,
}

impl fmt::Display for MemberKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberKind::Full => "full",
            MemberKind::Limited => "limited",
            MemberKind::Both => "both",
        })
    }
}

/// One member of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Line the member token was on.
    pub line: u32,
    /// The ports it selects.
    pub ports: PortSet,
    /// Its membership.
    pub kind: MemberKind,
}

/// How an entry's P_Key was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// Written in the header (after cutting to 16 bits and dropping bit 15).
    Given,
    /// No key (or a key of 0): OpenSM reused the key of an earlier entry with the same name.
    ByName,
    /// No key: OpenSM generated one (counting up from 0x0001, skipping keys already taken).
    Generated,
}

/// A header flag (`ipoib`, `mtu=4`, ...) as OpenSM understood it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryFlag {
    /// The flag OpenSM matched (full name), or the text as written when unrecognised.
    pub name: String,
    /// The value as written, if any.
    pub value: Option<String>,
    /// Whether OpenSM recognised the flag.
    pub recognised: bool,
}

/// A `mgid=` multicast group line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MulticastGroup {
    /// Line it was on.
    pub line: u32,
    /// The MGID text as written.
    pub mgid: String,
    /// Group flags (`sl`, `Q_Key`, ...), as written.
    pub flags: Vec<(String, Option<String>)>,
    /// Whether OpenSM accepts the MGID (valid IPv6 text with first byte 0xff).
    pub valid: bool,
}

/// One `header : members ;` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Line of the header.
    pub line: u32,
    /// The name OpenSM keeps (cut to 31 characters), if one was written.
    pub name: Option<String>,
    /// The resolved 15-bit base.
    pub pkey: u16,
    /// How the key was chosen.
    pub key_origin: KeyOrigin,
    /// Header flags in order.
    pub flags: Vec<EntryFlag>,
    /// The `defmember` in force for members without their own `=...`.
    pub default_member: MemberKind,
    /// Members in order.
    pub members: Vec<Member>,
    /// `mgid=` groups.
    pub multicast_groups: Vec<MulticastGroup>,
}

/// What kind of quiet surprise a [`Warning`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarningKind {
    /// A keyword or flag written as a shortened prefix (`A=f` is `ALL=full`).
    Abbreviation,
    /// A port membership OpenSM does not know: it silently means limited.
    UnknownMembership,
    /// An empty `=` value that OpenSM reads as a match (`0x1=` is full).
    EmptyValue,
    /// A header flag OpenSM does not know (ignored) or one with an invalid value (skipped).
    IgnoredFlag,
    /// The key had bits above 15 or bit 15 set, or was written as a negative number.
    KeyTruncated,
    /// No key (or key 0): OpenSM generates one or reuses one by name.
    KeyNotGiven,
    /// Two entries with the same key merge into one partition.
    Merged,
    /// A tenant entry with key 0x7fff merges into the default partition.
    MergedIntoDefault,
    /// The name was longer than 31 characters and is cut.
    NameTruncated,
    /// A GUID written in decimal or octal, or a GUID of all ones from a negative number.
    OddGuid,
    /// `both` membership: full unless OpenSM runs with `allow_both_pkeys`.
    BothMembership,
    /// A line longer than OpenSM's 4094-byte buffer: it is read in pieces and tokens are split.
    LongLine,
    /// A NUL byte: OpenSM ignores the rest of that line.
    NulByte,
    /// An `mgid=` OpenSM rejects: it logs a `PARSE ERROR` line but keeps the file.
    BadMulticastGroup,
    /// An `mgid=` with no flags after it: OpenSM reads leftover buffer bytes as its flags.
    UnpredictableMulticastGroup,
    /// The last entry has no `;`: OpenSM accepts it as if it had one.
    MissingSemicolon,
    /// `NONE` members and empty member tokens (`,,`) are ignored.
    EmptyMember,
    /// A member that is a keyword prefix of several keywords resolved to the first one.
    AmbiguousKeyword,
}

/// A construct OpenSM accepts with a meaning the author may not expect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// 1-based line (OpenSM's count: a long line counts once per 4094-byte piece).
    pub line: u32,
    /// What kind of surprise.
    pub kind: WarningKind,
    /// What OpenSM will do, for humans.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Why OpenSM drops a whole file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParseErrorKind {
    /// Text that is not part of an entry header and has no `:` (includes CRLF line ends).
    NoPartitionDefinition,
    /// A header OpenSM rejects (a key that is not a C integer, text after the key).
    BadPartitionDefinition,
    /// A member that is neither a keyword nor a non-zero C integer GUID.
    BadPortGuid,
    /// OpenSM ran out of generated keys.
    KeysExhausted,
    /// `mgid` with no value: OpenSM dereferences a null pointer.
    MulticastGroupWithoutValue,
    /// No entry at all (empty or comment-only file).
    NoEntries,
}

/// A file OpenSM drops entirely, falling back to `Default=0x7fff : ALL=full` for every port.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line (0 for whole-file errors).
    pub line: u32,
    /// The kind.
    pub kind: ParseErrorKind,
    /// What is wrong and what OpenSM logs, for humans.
    pub message: String,
}

/// A partitions file OpenSM loads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionsConf {
    /// Entries in file order.
    pub entries: Vec<Entry>,
    /// Quiet surprises in file order.
    pub warnings: Vec<Warning>,
    /// Whether the file ends inside an entry (no closing `;`).
    pub open_entry_at_end: bool,
    /// How many `PARSE ERROR` lines OpenSM logs while still loading the file (bad `mgid=`).
    pub logged_parse_errors: usize,
}

/// One partition after OpenSM merged every entry with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectivePartition {
    /// The name OpenSM keeps (the first entry's).
    pub name: String,
    /// Every member of every merged entry, in file order.
    pub members: Vec<Member>,
}

impl PartitionsConf {
    /// Whether some entry defines the default partition (key 0x7fff, or the name `Default`).
    pub fn has_explicit_default(&self) -> bool {
        self.entries.iter().any(|e| e.pkey == DEFAULT_BASE)
    }

    /// Every key some entry defines.
    pub fn keys(&self) -> impl Iterator<Item = u16> + '_ {
        self.entries.iter().map(|e| e.pkey)
    }

    /// The partitions OpenSM builds, by base: the implicit default partition (`ALL=limited,
    /// SELF=full`, which OpenSM creates before reading the file) plus every entry, merged by key.
    pub fn effective(&self) -> BTreeMap<u16, EffectivePartition> {
        let mut map = BTreeMap::new();
        map.insert(
            DEFAULT_BASE,
            EffectivePartition {
                name: "Default".to_owned(),
                members: vec![
                    Member {
                        line: 0,
                        ports: PortSet::All,
                        kind: MemberKind::Limited,
                    },
                    Member {
                        line: 0,
                        ports: PortSet::SmPort,
                        kind: MemberKind::Full,
                    },
                ],
            },
        );
        for e in &self.entries {
            let p = map.entry(e.pkey).or_insert_with(|| EffectivePartition {
                name: e.name.clone().unwrap_or_else(|| format!("{:04x}", e.pkey)),
                members: Vec::new(),
            });
            p.members.extend(e.members.iter().cloned());
        }
        map
    }

    /// How many P_Key table entries a channel-adapter port with this GUID needs: one per
    /// partition that names it or includes it through `ALL`/`ALL_CAS` (the default partition
    /// always counts). `both` counts twice when `allow_both_pkeys` is on.
    pub fn table_entries_for(&self, guid: Guid, allow_both_pkeys: bool) -> usize {
        self.effective()
            .values()
            .map(|p| {
                let mut full = false;
                let mut limited = false;
                for m in &p.members {
                    let hit = match m.ports {
                        PortSet::Guid(g) => g == guid,
                        PortSet::All | PortSet::AllCas => true,
                        PortSet::AllSwitches | PortSet::AllRouters | PortSet::SmPort => false,
                    };
                    if hit {
                        match m.kind {
                            MemberKind::Full => full = true,
                            MemberKind::Limited => limited = true,
                            MemberKind::Both if allow_both_pkeys => {
                                full = true;
                                limited = true;
                            }
                            MemberKind::Both => full = true,
                        }
                    }
                }
                // Without allow_both_pkeys OpenSM keeps one entry (full wins).
                match (full, limited) {
                    (true, true) if allow_both_pkeys => 2,
                    (false, false) => 0,
                    _ => 1,
                }
            })
            .sum()
    }
}
