//! The partitions.conf corpus: every grammar form OpenSM 3.3 reads, with what OpenSM does with
//! it. Each `tests/fixtures/partitions/NAME.conf` has a `NAME.expect` next to it:
//! `fatal KIND` for files OpenSM drops, else `entries N`, optional `default yes|no`,
//! `logged N` (PARSE ERROR lines OpenSM logs while keeping the file) and one `warn KIND` line per
//! kind of warning the parser must report (and no other kind).

use fabric_agent::domain::is_safe_key_name;
use fabric_agent::sm::opensm::model::{MemberKind, PortSet};
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::render::{render_entry, EntrySpec};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/partitions");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "conf") {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read(&p).unwrap();
            let expect = std::fs::read_to_string(p.with_extension("expect"))
                .unwrap_or_else(|_| panic!("{name}: missing .expect"));
            out.push((name, text, expect));
        }
    }
    out.sort();
    assert!(out.len() >= 30, "corpus too small: {}", out.len());
    out
}

#[test]
fn corpus_matches_expectations() {
    let mut failures = Vec::new();
    for (name, text, expect) in corpus() {
        let got = parse(&text);
        let mut want_warn = BTreeSet::new();
        for line in expect.lines() {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            match (k, &got) {
                ("fatal", Err(e)) if format!("{:?}", e.kind) == v => {}
                ("fatal", _) => failures.push(format!("{name}: want fatal {v}, got {got:?}")),
                ("entries", Ok(c)) if c.entries.len().to_string() == v => {}
                ("default", Ok(c)) if c.has_explicit_default() == (v == "yes") => {}
                ("logged", Ok(c)) if c.logged_parse_errors.to_string() == v => {}
                ("warn", _) => {
                    want_warn.insert(v.to_owned());
                }
                _ => failures.push(format!("{name}: {line:?} does not hold: {got:?}")),
            }
        }
        if let Ok(c) = &got {
            let have: BTreeSet<String> =
                c.warnings.iter().map(|w| format!("{:?}", w.kind)).collect();
            if have != want_warn {
                failures.push(format!(
                    "{name}: warnings {have:?}, want {want_warn:?}: {:#?}",
                    c.warnings
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every accepted file, re-rendered from its parsed entries, parses to the same partitions.
#[test]
fn accepted_corpus_round_trips_through_the_renderer() {
    for (name, text, _) in corpus() {
        let Ok(conf) = parse(&text) else { continue };
        let mut out = String::new();
        for e in &conf.entries {
            render_entry(
                &mut out,
                &EntrySpec {
                    name: e.name.clone().filter(|n| is_safe_key_name(n)),
                    pkey: e.pkey,
                    flags: Vec::new(),
                    members: e.members.iter().map(|m| (m.ports, m.kind)).collect(),
                },
            );
        }
        let again = parse(out.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}\n{out}"));
        let members = |c: &fabric_agent::sm::opensm::model::PartitionsConf| -> Vec<(u16, Vec<(PortSet, MemberKind)>)> {
            c.effective()
                .into_iter()
                .map(|(k, p)| (k, p.members.iter().map(|m| (m.ports, m.kind)).collect()))
                .collect()
        };
        assert_eq!(members(&conf), members(&again), "{name}\n{out}");
    }
}

/// The fuzz target's property on byte-level mutations of the corpus (a quick stand-in for a
/// fuzzing run): no panic, and accepted files re-render to the same partitions.
#[test]
fn mutated_corpus_never_panics_and_round_trips() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    const BYTES: &[u8] = b" \t\n\r;:,=#0x7fALSENUmgid-\\\x00";
    for (name, text, _) in corpus() {
        for _ in 0..300 {
            let mut t = text.clone();
            for _ in 0..1 + next() % 4 {
                let b = BYTES[(next() % BYTES.len() as u64) as usize];
                let at = if t.is_empty() {
                    0
                } else {
                    (next() % t.len() as u64) as usize
                };
                match next() % 3 {
                    0 if !t.is_empty() => t[at] = b,
                    1 if !t.is_empty() => {
                        t.remove(at);
                    }
                    _ => t.insert(at, b),
                }
            }
            let _ = fabric_agent::sm::opensm::region::split_region(&t);
            let Ok(conf) = parse(&t) else { continue };
            let mut out = String::new();
            for e in &conf.entries {
                render_entry(
                    &mut out,
                    &EntrySpec {
                        name: e.name.clone().filter(|n| is_safe_key_name(n)),
                        pkey: e.pkey,
                        flags: Vec::new(),
                        members: e.members.iter().map(|m| (m.ports, m.kind)).collect(),
                    },
                );
            }
            let again = parse(out.as_bytes()).unwrap_or_else(|e| {
                panic!(
                    "{name} mutated {:?}: {e}\n{out}",
                    String::from_utf8_lossy(&t)
                )
            });
            let members = |c: &fabric_agent::sm::opensm::model::PartitionsConf| -> Vec<(u16, Vec<(PortSet, MemberKind)>)> {
                c.effective()
                    .into_iter()
                    .map(|(k, p)| (k, p.members.iter().map(|m| (m.ports, m.kind)).collect()))
                    .collect()
            };
            assert_eq!(
                members(&conf),
                members(&again),
                "{name}: {:?}",
                String::from_utf8_lossy(&t)
            );
        }
    }
}
