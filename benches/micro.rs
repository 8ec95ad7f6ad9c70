//! Per-core micro benchmarks of the ingest and restore building blocks on corpus-like data:
//! FastCDC chunking, BLAKE3 hashing, chunk encoding (zstd-1 alone, and the default choice
//! with the float codec) and decoding+verifying; the float codec (Huffman lanes, and zstd
//! lanes) and resemblance sketches on bf16 weights alone; sealing and opening for encrypted stores (a 48 MiB pack sealed, 16 MiB
//! ranges opened into a new buffer or a caller's); and index lookups (what planning a restore
//! costs per distinct chunk).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gstore_benches::{fill_region, Region};
use gstore_format::codec::huffman;
use gstore_format::{chunker, codec, similar, ObjectId, StoreConfig};
use gstore_store::crypto::sealed::{Header, Sealer};
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

/// Chunks of `data` as `spans` cut them, encoded: (codec, stored bytes, plain length, id).
type Encoded = Vec<(codec::Codec, Vec<u8>, usize, ObjectId)>;

fn encode_all(data: &[u8], spans: &[std::ops::Range<usize>], mut enc: codec::Encoder) -> Encoded {
    spans
        .iter()
        .map(|s| {
            let (c, b) = enc.encode(&data[s.clone()]);
            (c, b, s.len(), ObjectId::of(&data[s.clone()]))
        })
        .collect()
}

/// Benchmarks encoding the chunks with the encoders `encoder` makes and decoding+verifying
/// them.
fn bench_codec(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    data: &[u8],
    spans: &[std::ops::Range<usize>],
    encoder: impl Fn() -> codec::Encoder,
) {
    let encoded = encode_all(data, spans, encoder());
    g.bench_function(format!("{name}-encode"), |b| {
        let mut enc = encoder();
        b.iter(|| spans.iter().for_each(|s| drop(black_box(enc.encode(&data[s.clone()])))))
    });
    g.bench_function(format!("{name}-decode+verify"), |b| {
        let mut dec = codec::Decoder::new(StoreConfig::default().chunk_max);
        let mut out = Vec::with_capacity(1 << 20);
        b.iter(|| {
            encoded.iter().for_each(|(c, s, n, id)| {
                out.clear();
                dec.decode_append(*c, s, *n, id, &mut out).unwrap();
            })
        })
    });
}

fn bench(c: &mut Criterion) {
    let cfg = StoreConfig::default();
    let data = mixed(64 << 20);
    let spans = chunker::cut_segment(&data, &cfg);
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
    let zstd_only = || codec::Encoder::new(1, false).unwrap();
    let default = || codec::Encoder::new(1, true).unwrap();
    bench_codec(&mut g, "zstd-1", &data, &spans, zstd_only);
    bench_codec(&mut g, "default-codecs", &data, &spans, default);
    g.bench_function("sketch", |b| {
        b.iter(|| {
            spans.iter().for_each(|s| {
                black_box(similar::sketch(&data[s.clone()], s.start as u64));
            })
        })
    });
    g.finish();

    // bf16 weights alone: the float codec against zstd-1.
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut bf16 = vec![0u8; 64 << 20];
    fill_region(Region::Bf16, &mut bf16, &mut rng);
    let spans = chunker::cut_segment(&bf16, &cfg);
    let mut g = c.benchmark_group("per-core-bf16");
    g.throughput(Throughput::Bytes(bf16.len() as u64));
    g.sample_size(10);
    bench_codec(&mut g, "zstd-1", &bf16, &spans, zstd_only);
    bench_codec(&mut g, "floats", &bf16, &spans, default);
    let zstd_lanes = || codec::Encoder::new(1, true).unwrap().lane_coding(codec::LaneCoding::Zstd);
    bench_codec(&mut g, "floats-zstd-lanes", &bf16, &spans, zstd_lanes);
    // The Huffman lane alone: the high bytes (sign and exponent) of each ~64 KiB chunk.
    let lanes: Vec<Vec<u8>> =
        spans.iter().map(|s| bf16[s.clone()].iter().skip(1).step_by(2).copied().collect()).collect();
    let coded: Vec<Vec<u8>> = lanes
        .iter()
        .map(|l| {
            let mut out = Vec::new();
            huffman::Code::for_counts(&huffman::counts(l)).encode(l, &mut out);
            out
        })
        .collect();
    g.bench_function("huffman-lane-decode", |b| {
        let mut out = vec![0u8; 1 << 20];
        b.iter(|| {
            for (l, c) in lanes.iter().zip(&coded) {
                huffman::decode(c, &mut out[..l.len()]).unwrap();
            }
        })
    });
    // What a push of a page image adds for each new chunk (its resemblance sketch).
    g.bench_function("sketch", |b| {
        b.iter(|| {
            spans.iter().for_each(|s| {
                black_box(similar::sketch(&bf16[s.clone()], s.start as u64));
            })
        })
    });
    g.finish();
}

/// Encrypted stores: a 48 MiB pack (in 64 KiB pieces, as a push hands it over) sealed, and
/// its 16 MiB ranges opened, into a new buffer (restores) and into a caller's (VRAM loads).
fn bench_sealed(c: &mut Criterion) {
    let pack = mixed(48 << 20);
    let pieces: Vec<&[u8]> = pack.chunks(64 << 10).collect();
    let sealer = Sealer::new([7; 32]);
    let key = "packs/ab/bench.pack";
    let sealed = sealer.seal(key, &pieces);
    let header = Header::parse(&sealed, key).expect("sealed");
    let ranges: Vec<_> = (0..3u64).map(|i| (i << 24)..((i + 1) << 24)).collect();
    let mut g = c.benchmark_group("per-core-sealed");
    g.throughput(Throughput::Bytes(pack.len() as u64));
    g.sample_size(10);
    g.bench_function("seal", |b| b.iter(|| black_box(sealer.seal(key, &pieces).len())));
    g.bench_function("open-ranges", |b| {
        b.iter(|| {
            for r in &ranges {
                let (span, _) = header.sealed_range(r);
                let blocks = &sealed[span.start as usize..span.end as usize];
                black_box(sealer.open_range_owned(key, &header, r, blocks).expect("opens").len());
            }
        })
    });
    let mut out = vec![0u8; 16 << 20];
    g.bench_function("open-ranges-into", |b| {
        b.iter(|| {
            for r in &ranges {
                let (span, _) = header.sealed_range(r);
                let blocks = &sealed[span.start as usize..span.end as usize];
                sealer.open_range(key, &header, r, blocks, &mut out).expect("opens");
            }
        })
    });
    g.finish();
}

/// Index lookups: 400 k chunks in 800 packs of 500 (a 24 GiB image of 64 KiB chunks), looked
/// up 20 k at a time in the order a plan asks for them; then the same index opened read-only,
/// as every restore and load opens it.
fn bench_index(c: &mut Criterion) {
    use gstore_format::codec::Codec;
    use gstore_format::pack::PackEntry;
    use gstore_store::repo::index::Index;
    let dir = tempfile::tempdir().expect("temporary directory");
    let index = Index::open(dir.path()).expect("index opens");
    let mut ids = Vec::new();
    for p in 0..800u32 {
        let pack = ObjectId::of(&p.to_le_bytes());
        let entries: Vec<PackEntry> = (0..500u32)
            .map(|k| {
                let id = ObjectId::of(&[p.to_le_bytes(), k.to_le_bytes()].concat());
                ids.push(id);
                PackEntry {
                    id,
                    offset: u64::from(k) * 65_549,
                    stored_len: 65_536,
                    plain_len: 65_536,
                    codec: Codec::Raw,
                    bases: None,
                }
            })
            .collect();
        index.add_pack(pack, 500 * 65_549, &entries).expect("pack recorded");
    }
    let mut g = c.benchmark_group("index");
    let batch = &ids[100_000..120_000];
    g.throughput(Throughput::Elements(batch.len() as u64));
    g.sample_size(10);
    g.bench_function("locate", |b| {
        b.iter(|| {
            batch.iter().for_each(|id| {
                black_box(index.locate(id).expect("lookup"));
            })
        })
    });
    g.bench_function("locate_many", |b| b.iter(|| black_box(index.locate_many(batch).expect("lookups").len())));
    drop(index);
    g.throughput(Throughput::Elements(1));
    g.bench_function("open_read_only", |b| {
        b.iter(|| black_box(Index::open_read_only(dir.path()).expect("index opens").expect("index there")))
    });
    g.finish();
}

criterion_group!(benches, bench, bench_sealed, bench_index);
criterion_main!(benches);
