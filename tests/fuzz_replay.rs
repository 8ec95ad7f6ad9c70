//! Every input the fuzz targets keep — their corpus (fuzz/corpus/TARGET) and the inputs that
//! once crashed them (fuzz/regressions/TARGET) — run through the targets' own code
//! (fuzz/targets) in the main build, so CI checks every kept input without a second,
//! sanitizer-instrumented build of the whole dependency tree. Coverage-guided fuzzing with
//! AddressSanitizer is `scripts/fuzz.sh`.

#[path = "../fuzz/targets/chunk.rs"]
mod chunk;
#[path = "../fuzz/targets/criu.rs"]
mod criu;
#[path = "../fuzz/targets/manifest.rs"]
mod manifest;
#[path = "../fuzz/targets/pack.rs"]
mod pack;
#[path = "../fuzz/targets/records.rs"]
mod records;
#[path = "../fuzz/targets/server.rs"]
mod server;

/// Runs every kept input of `target` through `run`; fails naming each input that panics.
fn replay(target: &str, run: fn(&[u8])) {
    let fuzz = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (set by cargo test and nextest)"),
    )
    .join("../fuzz");
    let mut inputs = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(dir) = std::fs::read_dir(fuzz.join(kind).join(target)) else { continue };
        inputs.extend(dir.map(|e| e.unwrap().path()));
    }
    assert!(!inputs.is_empty(), "no kept inputs for fuzz target {target}");
    inputs.sort();
    let failed: Vec<String> = inputs
        .iter()
        .filter(|p| {
            let data = std::fs::read(p).unwrap();
            std::panic::catch_unwind(|| run(&data)).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{target}: {} of {} inputs fail: {failed:?}", failed.len(), inputs.len());
}

#[test]
fn chunk_inputs() {
    replay("chunk", chunk::run);
}

#[test]
fn criu_inputs() {
    replay("criu", criu::run);
}

#[test]
fn manifest_inputs() {
    replay("manifest", manifest::run);
}

#[test]
fn pack_inputs() {
    replay("pack", pack::run);
}

#[test]
fn records_inputs() {
    replay("records", records::run);
}

#[test]
fn server_inputs() {
    replay("server", server::run);
}
