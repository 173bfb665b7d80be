#![no_main]
//! Feeds arbitrary bytes to the partitions.conf parser and the region splitter. Neither may
//! panic; a file the parser accepts must, once re-rendered from its entries, parse again to the
//! same partitions.

use fabric_agent::domain::is_safe_key_name;
use fabric_agent::sm::opensm::parse::parse;
use fabric_agent::sm::opensm::region::split_region;
use fabric_agent::sm::opensm::render::{render_entry, EntrySpec};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = split_region(data);
    let Ok(conf) = parse(data) else { return };
    let mut text = String::new();
    for e in &conf.entries {
        render_entry(
            &mut text,
            &EntrySpec {
                name: e.name.clone().filter(|n| is_safe_key_name(n)),
                pkey: e.pkey,
                flags: Vec::new(),
                members: e.members.iter().map(|m| (m.ports, m.kind)).collect(),
            },
        );
    }
    let again = parse(text.as_bytes()).expect("rendered entries must parse");
    let members = |c: &fabric_agent::sm::opensm::model::PartitionsConf| {
        c.effective()
            .into_iter()
            .map(|(k, p)| {
                (
                    k,
                    p.members
                        .iter()
                        .map(|m| (m.ports, m.kind))
                        .collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(members(&conf), members(&again));
});
