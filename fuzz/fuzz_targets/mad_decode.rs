#![no_main]
//! Arbitrary bytes through every MAD parser (header, SMP, SA MAD, NodeInfo, PortInfo,
//! P_KeyTable, PathRecord, NodeRecord, GetTable records): no panic, and whatever parses re-emits identically.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fabric_agent::mad::decode_everything(data);
});
