//! What `smpquery` and OpenSM's subnet dump print, parsed: NodeInfo and PortInfo fields,
//! P_Key tables, the dump's CA ports.

/// NodeInfo fields smpquery prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmpNodeInfo {
    /// Node GUID.
    pub node_guid: u64,
    /// Port GUID.
    pub port_guid: u64,
    /// Partition capacity.
    pub partition_cap: u16,
    /// Local port number.
    pub local_port: u8,
}

/// PortInfo fields smpquery prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmpPortInfo {
    /// LID.
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// LinkState text, e.g. "Active".
    pub state: String,
}

/// The value of a `Name:.....value` line of smpquery output.
pub fn text_field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key == name).then(|| value.trim_start_matches('.').trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no field {name} in:\n{text}"))
}

pub(super) fn hex_field(text: &str, name: &str) -> u64 {
    let v = text_field(text, name);
    u64::from_str_radix(v.trim_start_matches("0x"), 16)
        .unwrap_or_else(|_| panic!("{name}: not hex: {v}"))
}

pub(super) fn dec_field(text: &str, name: &str) -> u64 {
    let v = text_field(text, name);
    v.parse()
        .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
}

/// The entries of `smpquery pkeys` output (`   0: 0xffff 0x8001 ...` rows).
pub fn parse_pkeys(text: &str) -> Vec<u16> {
    text.lines()
        .filter_map(|l| {
            let (index, rest) = l.split_once(':')?;
            index.trim().parse::<usize>().ok()?;
            Some(rest)
        })
        .flat_map(|rest| rest.split_whitespace())
        .map(|v| {
            u16::from_str_radix(v.trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("bad pkey {v}"))
        })
        .collect()
}

/// `{ CA ... PortGUID:<hex> ... {name} LID:<hex> PN:<hex> }` groups of `opensm-subnet.lst`:
/// name -> (port GUID, LID) of every CA port.
pub fn parse_subnet_dump(text: &str) -> std::collections::BTreeMap<String, (u64, u16)> {
    let mut out = std::collections::BTreeMap::new();
    for (at, _) in text.match_indices("{ CA") {
        let group = &text[at + 1..];
        let Some((head, rest)) = group.split_once('{') else {
            continue;
        };
        let Some((name, tail)) = rest.split_once('}') else {
            continue;
        };
        let field = |part: &str, key: &str| {
            part.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_owned)
        };
        let guid = field(head, "PortGUID:").and_then(|v| u64::from_str_radix(&v, 16).ok());
        let lid = tail
            .split('}')
            .next()
            .and_then(|t| field(t, "LID:"))
            .and_then(|v| u16::from_str_radix(&v, 16).ok());
        if let (Some(guid), Some(lid)) = (guid, lid) {
            out.insert(name.to_owned(), (guid, lid));
        }
    }
    out
}
