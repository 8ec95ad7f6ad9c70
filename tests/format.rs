//! docs/FORMAT.md is enough to write a compatible writer: an independent implementation of its
//! chunker (tests/format_chunker.py, written from the document alone) cuts a file exactly
//! where gstore did.

use gstore_tests::*;
use std::fs;

#[test]
fn the_documented_chunker_cuts_where_gstore_does() {
    let env = Env::new(&[]);
    let src = env.path("f.bin");
    // Random bytes across a segment edge, with a zero run and a short repeat inside.
    let mut data = random_bytes(18 << 20, 3);
    data[(2 << 20)..(3 << 20)].fill(0);
    data[(5 << 20)..(5 << 20) + 100].fill(b'x');
    fs::write(&src, &data).unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "f"]);
    let m = env.json(&["ls"])[0]["manifest"].as_str().unwrap().to_string();
    let id = gstore_store::ObjectId::from_hex(&m).unwrap();
    let bytes = fs::read(env.store.join(gstore_store::key::ObjectKey::Manifest(id).to_string())).unwrap();
    let manifest = gstore_store::manifest::Manifest::decode(&bytes, &id).unwrap();
    let gstore: Vec<u32> = manifest.chunks.iter().map(|c| c.len).collect();
    let out = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("format_chunker.py"))
        .arg(&src)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let documented: Vec<u32> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert!(gstore.len() > 200, "{} chunks", gstore.len());
    assert_eq!(documented, gstore);
}
