//! cargo-fuzz's entry for the `criu` target (its code: fuzz/targets/criu.rs, which
//! tests/fuzz_replay.rs also runs on every kept input in the main build).
#![no_main]
#[path = "../targets/criu.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
