#![no_main]
// Placeholder until the MAD codec lands.
libfuzzer_sys::fuzz_target!(|_data: &[u8]| {});
