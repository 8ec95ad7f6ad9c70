//! cargo-fuzz's entry for the `chunk` target (its code: fuzz/targets/chunk.rs, which
//! tests/fuzz_replay.rs also runs on every kept input in the main build).
#![no_main]
#[path = "../targets/chunk.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
