//! cargo-fuzz's entry for the `server` target (its code: fuzz/targets/server.rs, which
//! tests/fuzz_replay.rs also runs on every kept input in the main build).
#![no_main]
#[path = "../targets/server.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
