//! The reader against OpenSM's behaviour, construct by construct.

use super::*;

fn ok(text: &str) -> PartitionsConf {
    parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn err(text: &str) -> ParseErrorKind {
    parse(text.as_bytes()).expect_err(text).kind
}

fn kinds(c: &PartitionsConf) -> Vec<WarningKind> {
    c.warnings.iter().map(|w| w.kind).collect()
}

#[test]
fn strtoul_reads_c_integers() {
    assert_eq!(c_strtoul(b"0x8001").value, 0x8001);
    assert_eq!(c_strtoul(b"010").value, 8);
    assert_eq!(c_strtoul(b"10").value, 10);
    assert_eq!(c_strtoul(b"0x").used, 1);
    assert_eq!(c_strtoul(b"08").used, 1);
    assert_eq!(c_strtoul(b"-1").value, u64::MAX);
    assert!(c_strtoul(b"99999999999999999999999").overflow);
    assert_eq!(c_strtoul(b"zz").used, 0);
}

#[test]
fn reads_a_plain_entry() {
    let c = ok(
        "Default=0x7fff, ipoib : ALL=full;\nt1=0x8001 : 0x0002c903000e0b72=full, 0x10=limited;\n",
    );
    assert_eq!(c.entries.len(), 2);
    assert!(c.has_explicit_default());
    let t = &c.entries[1];
    assert_eq!(t.pkey, 1);
    assert_eq!(t.name.as_deref(), Some("t1"));
    assert_eq!(
        t.members[0].ports,
        PortSet::Guid(Guid(0x0002_c903_000e_0b72))
    );
    assert_eq!(t.members[0].kind, MemberKind::Full);
    assert_eq!(t.members[1].kind, MemberKind::Limited);
    assert!(kinds(&c).contains(&WarningKind::KeyTruncated));
}

#[test]
fn members_span_lines_and_entries_share_lines() {
    let c = ok("a=0x1 :\n  0x10=full,\n  0x11 ;  b=0x2 : ALL;\n");
    assert_eq!(c.entries.len(), 2);
    assert_eq!(c.entries[0].members.len(), 2);
    assert_eq!(c.entries[1].members[0].ports, PortSet::All);
}

#[test]
fn prefixes_and_typos() {
    let c = ok("x=0x5 : A=f, 0x10=fulll, 0x11=, N;\n");
    let m = &c.entries[0].members;
    assert_eq!((m[0].ports, m[0].kind), (PortSet::All, MemberKind::Full));
    assert_eq!(m[1].kind, MemberKind::Limited);
    assert_eq!(m[2].kind, MemberKind::Full);
    assert_eq!(m.len(), 3);
    let k = kinds(&c);
    assert!(k.contains(&WarningKind::UnknownMembership));
    assert!(k.contains(&WarningKind::EmptyValue));
    assert!(k.contains(&WarningKind::Abbreviation));
}

#[test]
fn fatal_forms() {
    assert_eq!(err(""), ParseErrorKind::NoEntries);
    assert_eq!(err("# only a comment\n\n"), ParseErrorKind::NoEntries);
    assert_eq!(
        err("Default=0x7fff : ALL=full;\r\n"),
        ParseErrorKind::NoPartitionDefinition
    );
    assert_eq!(err("a=0x1 : 0xzz;\n"), ParseErrorKind::BadPortGuid);
    assert_eq!(err("a=0x1 : 0x0;\n"), ParseErrorKind::BadPortGuid);
    assert_eq!(
        err("a=0x1x : ALL;\n"),
        ParseErrorKind::BadPartitionDefinition
    );
    assert_eq!(
        err("a=0x1\n : ALL;\n"),
        ParseErrorKind::NoPartitionDefinition
    );
    assert_eq!(err("a=0x1 : MGID=ff12::1;\n"), ParseErrorKind::BadPortGuid);
    assert_eq!(
        err("a=0x1 : mgid;\n"),
        ParseErrorKind::MulticastGroupWithoutValue
    );
    assert_eq!(
        err("include other.conf\n"),
        ParseErrorKind::NoPartitionDefinition
    );
}

#[test]
fn keys_generated_merged_and_defaulted() {
    let c = ok("a : ALL;\nb=0x1 : SELF;\nc=0x7fff : ALL=full;\nd=0x18001 : ALL;\na : 0x5;\n");
    assert_eq!(c.entries[0].pkey, 1);
    assert_eq!(c.entries[0].key_origin, KeyOrigin::Generated);
    assert_eq!(c.entries[1].pkey, 1);
    assert_eq!(c.entries[2].pkey, DEFAULT_BASE);
    assert_eq!(c.entries[3].pkey, 1);
    assert_eq!(c.entries[4].key_origin, KeyOrigin::ByName);
    let k = kinds(&c);
    assert!(k.contains(&WarningKind::Merged));
    assert!(k.contains(&WarningKind::MergedIntoDefault));
    assert!(c.has_explicit_default());
    assert_eq!(c.effective()[&1].members.len(), 4);
}

#[test]
fn names_are_cut() {
    let long = "n".repeat(40);
    let c = ok(&format!("{long}=0x3 : ALL"));
    assert_eq!(c.entries[0].name.as_deref().map(str::len), Some(31));
    assert!(c.open_entry_at_end);
}

#[test]
fn long_lines_split_tokens() {
    let pad = " ".repeat(MAX_LINE_PIECE - 20);
    // The GUID straddles the 4094-byte boundary and becomes two GUIDs.
    let text = format!("a=0x1 :{pad}0x0002c90300123456;\n");
    let c = ok(&text);
    assert!(kinds(&c).contains(&WarningKind::LongLine));
    assert_eq!(c.entries[0].members.len(), 2);
}

#[test]
fn multicast_groups() {
    let c = ok("Default=0x7fff,ipoib : ALL=full, mgid=ff12:401b::0707,sl=1;\n");
    assert_eq!(c.entries[0].multicast_groups.len(), 1);
    let c = ok("a=0x1 : ALL,\n mgid=fe80::1, sl=1\n 0x10;\n");
    assert_eq!(c.logged_parse_errors, 1);
    assert!(!c.entries[0].multicast_groups[0].valid);
    assert_eq!(c.entries[0].members.len(), 2);
    // A rejected mgid leaves its flags unread; after a ';' they start a new "entry".
    assert_eq!(
        err("a=0x1 : ALL, mgid=fe80::1, sl=1;\n"),
        ParseErrorKind::NoPartitionDefinition
    );
}

#[test]
fn flags() {
    let c = ok("a=0x1, ipoib, defmember=full, mtu=4, rate=7, sl=1, scope=2, Q_Key=0x1, TClass=1, FlowLabel=5, indx0, bogus : 0x10;");
    let e = &c.entries[0];
    assert_eq!(e.members[0].kind, MemberKind::Full);
    assert_eq!(e.flags.iter().filter(|f| f.recognised).count(), 10);
    assert!(kinds(&c).contains(&WarningKind::IgnoredFlag));
}

#[test]
fn table_entries_count_keywords() {
    let c = ok("Default=0x7fff : ALL=limited, SELF=full;\na=0x1 : 0x10=full;\nb=0x2 : ALL_CAS;\nc=0x3 : ALL_SWITCHES;");
    assert_eq!(c.table_entries_for(Guid(0x10), false), 3);
    assert_eq!(c.table_entries_for(Guid(0x11), false), 2);
}
