//! Per-core micro benchmarks of the ingest and restore building blocks on corpus-like data:
//! FastCDC chunking, BLAKE3 hashing, zstd compression and decompression.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gstore_benches::{fill_region, Region};
use gstore_store::{chunker, codec, ObjectId, StoreConfig};
use rand::SeedableRng;
use std::hint::black_box;

fn mixed(len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut v = vec![0u8; len];
    let kinds = [Region::Zero, Region::Bf16, Region::F32, Region::Heap, Region::Random];
    for (i, part) in v.chunks_mut(1 << 20).enumerate() {
        fill_region(kinds[i % kinds.len()], part, &mut rng);
    }
    v
}

fn bench(c: &mut Criterion) {
    let cfg = StoreConfig::default();
    let data = mixed(64 << 20);
    let spans = chunker::cut_segment(&data, &cfg);
    let encoded: Vec<(codec::Codec, Vec<u8>, usize, ObjectId)> = spans
        .iter()
        .map(|s| {
            let (c, b) = codec::Encoder::new(cfg.zstd_level, cfg.float_codec).unwrap().encode(&data[s.clone()]);
            (c, b, s.len(), ObjectId::of(&data[s.clone()]))
        })
        .collect();

    let mut g = c.benchmark_group("per-core");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_function("fastcdc", |b| b.iter(|| black_box(chunker::cut_segment(&data, &cfg).len())));
    g.bench_function("blake3", |b| {
        b.iter(|| {
            spans.iter().for_each(|s| {
                black_box(ObjectId::of(&data[s.clone()]));
            })
        })
    });
    g.bench_function("zstd-1-encode", |b| {
        let mut enc = codec::Encoder::new(1, true).unwrap();
        b.iter(|| {
            spans.iter().for_each(|s| {
                black_box(enc.encode(&data[s.clone()]));
            })
        })
    });
    g.bench_function("decode+verify", |b| {
        let mut dec = codec::Decoder::new(cfg.chunk_max);
        let mut out = Vec::with_capacity(1 << 20);
        b.iter(|| {
            encoded.iter().for_each(|(c, s, n, id)| {
                out.clear();
                dec.decode_append(*c, s, *n, id, &mut out).unwrap();
            })
        })
    });
    g.finish();

    // bf16 weights alone: the float codec against zstd-1, encode and decode+verify per core.
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut bf16 = vec![0u8; 64 << 20];
    fill_region(Region::Bf16, &mut bf16, &mut rng);
    let spans = chunker::cut_segment(&bf16, &cfg);
    let mut g = c.benchmark_group("per-core-bf16");
    g.throughput(Throughput::Bytes(bf16.len() as u64));
    g.sample_size(10);
    for (name, floats) in [("zstd-1", false), ("floats", true)] {
        let encoded: Vec<(codec::Codec, Vec<u8>, usize, ObjectId)> = spans
            .iter()
            .map(|s| {
                let (c, b) = codec::Encoder::new(1, floats).unwrap().encode(&bf16[s.clone()]);
                (c, b, s.len(), ObjectId::of(&bf16[s.clone()]))
            })
            .collect();
        g.bench_function(format!("{name}-encode"), |b| {
            let mut enc = codec::Encoder::new(1, floats).unwrap();
            b.iter(|| spans.iter().for_each(|s| drop(black_box(enc.encode(&bf16[s.clone()])))))
        });
        g.bench_function(format!("{name}-decode+verify"), |b| {
            let mut dec = codec::Decoder::new(cfg.chunk_max);
            let mut out = Vec::with_capacity(1 << 20);
            b.iter(|| {
                encoded.iter().for_each(|(c, s, n, id)| {
                    out.clear();
                    dec.decode_append(*c, s, *n, id, &mut out).unwrap();
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
