//! A strict reader of OpenSM 3.3's `partitions.conf` that reports exactly what OpenSM does.
//!
//! OpenSM's reader (`osm_prtn_config.c`) works in place on a 4096-byte line buffer with `fgets`,
//! `strchr` and NUL writes; several of its quiet behaviours (long lines split mid-token, `#`
//! cutting the rest of a line, the bytes an `mgid=` line consumes) follow from that buffer
//! arithmetic. So this reader walks the same buffer the same way and records, instead of
//! partitions in a subnet, a typed [`PartitionsConf`] plus a [`Warning`] for every construct
//! that loads with a surprising meaning. A file OpenSM would drop — any hard parse error, or a
//! file without a single entry — is a [`ParseError`].

use super::model::{
    Entry, EntryFlag, KeyOrigin, Member, MemberKind, MulticastGroup, ParseError, ParseErrorKind,
    PartitionsConf, PortSet, Warning, WarningKind, DEFAULT_BASE,
};
use crate::domain::{Guid, KEY_NAME_MAX};
use c_text::{c_strtoul, is_c_space, is_prefix, lossy};
use std::collections::BTreeSet;
use std::net::Ipv6Addr;

mod c_text;

/// OpenSM's line buffer: `char line[4096]` read with `fgets(line, sizeof(line) - 1, ...)`.
const LINE_BUFFER: usize = 4096;
/// The longest piece one `fgets` call returns.
pub const MAX_LINE_PIECE: usize = LINE_BUFFER - 2;

/// Parses a whole file as OpenSM 3.3 does.
pub fn parse(text: &[u8]) -> Result<PartitionsConf, ParseError> {
    Reader::new().run(text)
}

/// Parses a file, treating a file without entries as acceptable (for the operator's part of a
/// file, which the agent completes with its own region).
pub fn parse_part(text: &[u8]) -> Result<PartitionsConf, ParseError> {
    match parse(text) {
        Err(e) if e.kind == ParseErrorKind::NoEntries => Ok(PartitionsConf::default()),
        other => other,
    }
}

/// The state OpenSM keeps for the entry being read (`struct part_conf`).
struct EntryState {
    entry: Option<Entry>,
    flags: Vec<EntryFlag>,
    default_member: MemberKind,
}

impl EntryState {
    fn new() -> Self {
        EntryState {
            entry: None,
            flags: Vec::new(),
            default_member: MemberKind::Limited,
        }
    }
}

struct Reader {
    buf: Vec<u8>,
    line: u32,
    out: PartitionsConf,
    taken: BTreeSet<u16>,
    names: Vec<(Vec<u8>, u16)>,
    generated: u16,
    explicit_default: bool,
}

/// What `parse_name_token` found: indexes into the buffer and bytes consumed.
struct Token {
    name: usize,
    value: Option<usize>,
    len: usize,
}

impl Reader {
    fn new() -> Self {
        Reader {
            buf: vec![0; LINE_BUFFER],
            line: 0,
            out: PartitionsConf::default(),
            taken: BTreeSet::from([DEFAULT_BASE]),
            names: vec![(b"Default".to_vec(), DEFAULT_BASE)],
            generated: 0,
            explicit_default: false,
        }
    }

    fn at(&self, i: usize) -> u8 {
        self.buf.get(i).copied().unwrap_or(0)
    }

    fn set(&mut self, i: usize, b: u8) {
        if let Some(slot) = self.buf.get_mut(i) {
            *slot = b;
        }
    }

    fn strlen(&self, i: usize) -> usize {
        let mut n = 0;
        while self.at(i + n) != 0 {
            n += 1;
        }
        n
    }

    fn strchr(&self, i: usize, c: u8) -> Option<usize> {
        let mut j = i;
        loop {
            match self.at(j) {
                0 => return None,
                b if b == c => return Some(j),
                _ => j += 1,
            }
        }
    }

    fn cstr(&self, i: usize) -> Vec<u8> {
        self.buf
            .get(i..i + self.strlen(i))
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    fn warn(&mut self, kind: WarningKind, message: impl Into<String>) {
        self.out.warnings.push(Warning {
            line: self.line,
            kind,
            message: message.into(),
        });
    }

    fn fatal(&self, kind: ParseErrorKind, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            kind,
            message: message.into(),
        }
    }

    fn run(mut self, text: &[u8]) -> Result<PartitionsConf, ParseError> {
        let mut rest = text;
        let mut state: Option<EntryState> = None;
        let mut loaded_any = false;
        while !rest.is_empty() {
            let n = rest
                .iter()
                .take(MAX_LINE_PIECE)
                .position(|&b| b == b'\n')
                .map_or(rest.len().min(MAX_LINE_PIECE), |i| i + 1);
            let (piece, tail) = rest.split_at(n);
            rest = tail;
            self.line += 1;
            if n == MAX_LINE_PIECE && piece.last() != Some(&b'\n') && !rest.is_empty() {
                self.warn(
                    WarningKind::LongLine,
                    format!("line longer than {MAX_LINE_PIECE} bytes: OpenSM reads it in pieces and splits the token at the boundary"),
                );
            }
            if piece.contains(&0) {
                self.warn(
                    WarningKind::NulByte,
                    "NUL byte: OpenSM ignores the rest of this line",
                );
            }
            self.buf[..n].copy_from_slice(piece);
            self.buf[n] = 0;
            if let Some(q) = self.strchr(0, b'#') {
                self.set(q, 0);
            }
            let mut p = 0;
            loop {
                while matches!(self.at(p), b' ' | b'\t' | b'\n') {
                    p += 1;
                }
                if self.at(p) == 0 {
                    break;
                }
                let st = state.get_or_insert_with(EntryState::new);
                let semicolon = self.strchr(p, b';');
                if let Some(q) = semicolon {
                    self.set(q, 0);
                }
                let len = self.parse_entry_text(st, p)?;
                loaded_any = true;
                p += len;
                if semicolon.is_none() {
                    break;
                }
                if let Some(done) = state.take() {
                    self.finish(done);
                }
            }
        }
        if !loaded_any {
            return Err(ParseError {
                line: 0,
                kind: ParseErrorKind::NoEntries,
                message: "no partition entry: OpenSM treats an empty or comment-only file as broken and puts every port in Default=0x7fff with full membership".into(),
            });
        }
        if let Some(open) = state.take() {
            if open.entry.is_some() {
                self.out.open_entry_at_end = true;
                self.warn(
                    WarningKind::MissingSemicolon,
                    "the last entry has no closing ';' (OpenSM accepts it)",
                );
            }
            self.finish(open);
        }
        Ok(self.out)
    }

    fn finish(&mut self, state: EntryState) {
        if let Some(e) = state.entry {
            self.out.entries.push(e);
        }
    }

    /// `parse_name_token`: splits `name[=value]` in place, strips blanks, and returns how many
    /// bytes the token and its separator take.
    fn name_token(&mut self, start: usize) -> Token {
        let mut p = start;
        while matches!(self.at(p), b' ' | b'\t' | b'\n') {
            p += 1;
        }
        let eq = self.strchr(p, b'=');
        if let Some(q) = eq {
            self.set(q, 0);
        }
        let mut len = self.strlen(start) + 1;
        self.strip_tail(p);
        let name = p;
        let Some(q) = eq else {
            return Token {
                name,
                value: None,
                len,
            };
        };
        let value_start = q + 1;
        let mut v = value_start;
        while matches!(self.at(v), b' ' | b'\t' | b'\n') {
            v += 1;
        }
        len += (v + self.strlen(v) - value_start) + 1;
        self.strip_tail(v);
        Token {
            name,
            value: Some(v),
            len,
        }
    }

    fn strip_tail(&mut self, p: usize) {
        let mut q = p + self.strlen(p);
        while q != p && matches!(self.at(q), 0 | b' ' | b'\t' | b'\n') {
            self.set(q, 0);
            q -= 1;
        }
    }

    /// `parse_part_conf`: one `;`-delimited piece of a line. Returns bytes consumed.
    fn parse_entry_text(&mut self, st: &mut EntryState, start: usize) -> Result<usize, ParseError> {
        let mut p = start;
        if matches!(self.at(p), b'\t' | 0 | b'\n') {
            p += 1;
        }
        let mut len = p - start;
        if st.entry.is_none() {
            let Some(colon) = self.strchr(p, b':') else {
                let text = self.cstr(p);
                let crlf = if text.contains(&b'\r') {
                    " (the text holds a carriage return: OpenSM does not accept CRLF line ends)"
                } else {
                    ""
                };
                return Err(self.fatal(
                    ParseErrorKind::NoPartitionDefinition,
                    format!(
                        "no partition definition found in {:?}: OpenSM logs PARSE ERROR and drops the file{crlf}",
                        lossy(&text)
                    ),
                ));
            };
            self.set(colon, 0);
            let members_start = colon + 1;
            let mut comma = self.strchr(p, b',');
            if let Some(c) = comma {
                self.set(c, 0);
            }
            let head = self.name_token(p);
            p += head.len;
            len += head.len;
            while comma.is_some() {
                comma = self.strchr(p, b',');
                if let Some(c) = comma {
                    self.set(c, 0);
                }
                let flag = self.name_token(p);
                p += flag.len;
                len += flag.len;
                self.entry_flag(st, &flag);
            }
            if p != members_start {
                return Err(self.fatal(
                    ParseErrorKind::BadPartitionDefinition,
                    "bad partition definition (the header is not `name=key, flags`)",
                ));
            }
            self.create_entry(st, &head)?;
        }
        loop {
            let comma = self.strchr(p, b',');
            if let Some(c) = comma {
                self.set(c, 0);
            }
            let tok = self.name_token(p);
            len += tok.len;
            if self.cstr(tok.name) == b"mgid" {
                len += self.multicast_group(st, p + tok.len, tok.value, comma.is_some())?;
                return Ok(len);
            }
            self.member(st, &tok)?;
            p += tok.len;
            if comma.is_none() {
                break;
            }
        }
        Ok(len)
    }

    /// `partition_create` + `osm_prtn_make_new`: resolves the key and registers the partition.
    fn create_entry(&mut self, st: &mut EntryState, head: &Token) -> Result<(), ParseError> {
        let (name, id) = self.name_and_id(head);
        let key16 = match &id {
            Some(id) => Some(self.written_key(id)?),
            None => None,
        };
        let name_bytes = name.filter(|n| !n.is_empty());
        if let Some(n) = &name_bytes {
            if n.len() > KEY_NAME_MAX {
                self.warn(
                    WarningKind::NameTruncated,
                    format!(
                        "name {:?} is cut to 31 characters: {:?}",
                        lossy(n),
                        lossy(&n[..KEY_NAME_MAX])
                    ),
                );
            }
        }
        let base = key16.map_or(0, |k| k & 0x7FFF);
        let (base, origin) = if base == 0 {
            if key16.is_some() {
                self.warn(
                    WarningKind::KeyNotGiven,
                    "key 0 (or 0x8000) means no key: OpenSM picks one",
                );
            }
            self.key_without_value(name_bytes.as_deref())?
        } else {
            (base, KeyOrigin::Given)
        };
        let stored_name = name_bytes.map(|n| lossy(&n[..n.len().min(KEY_NAME_MAX)]));
        self.register_key(base, origin, stored_name.as_deref());
        st.entry = Some(Entry {
            line: self.line,
            name: stored_name,
            pkey: base,
            key_origin: origin,
            flags: std::mem::take(&mut st.flags),
            default_member: st.default_member,
            members: Vec::new(),
            multicast_groups: Vec::new(),
        });
        Ok(())
    }

    /// The entry head's name and key text: `name=key`, or a lone word that starts with a digit
    /// (a key without a name).
    fn name_and_id(&self, head: &Token) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        let name = self.cstr(head.name);
        match head.value {
            Some(v) => (Some(name), Some(self.cstr(v))),
            None if name.first().is_some_and(u8::is_ascii_digit) => (None, Some(name)),
            None => (Some(name), None),
        }
    }

    /// A written key as OpenSM reads it: a C integer cast to 16 bits (bit 15 kept here; the
    /// caller drops it).
    fn written_key(&mut self, id: &[u8]) -> Result<u16, ParseError> {
        let n = c_strtoul(id);
        if n.used == 0 || n.used != id.len() {
            return Err(self.fatal(
                ParseErrorKind::BadPartitionDefinition,
                format!(
                    "bad partition definition: key {:?} is not a C integer (hex 0x.., octal 0.., decimal)",
                    lossy(id)
                ),
            ));
        }
        // OpenSM casts the unsigned long to 16 bits.
        let key16 = (n.value & 0xFFFF) as u16;
        if n.negative || n.overflow || n.value > 0xFFFF {
            self.warn(
                WarningKind::KeyTruncated,
                format!("key {:?} is cut to 16 bits: {key16:#06x}", lossy(id)),
            );
        }
        if key16 & 0x8000 != 0 {
            self.warn(
                WarningKind::KeyTruncated,
                format!(
                    "key {key16:#06x}: bit 15 is ignored, the partition is {:#06x}",
                    key16 & 0x7FFF
                ),
            );
        }
        Ok(key16)
    }

    /// The key of an entry that gave none: an earlier entry's of the same name, else the next
    /// free generated one.
    fn key_without_value(&mut self, name: Option<&[u8]>) -> Result<(u16, KeyOrigin), ParseError> {
        let by_name = name.and_then(|n| {
            (n.len() <= KEY_NAME_MAX)
                .then(|| self.names.iter().find(|(s, _)| s == n).map(|(_, k)| *k))
                .flatten()
        });
        if let Some(k) = by_name {
            return Ok((k, KeyOrigin::ByName));
        }
        loop {
            if self.generated >= DEFAULT_BASE - 1 {
                return Err(self.fatal(
                    ParseErrorKind::KeysExhausted,
                    "bad partition definition: OpenSM has no free key left to generate",
                ));
            }
            self.generated += 1;
            if !self.taken.contains(&self.generated) {
                break;
            }
        }
        let base = self.generated;
        self.warn(
            WarningKind::KeyNotGiven,
            format!("no key: OpenSM generates {base:#06x} (generated keys change when entries are added)"),
        );
        Ok((base, KeyOrigin::Generated))
    }

    /// Records the key as taken (and its name for later entries), warning when the entry
    /// merges into an existing partition.
    fn register_key(&mut self, base: u16, origin: KeyOrigin, stored_name: Option<&str>) {
        if base == DEFAULT_BASE {
            if stored_name != Some("Default") {
                self.warn(
                    WarningKind::MergedIntoDefault,
                    "key 0x7fff: this entry merges into the default partition",
                );
            } else if std::mem::replace(&mut self.explicit_default, true) {
                self.warn(
                    WarningKind::Merged,
                    "Default is defined again: the entries merge into one partition",
                );
            }
        } else if !self.taken.insert(base) && origin != KeyOrigin::ByName {
            self.warn(
                WarningKind::Merged,
                format!("key {base:#06x} is defined again: the entries merge into one partition"),
            );
        } else if origin != KeyOrigin::ByName {
            let stored = stored_name.map_or_else(|| format!("{base:04x}"), str::to_owned);
            self.names.push((stored.into_bytes(), base));
        }
    }

    /// `parse_group_flag`: the multicast-group flags. Returns the full name when recognised.
    fn group_flag(&mut self, flag: &[u8], value: Option<&[u8]>) -> Option<&'static str> {
        let num = value.map(c_strtoul);
        let (name, ok) = if is_prefix(flag, "mtu") {
            ("mtu", num.is_some_and(|n| n.value != 0))
        } else if is_prefix(flag, "rate") {
            ("rate", num.is_some_and(|n| n.value != 0))
        } else if is_prefix(flag, "scope") {
            ("scope", num.is_some_and(|n| n.value != 0 && n.value <= 0xF))
        } else if is_prefix(flag, "Q_Key") {
            ("Q_Key", num.is_some_and(|n| n.value != 0))
        } else if is_prefix(flag, "TClass") {
            ("TClass", num.is_some_and(|n| n.value != 0))
        } else if is_prefix(flag, "sl") {
            ("sl", strict_number(value).is_some_and(|v| v <= 15))
        } else if is_prefix(flag, "FlowLabel") {
            (
                "FlowLabel",
                strict_number(value).is_some_and(|v| v <= 0xFFFFF),
            )
        } else {
            return None;
        };
        if flag != name.as_bytes() {
            self.warn(
                WarningKind::Abbreviation,
                format!("flag {:?} is read as {name:?}", lossy(flag)),
            );
        }
        if !ok {
            self.warn(
                WarningKind::IgnoredFlag,
                format!(
                    "flag {name:?} has no valid value ({:?}): OpenSM skips it",
                    value.map(lossy).unwrap_or_default()
                ),
            );
        }
        Some(name)
    }

    /// `partition_add_flag`.
    fn entry_flag(&mut self, st: &mut EntryState, tok: &Token) {
        let flag = self.cstr(tok.name);
        let value = tok.value.map(|v| self.cstr(v));
        let recognised = if let Some(name) = self.group_flag(&flag, value.as_deref()) {
            Some(name)
        } else if is_prefix(&flag, "ipoib") {
            Some("ipoib")
        } else if is_prefix(&flag, "defmember") {
            let v = value.clone().unwrap_or_default();
            let chosen = if value.is_none() {
                None
            } else if is_prefix(&v, "full") {
                Some(MemberKind::Full)
            } else if is_prefix(&v, "both") {
                Some(MemberKind::Both)
            } else if is_prefix(&v, "limited") {
                Some(MemberKind::Limited)
            } else {
                None
            };
            match chosen {
                Some(kind) => {
                    if v.is_empty() {
                        self.warn(
                            WarningKind::EmptyValue,
                            "\"defmember=\" with no value means full",
                        );
                    } else if v != kind.to_string().as_bytes() {
                        self.warn(
                            WarningKind::Abbreviation,
                            format!("defmember value {:?} is read as {kind}", lossy(&v)),
                        );
                    }
                    st.default_member = kind;
                }
                None => self.warn(
                    WarningKind::IgnoredFlag,
                    format!(
                        "defmember value {:?} is not limited, full or both: OpenSM skips the flag",
                        lossy(&v)
                    ),
                ),
            }
            Some("defmember")
        } else if flag == b"indx0" {
            Some("indx0")
        } else {
            self.warn(
                WarningKind::IgnoredFlag,
                format!(
                    "unknown partition flag {:?}: OpenSM ignores it",
                    lossy(&flag)
                ),
            );
            None
        };
        if let Some(name) = recognised {
            if matches!(name, "ipoib" | "defmember") && flag != name.as_bytes() {
                self.warn(
                    WarningKind::Abbreviation,
                    format!("flag {:?} is read as {name:?}", lossy(&flag)),
                );
            }
        }
        st.flags.push(EntryFlag {
            name: recognised.map_or_else(|| lossy(&flag), str::to_owned),
            value: value.map(|v| lossy(&v)),
            recognised: recognised.is_some(),
        });
    }

    /// `partition_add_port`.
    fn member(&mut self, st: &mut EntryState, tok: &Token) -> Result<(), ParseError> {
        let name = self.cstr(tok.name);
        if name.is_empty() {
            return Ok(());
        }
        if is_prefix(&name, "NONE") {
            if name != b"NONE" {
                self.warn(
                    WarningKind::Abbreviation,
                    format!("member {:?} is read as NONE (no port)", lossy(&name)),
                );
            }
            return Ok(());
        }
        let kind = match tok.value {
            Some(v) => {
                let flag = self.cstr(v);
                self.membership(&name, &flag)
            }
            None => st.default_member,
        };
        let ports = self.member_ports(&name)?;
        if kind == MemberKind::Both {
            self.warn(
                WarningKind::BothMembership,
                format!(
                    "{ports} is a \"both\" member: full unless OpenSM runs with allow_both_pkeys"
                ),
            );
        }
        let line = self.line;
        if let Some(e) = st.entry.as_mut() {
            e.members.push(Member { line, ports, kind });
        }
        Ok(())
    }

    /// A member's `=flag`: full, both, else limited (OpenSM's reading, with a warning for an
    /// empty, unknown or abbreviated flag).
    fn membership(&mut self, name: &[u8], flag: &[u8]) -> MemberKind {
        let kind = if is_prefix(flag, "full") {
            MemberKind::Full
        } else if is_prefix(flag, "both") {
            MemberKind::Both
        } else {
            MemberKind::Limited
        };
        if flag.is_empty() {
            self.warn(
                WarningKind::EmptyValue,
                format!(
                    "member {:?} has an empty '=': OpenSM reads it as full",
                    lossy(name)
                ),
            );
        } else if kind == MemberKind::Limited && !is_prefix(flag, "limited") {
            self.warn(
                WarningKind::UnknownMembership,
                format!(
                    "membership {:?} of {:?} is unknown: OpenSM silently uses limited",
                    lossy(flag),
                    lossy(name)
                ),
            );
        } else if flag != kind.to_string().as_bytes() {
            self.warn(
                WarningKind::Abbreviation,
                format!("membership {:?} is read as {kind}", lossy(flag)),
            );
        }
        kind
    }

    /// The ports a member names: a keyword (`ALL`, `ALL_CAS`, `ALL_SWITCHES`, `ALL_ROUTERS`,
    /// `SELF`, or a prefix of one) or a port GUID.
    fn member_ports(&mut self, name: &[u8]) -> Result<PortSet, ParseError> {
        let keyword = [
            ("ALL", PortSet::All),
            ("ALL_CAS", PortSet::AllCas),
            ("ALL_SWITCHES", PortSet::AllSwitches),
            ("ALL_ROUTERS", PortSet::AllRouters),
            ("SELF", PortSet::SmPort),
        ]
        .into_iter()
        .find(|(k, _)| is_prefix(name, k));
        if let Some((word, set)) = keyword {
            if name != word.as_bytes() {
                let kind = if name == b"ALL_" {
                    WarningKind::AmbiguousKeyword
                } else {
                    WarningKind::Abbreviation
                };
                self.warn(kind, format!("member {:?} is read as {word}", lossy(name)));
            }
            return Ok(set);
        }
        let n = c_strtoul(name);
        if n.value == 0 || n.used == 0 || n.used != name.len() {
            return Err(self.fatal(
                ParseErrorKind::BadPortGuid,
                format!(
                    "bad PortGUID {:?} (not a keyword and not a non-zero number): OpenSM logs PARSE ERROR and drops the file",
                    lossy(name)
                ),
            ));
        }
        if !n.hex || n.negative || n.overflow {
            self.warn(
                WarningKind::OddGuid,
                format!(
                    "GUID {:?} is not written as 0x-hex: OpenSM reads it as {:#018x}",
                    lossy(name),
                    n.value
                ),
            );
        }
        Ok(PortSet::Guid(Guid(n.value)))
    }

    /// `mgroup_create`: an `mgid=` member consumes the rest of the piece as group flags.
    fn multicast_group(
        &mut self,
        st: &mut EntryState,
        flags_start: usize,
        mgid: Option<usize>,
        has_flags: bool,
    ) -> Result<usize, ParseError> {
        let Some(m) = mgid else {
            return Err(self.fatal(
                ParseErrorKind::MulticastGroupWithoutValue,
                "\"mgid\" without '=': OpenSM 3.3 crashes on it",
            ));
        };
        let text = lossy(&self.cstr(m));
        let valid = text
            .parse::<Ipv6Addr>()
            .is_ok_and(|a| a.octets()[0] == 0xff);
        let line = self.line;
        if !valid {
            self.out.logged_parse_errors += 1;
            self.warn(
                WarningKind::BadMulticastGroup,
                format!("mgid {text:?} is not a multicast GID: OpenSM logs a PARSE ERROR line and skips the group"),
            );
            if let Some(e) = st.entry.as_mut() {
                e.multicast_groups.push(MulticastGroup {
                    line,
                    mgid: text,
                    flags: Vec::new(),
                    valid: false,
                });
            }
            return Ok(0);
        }
        if !has_flags {
            self.warn(
                WarningKind::UnpredictableMulticastGroup,
                format!("mgid {text:?} has no flags after it: OpenSM reads the bytes after the line end as its flags; add one (e.g. \",sl=0\")"),
            );
        }
        let mut p = flags_start;
        let mut len = 0;
        let mut flags = Vec::new();
        loop {
            let comma = self.strchr(p, b',');
            if let Some(c) = comma {
                self.set(c, 0);
            }
            let tok = self.name_token(p);
            let flag = self.cstr(tok.name);
            let value = tok.value.map(|v| self.cstr(v));
            if self.group_flag(&flag, value.as_deref()).is_none() {
                self.warn(
                    WarningKind::IgnoredFlag,
                    format!("unknown multicast group flag {:?}: ignored", lossy(&flag)),
                );
            }
            flags.push((lossy(&flag), value.map(|v| lossy(&v))));
            p += tok.len;
            len += tok.len;
            if comma.is_none() {
                break;
            }
        }
        if let Some(e) = st.entry.as_mut() {
            e.multicast_groups.push(MulticastGroup {
                line,
                mgid: text,
                flags,
                valid: true,
            });
        }
        Ok(len)
    }
}

/// `strtoul(val, &end, 0)` that must consume everything up to trailing white space.
fn strict_number(value: Option<&[u8]>) -> Option<u64> {
    let v = value.filter(|v| !v.is_empty())?;
    let n = c_strtoul(v);
    let rest_ok = v
        .get(n.used..)
        .is_some_and(|r| r.first().is_none_or(|b| is_c_space(*b)));
    rest_ok.then_some(n.value)
}

#[cfg(test)]
mod tests;
