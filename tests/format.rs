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
    let bytes = fs::read(env.store.join(gstore_store::format::key::ObjectKey::Manifest(id).to_string())).unwrap();
    let manifest = gstore_store::format::manifest::Manifest::decode(&bytes, &id).unwrap();
    let gstore: Vec<u32> = manifest.chunks.iter().map(|c| c.len).collect();
    let out = std::process::Command::new("python3")
        .arg(
            std::path::PathBuf::from(
                std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (set by cargo test and nextest)"),
            )
            .join("format_chunker.py"),
        )
        .arg(&src)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let documented: Vec<u32> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert!(gstore.len() > 200, "{} chunks", gstore.len());
    assert_eq!(documented, gstore);
}

/// The hex name of the pack file at `path` (`packs/ab/<hex>.pack`).
fn pack_name(path: &std::path::Path) -> String {
    path.file_stem().unwrap().to_str().unwrap().to_string()
}

#[test]
fn packs_are_named_as_the_stores_config_says() {
    let env = Env::new(&[]);
    let src = env.path("f.bin");
    fs::write(&src, random_bytes(3 << 20, 7)).unwrap();
    // A new store names a pack by the BLAKE3 of its first 24 bytes and its footer and trailer.
    let config: serde_json::Value = serde_json::from_slice(&fs::read(env.store.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["pack_ids"], "header_footer");
    env.ok(&["push", src.to_str().unwrap(), "--tag", "new"]);
    for path in env.packs() {
        let bytes = fs::read(&path).unwrap();
        let footer_offset = u64::from_le_bytes(bytes[bytes.len() - 56..bytes.len() - 48].try_into().unwrap()) as usize;
        let named = [&bytes[..24], &bytes[footer_offset..]].concat();
        assert_eq!(pack_name(&path), gstore_store::ObjectId::of(&named).to_hex());
        assert_ne!(pack_name(&path), gstore_store::ObjectId::of(&bytes).to_hex());
    }
    // A store made before (its config without pack_ids) names packs by all their bytes.
    let old = Env::new(&[]);
    let mut before = config.clone();
    before.as_object_mut().unwrap().remove("pack_ids");
    fs::write(old.store.join("config.json"), serde_json::to_vec(&before).unwrap()).unwrap();
    old.ok(&["push", src.to_str().unwrap(), "--tag", "old"]);
    let packs = old.packs();
    assert!(!packs.is_empty());
    for path in packs {
        assert_eq!(pack_name(&path), gstore_store::ObjectId::of(&fs::read(&path).unwrap()).to_hex());
    }
    assert_eq!(old.json(&["verify", "--read-data"])["images"][0]["ok"], true);
}
