//! The GPU chunk check's BLAKE3 (src/cuda/kernels/verify.cu), compiled for the host with the
//! system C++ compiler and run over slices of every shape the tree takes — empty, one block,
//! one chunk, powers of two and one past them, subtrees of several chunks per thread, unaligned
//! starts — must agree with the blake3 crate. The kernel itself runs on a GPU in
//! tests/gpu/load_bench.sh.

use std::path::Path;
use std::process::Command;

#[test]
fn the_kernel_hash_matches_blake3_for_every_tree_shape() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("check_kernel_host");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_kernel_host.cpp");
    let status = Command::new("c++")
        .args(["-O2", "-std=c++17", "-Wall", "-Wno-unknown-pragmas", "-Werror", "-x", "c++", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("run c++ (a C++ compiler is needed for this test)");
    assert!(status.success(), "building {} failed", source.display());
    let mut data = vec![0u8; 20 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let file = dir.path().join("data");
    std::fs::write(&file, &data).unwrap();
    let lens = [
        0usize,
        1,
        63,
        64,
        65,
        1023,
        1024,
        1025,
        2048,
        2049,
        3072,
        5000,
        65536,
        65537,
        131072,
        131073,
        262143,
        262144,
        300_000,
        1 << 20,
        (1 << 20) + 1,
        16 << 20,
        (16 << 20) + 777,
    ];
    let slices: Vec<(usize, usize)> = lens.iter().enumerate().map(|(i, &l)| (i % 7, l)).collect();
    let out = Command::new(&exe)
        .arg(&file)
        .args(slices.iter().map(|(o, l)| format!("{o}:{l}")))
        .output()
        .expect("run the host build of the kernel hash");
    assert!(out.status.success());
    let got: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    assert_eq!(got.len(), slices.len());
    for ((o, l), g) in slices.iter().zip(&got) {
        assert_eq!(g, &blake3::hash(&data[*o..*o + *l]).to_hex().to_string(), "{l} bytes at offset {o}");
    }
}
