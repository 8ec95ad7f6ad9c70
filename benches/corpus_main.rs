//! `gstore-corpus`: writes the benchmark corpus (see corpus.rs).
//!
//! Usage: gstore-corpus DIR [SIZE_MIB] [SEED] [--base-only] — writes DIR/base and DIR/next;
//! with --floats instead DIR/bf16 and DIR/fp32 (float data, SIZE_MIB each; see write_floats).

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 2 {
        eprintln!("usage: gstore-corpus DIR [SIZE_MIB (default 1024)] [SEED (default 1)] [--base-only | --floats]");
        std::process::exit(2);
    }
    let dir = std::path::Path::new(&args[1]);
    let mib: usize = args.get(2).map(|s| s.parse().expect("SIZE_MIB is a number")).unwrap_or(1024);
    let seed: u64 = args.get(3).map(|s| s.parse().expect("SEED is a number")).unwrap_or(1);
    let run = || -> std::io::Result<()> {
        if args.iter().any(|a| a == "--floats") {
            return gstore_benches::write_floats(dir, mib << 20, seed);
        }
        gstore_benches::write_base(&dir.join("base"), mib << 20, seed)?;
        if args.iter().any(|a| a == "--base-only") {
            return Ok(());
        }
        gstore_benches::write_next(&dir.join("base"), &dir.join("next"), seed)
    };
    if let Err(e) = run() {
        eprintln!("gstore-corpus: {e}");
        std::process::exit(1);
    }
}
