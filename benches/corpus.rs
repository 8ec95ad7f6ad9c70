//! A generator of checkpoint-like test data for gstore's benchmarks.
//!
//! An image is a directory shaped like a CRIU dump of a GPU process: a few small metadata
//! files and large `pages-N.img` files made of page-aligned regions of five kinds —
//! runs of zero pages, float32 weights, bf16 weights, pointer-rich heap pages and
//! incompressible bytes. A "next" image repeats most of a base image with the kind of change a
//! second checkpoint of a similar process has: small insertions that shift everything after
//! them, a few edited pages, and a little new data. Everything is derived from a seed.

use rand::{Rng, RngCore, SeedableRng};
use std::fs;
use std::io::Write;
use std::path::Path;

/// Page size the regions are aligned to.
pub const PAGE: usize = 4096;

/// The kinds of region an image is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Zero pages (untouched allocations).
    Zero,
    /// float32 values of a small-magnitude weight tensor.
    F32,
    /// bf16 values of a weight tensor.
    Bf16,
    /// Heap pages: small integers and pointers into a few arenas (compress well).
    Heap,
    /// Incompressible bytes (already compressed or encrypted data).
    Random,
}

/// Fills `out` with one region's worth of bytes.
pub fn fill_region(kind: Region, out: &mut [u8], rng: &mut impl RngCore) {
    match kind {
        Region::Zero => out.fill(0),
        Region::Random => rng.fill_bytes(out),
        Region::F32 => {
            for w in out.chunks_exact_mut(4) {
                // Roughly N(0, 0.02): the sum of three uniforms, scaled.
                let u: f32 = (0..3).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 0.04;
                w.copy_from_slice(&u.to_le_bytes());
            }
        }
        Region::Bf16 => {
            for w in out.chunks_exact_mut(2) {
                let u: f32 = (0..3).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 0.04;
                w.copy_from_slice(&((u.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        Region::Heap => {
            let arenas = [0x7f3a_1000_0000u64, 0x5555_7000_0000, 0x7ffd_2000_0000];
            for w in out.chunks_exact_mut(8) {
                let v = match rng.random_range(0..4) {
                    0 => arenas[rng.random_range(0..3)] + rng.random_range(0..1u64 << 20) * 16,
                    1 => rng.random_range(0..256),
                    2 => 0,
                    _ => 0x0000_0001_0000_0000 | rng.random_range(0..64),
                };
                w.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

fn pick_kind(rng: &mut impl RngCore) -> Region {
    match rng.random_range(0..100) {
        0..25 => Region::Zero,
        25..50 => Region::Bf16,
        50..70 => Region::F32,
        70..90 => Region::Heap,
        _ => Region::Random,
    }
}

/// Writes one pages file of about `size` bytes, region by region.
fn write_pages(path: &Path, size: usize, rng: &mut impl RngCore) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, fs::File::create(path)?);
    let mut buf = vec![0u8; 512 * PAGE];
    let mut written = 0;
    while written < size {
        let pages = rng.random_range(1..=512).min((size - written).div_ceil(PAGE));
        let region = &mut buf[..pages * PAGE];
        fill_region(pick_kind(rng), region, rng);
        f.write_all(region)?;
        written += region.len();
    }
    f.flush()
}

/// Writes a base image of about `size` bytes into `dir`.
pub fn write_base(dir: &Path, size: usize, seed: u64) -> std::io::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    fs::create_dir_all(dir)?;
    for name in ["core-1.img", "mm-1.img", "pagemap-1.img", "files.img"] {
        let mut small = vec![0u8; rng.random_range(200..20_000)];
        let words = small.len() / 8 * 8;
        fill_region(Region::Heap, &mut small[..words], &mut rng);
        fs::write(dir.join(name), small)?;
    }
    write_pages(&dir.join("pages-1.img"), size * 7 / 8, &mut rng)?;
    write_pages(&dir.join("pages-2.img"), size / 8, &mut rng)
}

/// Writes into `dir` a copy of the image in `base` changed the way a second checkpoint of a
/// similar process is: a few short insertions (shifting what follows), about 1 % of the pages
/// rewritten in runs of 16-64 pages plus 8 scattered single pages, and about 2 % new data
/// appended.
pub fn write_next(base: &Path, dir: &Path, seed: u64) -> std::io::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    fs::create_dir_all(dir)?;
    for e in fs::read_dir(base)? {
        let e = e?;
        let mut data = fs::read(e.path())?;
        if data.len() > 64 * PAGE {
            // About 1 % of the pages change, in runs of 16-64 pages (a KV cache, a few
            // activation buffers); a few single pages change too (allocator metadata).
            let pages = data.len() / PAGE;
            let mut edited = 0;
            while edited < pages / 100 {
                let run = rng.random_range(16..=64).min(pages);
                let at = rng.random_range(0..=pages - run) * PAGE;
                rng.fill_bytes(&mut data[at..at + run * PAGE]);
                edited += run;
            }
            for _ in 0..8 {
                let at = rng.random_range(0..pages) * PAGE;
                rng.fill_bytes(&mut data[at..at + PAGE]);
            }
            for _ in 0..4 {
                let at = rng.random_range(0..data.len());
                let mut ins = vec![0u8; rng.random_range(1..200)];
                rng.fill_bytes(&mut ins);
                data.splice(at..at, ins);
            }
            let mut tail = vec![0u8; data.len() / 50];
            fill_region(Region::Bf16, &mut tail, &mut rng);
            data.extend_from_slice(&tail);
        }
        fs::write(dir.join(e.file_name()), data)?;
    }
    Ok(())
}

/// Writes float data as trained models keep it, about `size` bytes each: `bf16/weights.bin`
/// (N(0, 0.02) bf16 weights) and a float32 training checkpoint in `fp32/` — `weights.bin`
/// (N(0, 0.02)), `adam-m.bin` (Adam's first moment, N(0, 1e-3)) and `adam-v.bin` (its second
/// moment: squared N(0, 1e-3) values, each scaled by a factor in 0.1..10).
pub fn write_floats(dir: &Path, size: usize, seed: u64) -> std::io::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = |rng: &mut rand::rngs::StdRng, scale: f32| -> f32 {
        (0..3).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 2.0 * scale
    };
    fs::create_dir_all(dir.join("bf16"))?;
    fs::create_dir_all(dir.join("fp32"))?;
    let mut bf16 = vec![0u8; size];
    fill_region(Region::Bf16, &mut bf16, &mut rng);
    fs::write(dir.join("bf16/weights.bin"), bf16)?;
    let third = size / 3 / 4;
    let write = |name: &str, values: Vec<f32>| {
        fs::write(dir.join("fp32").join(name), values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
    };
    write("weights.bin", (0..third).map(|_| normal(&mut rng, 0.02)).collect())?;
    write("adam-m.bin", (0..third).map(|_| normal(&mut rng, 1e-3)).collect())?;
    write(
        "adam-v.bin",
        (0..third)
            .map(|_| {
                let g = normal(&mut rng, 1e-3);
                g * g * 10f32.powf(rng.random::<f32>() * 2.0 - 1.0)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_and_next_differs_a_little() {
        let t = tempfile_dir();
        write_base(&t.join("a"), 2 << 20, 1).unwrap();
        write_base(&t.join("b"), 2 << 20, 1).unwrap();
        let read = |p: &Path| fs::read(p).unwrap();
        assert_eq!(read(&t.join("a/pages-1.img")), read(&t.join("b/pages-1.img")));
        write_next(&t.join("a"), &t.join("n"), 1).unwrap();
        let (a, n) = (read(&t.join("a/pages-1.img")), read(&t.join("n/pages-1.img")));
        assert_ne!(a, n);
        assert!(n.len() > a.len() && n.len() < a.len() * 11 / 10);
        fs::remove_dir_all(&t).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("gstore-corpus-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }
}
