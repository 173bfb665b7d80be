#![no_main]
// Placeholder until the partitions.conf parser lands.
libfuzzer_sys::fuzz_target!(|_data: &[u8]| {});
