//! gstore's GPU load kernel (src/cuda/kernels/load.cu) compiled for the host with the system C++
//! compiler, its parts run one emulated thread at a time. The chunk check's BLAKE3
//! (blake3.cuh), run over slices of every shape the tree takes — empty,
//! one block, one chunk, powers of two and one past them, subtrees of several chunks per
//! thread, unaligned starts — must agree with the blake3 crate, and its copy of each chunk to
//! its place must land whole at every offset from a 16-byte boundary; the float lanes' join
//! (floats.cuh) must rebuild words of 2 and 4 bytes with their tails, at every
//! such offset, and refuse lanes that did not decode whole. The kernels themselves run on a GPU in
//! tests/gpu/load_bench.sh.

use std::path::Path;
use std::process::Command;

/// Builds tests/NAME.cpp into `dir` and returns the executable's path.
fn build(dir: &Path, name: &str) -> std::path::PathBuf {
    let exe = dir.join(name);
    let source = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (set by cargo test and nextest)"),
    )
    .join(format!("tests/{name}.cpp"));
    let status = Command::new("c++")
        .args(["-O2", "-std=c++17", "-Wall", "-Wno-unknown-pragmas", "-Werror", "-x", "c++", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("run c++ (a C++ compiler is needed for this test)");
    assert!(status.success(), "building {} failed", source.display());
    exe
}

#[test]
fn the_lane_join_rebuilds_words_and_refuses_lanes_that_did_not_decode_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(build(dir.path(), "join_kernel_host")).output().expect("run the host build of the join");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // 13 lengths x 2 widths x (whole, bad status, bad length), less the damaged cases of
    // lengths shorter than one word; each at 16 offsets from a 16-byte boundary.
    assert_eq!(text.trim(), "ok 66", "every case ran");
}

/// Lanes coded by gstore's Huffman coder: lengths around substream edges, one symbol, all 256,
/// skewed like exponent bytes.
fn huffman_lanes() -> Vec<Vec<u8>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut lanes = Vec::new();
    for n in [0usize, 1, 2, 3, 1023, 1024, 1025, 4095, 4096, 4097, 32768, 131072 + 7, 200_000] {
        lanes.push(
            (0..n)
                .map(|_| {
                    let r = next();
                    0x3c - r.trailing_zeros().min(20) as u8 + ((r >> 40) as u8 & 0x80)
                })
                .collect(),
        );
    }
    lanes.push(vec![9u8; 5000]);
    lanes.push((0..20_000).map(|_| next() as u8).collect());
    lanes.push((0..3000).map(|_| (next() % 3) as u8).collect());
    lanes
}

#[test]
fn the_huffman_decode_accepts_what_the_host_accepts_and_decodes_it_alike() {
    use gstore_store::codec::huffman;
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "huffman_kernel_host");
    let mut cases: Vec<(Vec<u8>, usize)> = Vec::new();
    for lane in huffman_lanes() {
        let mut stored = Vec::new();
        huffman::Code::for_counts(&huffman::counts(&lane)).encode(&lane, &mut stored);
        let n = lane.len();
        // Damage of every kind: a flipped byte in the header, the ends and the bits; cut
        // short; a byte more; the wrong word count.
        for at in [0, 1, 2, stored.len() / 3, stored.len() / 2, stored.len().saturating_sub(1)] {
            if at < stored.len() {
                for flip in [0x01u8, 0x40] {
                    let mut bad = stored.clone();
                    bad[at] ^= flip;
                    cases.push((bad, n));
                }
            }
        }
        cases.push((stored[..stored.len() / 2].to_vec(), n));
        cases.push(([stored.as_slice(), &[0]].concat(), n));
        cases.push((stored.clone(), n + 1));
        cases.push((stored.clone(), n.saturating_sub(1024)));
        cases.push((stored, n));
    }
    let mut file = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for (stored, words) in &cases {
        let mut out = vec![0u8; *words];
        let ok = huffman::decode(stored, &mut out).is_ok();
        file.extend_from_slice(&(stored.len() as u32).to_le_bytes());
        file.extend_from_slice(&(*words as u32).to_le_bytes());
        file.push(ok as u8);
        file.extend_from_slice(stored);
        if ok {
            file.extend_from_slice(&out);
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    assert!(accepted >= 16 && refused >= 100, "{accepted} accepted, {refused} refused: both kinds are tried");
    let path = dir.path().join("cases");
    std::fs::write(&path, &file).unwrap();
    let out = Command::new(&exe).arg(&path).output().expect("run the host build of the Huffman decode");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.trim(), format!("ok {}", cases.len()), "every case ran");
}

#[test]
fn the_kernel_hash_matches_blake3_for_every_tree_shape() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "check_kernel_host");
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
    // Unkeyed (chunk ids of unencrypted stores) and keyed (encrypted stores).
    let key = [0x5au8; 32];
    for keyed in [false, true] {
        let out = Command::new(&exe)
            .arg(&file)
            .arg(if keyed { key.iter().map(|b| format!("{b:02x}")).collect() } else { "-".to_string() })
            .args(slices.iter().map(|(o, l)| format!("{o}:{l}")))
            .output()
            .expect("run the host build of the kernel hash");
        assert!(out.status.success());
        let got: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
        assert_eq!(got.len(), slices.len());
        for ((o, l), g) in slices.iter().zip(&got) {
            let slice = &data[*o..*o + *l];
            let want = if keyed { blake3::keyed_hash(&key, slice) } else { blake3::hash(slice) };
            assert_eq!(g, &want.to_hex().to_string(), "{l} bytes at offset {o}, keyed: {keyed}");
        }
    }
    // The copy of each checked chunk to its place: every slice, to every offset from a 16-byte
    // boundary (the harness compares the bytes and checks the bytes around them).
    let out = Command::new(&exe)
        .arg(&file)
        .arg("copy")
        .args(slices.iter().map(|(o, l)| format!("{o}:{l}")))
        .output()
        .expect("run the host build of the kernel copy");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.trim(), format!("copied {}", 16 * slices.len()), "every copy ran");
}
