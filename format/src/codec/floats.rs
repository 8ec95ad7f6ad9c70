//! The byte-grouped float codec (codec byte 3): a chunk of 2- or 4-byte floats is split into
//! lanes — lane `i` holds byte `i` of every word — and each lane is kept Huffman-coded
//! ([`crate::codec::huffman`], which a GPU decodes), as a zstd frame, or raw. The lanes holding sign
//! and exponent bits are nearly constant in trained weights and optimizer state and compress
//! well; mantissa lanes are close to random and stay raw, so no coder has to model bytes of
//! both kinds at once (as ZipNN and xet's BG4 do).
//!
//! Stored form (docs/FORMAT.md): the width W (2 or 4), then per lane a codec byte (0 raw,
//! 1 zstd, 2 Huffman), a u32 LE stored length and the stored bytes, then the
//! `plain_len mod W` bytes past the last whole word, raw. Every lane decodes to
//! `plain_len / W` bytes.

use crate::error::{FormatError, Result};
use crate::id::ObjectId;
use crate::ObjectKind;

/// Lane codec byte: the lane's bytes as they are.
const LANE_RAW: u8 = 0;
/// Lane codec byte: one zstd frame.
const LANE_ZSTD: u8 = 1;
/// Lane codec byte: Huffman-coded substreams ([`crate::codec::huffman`]).
const LANE_HUFFMAN: u8 = 2;
/// Below this order-0 entropy (bits per byte) a lane is nearly one repeated byte: Huffman
/// coding spends at least one bit per byte there, zstd's matches far less. (A lane of exactly
/// one byte value is Huffman-coded in no bits.)
const ZSTD_LANE_BELOW: f64 = 1.0;
/// Bytes sampled from a chunk to decide whether it holds floats.
const SAMPLE: usize = 8192;
/// A lane whose sampled bytes carry more entropy than this (bits per byte) is kept raw
/// without trying zstd.
const RAW_LANE_ABOVE: f64 = 7.8;
/// Grouping must lower the sample's order-0 entropy by at least this many bits per byte for
/// a chunk to be tried as floats.
const MIN_GAIN_BITS: f64 = 0.5;
/// Below this order-0 entropy (bits per byte) a sample is repetitive enough for zstd's
/// matches to do better (floats with near-random mantissas sit well above it).
const MIN_WHOLE_BITS: f64 = 5.0;

/// `c * log2(c)` for every count a sampled lane can hold.
fn c_log_c() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=SAMPLE).map(|c| if c == 0 { 0.0 } else { c as f32 * (c as f32).log2() }).collect())
}

/// Order-0 entropy, in bits per byte, of a whole lane's byte counts.
fn entropy_of(counts: &[u64; 256]) -> f64 {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 * (c as f64).log2()).sum();
    (n as f64).log2() - sum / n as f64
}

/// Order-0 entropy, in bits per byte, of bytes counted in `counts`.
fn entropy(counts: &[u32; 256]) -> f64 {
    let n: u32 = counts.iter().sum();
    if n == 0 {
        return 0.0;
    }
    // H = log2(n) - sum(c log2 c) / n
    let table = c_log_c();
    let sum: f64 = counts.iter().map(|&c| table[c as usize] as f64).sum();
    (n as f64).log2() - sum / n as f64
}

/// Byte counts of the four lanes of 4-byte words of `sample` (whose length is a multiple of
/// 4): one pass, each lane's counter apart, so runs of one byte value do not serialise.
fn lane_counts(sample: &[u8]) -> [[u32; 256]; 4] {
    let mut counts = [[0u32; 256]; 4];
    for w in sample.chunks_exact(4) {
        counts[0][w[0] as usize] += 1;
        counts[1][w[1] as usize] += 1;
        counts[2][w[2] as usize] += 1;
        counts[3][w[3] as usize] += 1;
    }
    counts
}

fn sum(a: &[u32; 256], b: &[u32; 256]) -> [u32; 256] {
    std::array::from_fn(|i| a[i] + b[i])
}

/// What a sample says about a chunk: the word width to group by and which lanes are worth
/// compressing, or `None` when grouping does not look worth trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// 2 or 4.
    pub width: usize,
    /// Lanes to try zstd on (bit `i` for lane `i`).
    pub compress: u8,
}

/// What a sample of a chunk says about storing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Survey {
    /// Floats: grouped by `Plan`'s width, its lanes compress apart.
    Floats(Plan),
    /// Bytes as they are: zstd may or may not save enough (too short to sample, or no sign of
    /// floats nor of randomness).
    Bytes,
    /// Every sampled byte value as likely as any other: no codec is tried, as Huffman coding
    /// cannot save the ~3 % a chunk must save (zstd's fruitless pass over random bytes took
    /// ~15 % of a single-thread push of them). Repeats inside such a chunk (a random block
    /// twice) would have given zstd matches: those are missed, and the chunk is stored raw.
    Random,
}

/// Above this order-0 entropy (bits per byte) of the whole sample, a chunk is taken for
/// random. The sample of 8 KiB from uniformly random bytes measures ~7.978 bits (the estimate's
/// bias is 255 / (2 · 8192 · ln 2)); Huffman coding saves at most (8 - 7.95) / 8 < 1 % above
/// it. Matches between far-apart parts of one chunk are missed: a chunk is random only where
/// all four spread sample pieces are.
const RANDOM_ABOVE: f64 = 7.95;

/// Byte counts (four lanes of 4-byte words) of [`SAMPLE`] bytes taken from `plain` as four
/// pieces at 1/8, 3/8, 5/8 and 7/8 of it, each starting on a word boundary, so that a chunk
/// whose parts differ (a header, then floats; random bytes, then zeros) shows it.
fn sample_counts(plain: &[u8]) -> [[u32; 256]; 4] {
    let piece = SAMPLE / 4;
    let mut counts = [[0u32; 256]; 4];
    for k in 0..4 {
        let start = ((2 * k + 1) * plain.len() / 8).saturating_sub(piece / 2) & !3;
        for (lane, c) in counts.iter_mut().zip(lane_counts(&plain[start..start + piece])) {
            *lane = sum(lane, &c);
        }
    }
    counts
}

/// Looks at a sample of `plain` (pieces spread over it, [`sample_counts`]): a chunk whose
/// sample is as random as random bytes is [`Survey::Random`]; one whose grouping by 2 or 4
/// lowers the order-0 entropy by [`MIN_GAIN_BITS`], as it does for floats (whose exponent bytes
/// repeat) and not for text, code, pointers or random bytes, and whose sample is not so
/// repetitive ([`MIN_WHOLE_BITS`]) that zstd's matches serve it better, is
/// [`Survey::Floats`]. Chunks shorter than two samples are [`Survey::Bytes`].
pub fn survey(plain: &[u8]) -> Survey {
    if plain.len() < 2 * SAMPLE {
        return Survey::Bytes;
    }
    // Lanes of 2-byte words are pairs of lanes of 4-byte ones; the whole is all four.
    let four = sample_counts(plain);
    let (even, odd) = (sum(&four[0], &four[2]), sum(&four[1], &four[3]));
    let whole = entropy(&sum(&even, &odd));
    if whole > RANDOM_ABOVE {
        return Survey::Random;
    }
    if whole < MIN_WHOLE_BITS {
        return Survey::Bytes;
    }
    let four: Vec<f64> = four.iter().map(entropy).collect();
    let two = vec![entropy(&even), entropy(&odd)];
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (width, lanes) = if mean(&four) + 0.1 < mean(&two) { (4, four) } else { (2, two) };
    if mean(&lanes) + MIN_GAIN_BITS > whole {
        return Survey::Bytes;
    }
    let compress = lanes.iter().enumerate().filter(|(_, &h)| h <= RAW_LANE_ABOVE).fold(0u8, |m, (i, _)| m | 1 << i);
    Survey::Floats(Plan { width, compress })
}

/// Splits whole words of `plain` into `lanes` (lane `i` at `i * n`, `n` words), eight bytes
/// at a time where it can (the byte shuffles run in registers).
fn split(plain: &[u8], w: usize, lanes: &mut [u8]) {
    let n = lanes.len() / w;
    // Gathers bytes 0, 2, 4, 6 of `x` into the low four bytes.
    let evens = |x: u64| {
        let t = x & 0x00ff_00ff_00ff_00ff;
        let t = (t | t >> 8) & 0x0000_ffff_0000_ffff;
        (t | t >> 16) as u32
    };
    match w {
        2 => {
            let (l0, l1) = lanes.split_at_mut(n);
            for ((eight, a), b) in plain.chunks_exact(8).zip(l0.chunks_exact_mut(4)).zip(l1.chunks_exact_mut(4)) {
                let x = u64::from_le_bytes(eight.try_into().expect("8 bytes"));
                a.copy_from_slice(&evens(x).to_le_bytes());
                b.copy_from_slice(&evens(x >> 8).to_le_bytes());
            }
            for i in n / 4 * 4..n {
                (l0[i], l1[i]) = (plain[2 * i], plain[2 * i + 1]);
            }
        }
        _ => {
            let (l01, l23) = lanes.split_at_mut(2 * n);
            let ((l0, l1), (l2, l3)) = (l01.split_at_mut(n), l23.split_at_mut(n));
            // Four words at a time: bytes 0 and 2 of each, and bytes 1 and 3, gathered as for
            // 2-byte words, then each pair split the same way (a byte at a time, this loop was
            // ~5 % of a push of process images holding fp32 weights).
            let lanes4 = l0
                .chunks_exact_mut(4)
                .zip(l1.chunks_exact_mut(4))
                .zip(l2.chunks_exact_mut(4))
                .zip(l3.chunks_exact_mut(4));
            for (sixteen, (((a, b), c), d)) in plain.chunks_exact(16).zip(lanes4) {
                let x0 = u64::from_le_bytes(sixteen[..8].try_into().expect("8 bytes"));
                let x1 = u64::from_le_bytes(sixteen[8..].try_into().expect("8 bytes"));
                let even = evens(x0) as u64 | (evens(x1) as u64) << 32;
                let odd = evens(x0 >> 8) as u64 | (evens(x1 >> 8) as u64) << 32;
                a.copy_from_slice(&evens(even).to_le_bytes());
                b.copy_from_slice(&evens(odd).to_le_bytes());
                c.copy_from_slice(&evens(even >> 8).to_le_bytes());
                d.copy_from_slice(&evens(odd >> 8).to_le_bytes());
            }
            for i in n / 4 * 4..n {
                (l0[i], l1[i], l2[i], l3[i]) = (plain[4 * i], plain[4 * i + 1], plain[4 * i + 2], plain[4 * i + 3]);
            }
        }
    }
}

/// Interleaves `lanes` (`w` lanes of the same length) back into whole words of `out`, eight
/// bytes at a time where it can, as [`split`] does the other way (a byte at a time, this loop
/// was a tenth of a lazy fill of fp32 weights).
fn join(lanes: &[&[u8]], w: usize, out: &mut [u8]) {
    // Spreads the four bytes of `x` to bytes 0, 2, 4, 6.
    let spread = |x: u32| {
        let t = x as u64;
        let t = (t | t << 16) & 0x0000_ffff_0000_ffff;
        (t | t << 8) & 0x00ff_00ff_00ff_00ff
    };
    let four = |l: &[u8]| u32::from_le_bytes(l.try_into().expect("4 bytes"));
    match (w, lanes) {
        (2, [l0, l1]) => {
            let n = l0.len();
            for ((eight, a), b) in out.chunks_exact_mut(8).zip(l0.chunks_exact(4)).zip(l1.chunks_exact(4)) {
                eight.copy_from_slice(&(spread(four(a)) | spread(four(b)) << 8).to_le_bytes());
            }
            for i in n / 4 * 4..n {
                (out[2 * i], out[2 * i + 1]) = (l0[i], l1[i]);
            }
        }
        (4, [l0, l1, l2, l3]) => {
            let n = l0.len();
            let lanes4 = l0.chunks_exact(4).zip(l1.chunks_exact(4)).zip(l2.chunks_exact(4)).zip(l3.chunks_exact(4));
            for (sixteen, (((a, b), c), d)) in out.chunks_exact_mut(16).zip(lanes4) {
                // Bytes 0 and 2 of four words, and bytes 1 and 3, then those pairs interleaved.
                let ac = spread(four(a)) | spread(four(c)) << 8;
                let bd = spread(four(b)) | spread(four(d)) << 8;
                sixteen[..8].copy_from_slice(&(spread(ac as u32) | spread(bd as u32) << 8).to_le_bytes());
                sixteen[8..]
                    .copy_from_slice(&(spread((ac >> 32) as u32) | spread((bd >> 32) as u32) << 8).to_le_bytes());
            }
            for i in n / 4 * 4..n {
                (out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]) = (l0[i], l1[i], l2[i], l3[i]);
            }
        }
        _ => unreachable!("{} lanes of width {w}", lanes.len()),
    }
}

/// Reusable buffers for encoding and decoding (keep one per thread).
#[derive(Default)]
pub struct Scratch {
    lanes: Vec<u8>,
    frame: Vec<u8>,
}

/// How lanes worth compressing are coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneCoding {
    /// Huffman-coded (lane codec 2), except lanes of nearly one byte value (zstd).
    Huffman,
    /// zstd frames (lane codec 1), as gstore wrote them before Huffman lanes.
    Zstd,
}

/// Encodes `plain` as `plan` says into `out` (cleared first), coding the lanes `plan`
/// compresses as `coding` says.
pub fn encode(
    plain: &[u8],
    plan: Plan,
    coding: LaneCoding,
    zstd: &mut zstd::bulk::Compressor<'static>,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) {
    let w = plan.width;
    let n = plain.len() / w;
    // `split` writes every byte: the buffer is zeroed only where it grows, never cleared.
    scratch.lanes.resize(n * w, 0);
    split(plain, w, &mut scratch.lanes);
    out.clear();
    out.push(w as u8);
    for i in 0..w {
        let lane = &scratch.lanes[i * n..(i + 1) * n];
        let compress = plan.compress & (1 << i) != 0;
        // Huffman unless the lane is nearly one byte value; raw unless that saves bytes.
        let huffman = match (compress, coding) {
            (true, LaneCoding::Huffman) => Some(crate::codec::huffman::counts(lane))
                .filter(|c| entropy_of(c) >= ZSTD_LANE_BELOW || c.iter().filter(|&&n| n > 0).count() == 1),
            _ => None,
        };
        let code = huffman.map(|c| (crate::codec::huffman::Code::for_counts(&c), c));
        if let Some((code, _)) = code.filter(|(code, c)| code.encoded_len(c, n) < n) {
            out.push(LANE_HUFFMAN);
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            code.encode(lane, out);
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
            continue;
        }
        // A frame that does not fit the lane's length (or is not shorter) leaves it raw.
        let frame = if compress {
            scratch.frame.clear();
            scratch.frame.reserve(n);
            zstd.compress_to_buffer(lane, &mut scratch.frame).ok().filter(|&len| len < n)
        } else {
            None
        };
        match frame {
            Some(len) => {
                out.push(LANE_ZSTD);
                out.extend_from_slice(&(len as u32).to_le_bytes());
                out.extend_from_slice(&scratch.frame[..len]);
            }
            None => {
                out.push(LANE_RAW);
                out.extend_from_slice(&(n as u32).to_le_bytes());
                out.extend_from_slice(lane);
            }
        }
    }
    out.extend_from_slice(&plain[n * w..]);
}

/// The error for float-coded chunk `id` whose lanes are inconsistent.
fn corrupt(id: &ObjectId, detail: String) -> FormatError {
    FormatError::corrupt(ObjectKind::Chunk, id.to_hex(), format!("float lanes: {detail}"))
}

/// How one lane of a float-coded chunk is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneCodec {
    /// Its bytes as they are.
    Raw,
    /// One zstd frame.
    Zstd,
    /// Huffman-coded substreams ([`crate::codec::huffman`]).
    Huffman,
}

/// One lane of a float-coded chunk, as [`layout`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// How it is stored.
    pub codec: LaneCodec,
    /// Where the lane's stored bytes lie in the chunk's stored bytes.
    pub stored: std::ops::Range<usize>,
}

/// Where the parts of a float-coded chunk lie in its stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per word: 2 or 4.
    pub width: usize,
    /// Words per lane: every lane decodes to this many bytes.
    pub words: usize,
    /// The `width` lanes, lane `i` holding byte `i` of every word.
    pub lanes: Vec<Lane>,
    /// The bytes past the last whole word, stored raw.
    pub tail: std::ops::Range<usize>,
}

/// Reads the structure of the float-coded `stored` bytes of chunk `id`, whose plain length is
/// `plain_len`: word width, lane codecs and lengths, tail. Anything inconsistent (a width
/// other than 2 or 4, an unknown lane codec, a raw lane of the wrong length, lanes running past
/// the end, a tail of the wrong length) is a corrupt chunk. A zstd lane's frame is not looked
/// into, nor a Huffman lane's code: whoever decodes them checks that they yield `words` bytes.
pub fn layout(stored: &[u8], plain_len: usize, id: &ObjectId) -> Result<Layout> {
    let bad = |detail: String| corrupt(id, detail);
    let w = *stored.first().ok_or_else(|| bad("empty".into()))? as usize;
    if w != 2 && w != 4 {
        return Err(bad(format!("word width {w} (2 or 4 expected)")));
    }
    let n = plain_len / w;
    let mut lanes = Vec::with_capacity(w);
    let mut at = 1usize;
    for i in 0..w {
        let head = stored.get(at..at + 5).ok_or_else(|| bad(format!("lane {i} is cut short")))?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let body = at + 5..at + 5 + len;
        if body.end > stored.len() {
            return Err(bad(format!("lane {i} is cut short")));
        }
        match head[0] {
            LANE_RAW if len == n => lanes.push(Lane { codec: LaneCodec::Raw, stored: body }),
            LANE_ZSTD => lanes.push(Lane { codec: LaneCodec::Zstd, stored: body }),
            LANE_HUFFMAN => lanes.push(Lane { codec: LaneCodec::Huffman, stored: body }),
            c => return Err(bad(format!("lane {i}: codec {c} with {len} bytes for {n}"))),
        }
        at += 5 + len;
    }
    if stored.len() - at != plain_len - n * w {
        return Err(bad(format!("{} bytes after the lanes, {} expected", stored.len() - at, plain_len - n * w)));
    }
    Ok(Layout { width: w, words: n, lanes, tail: at..stored.len() })
}

/// Decodes `stored` into `out` (exactly the chunk's plain length); any inconsistency is a
/// corrupt chunk `id`.
pub fn decode(
    stored: &[u8],
    out: &mut [u8],
    zstd: &mut zstd::bulk::Decompressor<'static>,
    scratch: &mut Scratch,
    id: &ObjectId,
) -> Result<()> {
    let Layout { width: w, words: n, lanes, tail } = layout(stored, out.len(), id)?;
    // Every coded lane is written whole below (or the chunk fails): the buffer is zeroed only
    // where it grows, never cleared. Raw lanes are joined from the stored bytes.
    scratch.lanes.resize(n * w, 0);
    for (i, l) in lanes.iter().enumerate() {
        let body = &stored[l.stored.clone()];
        let lane = &mut scratch.lanes[i * n..(i + 1) * n];
        match l.codec {
            LaneCodec::Zstd => {
                let got =
                    zstd.decompress_to_buffer(body, lane).map_err(|e| corrupt(id, format!("lane {i}: zstd: {e}")))?;
                if got != n {
                    return Err(corrupt(id, format!("lane {i} decodes to {got} bytes, not {n}")));
                }
            }
            LaneCodec::Huffman => {
                crate::codec::huffman::decode(body, lane).map_err(|e| corrupt(id, format!("lane {i}: Huffman: {e}")))?
            }
            LaneCodec::Raw => {}
        }
    }
    let mut joined: [&[u8]; 4] = [&[]; 4];
    for (i, l) in lanes.iter().enumerate() {
        joined[i] = match l.codec {
            LaneCodec::Raw => &stored[l.stored.clone()],
            _ => &scratch.lanes[i * n..(i + 1) * n],
        };
    }
    join(&joined[..w], w, out);
    out[n * w..].copy_from_slice(&stored[tail]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Codec, Decoder, Encoder};
    use proptest::prelude::*;

    /// Roughly N(0, scale) floats from a seed (sum of three uniforms).
    fn normal(n: usize, scale: f32, seed: u64) -> Vec<f32> {
        let mut x = seed | 1;
        let mut uniform = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        (0..n).map(|_| (uniform() + uniform() + uniform()) * 2.0 * scale).collect()
    }

    fn bf16(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect()
    }

    fn fp32(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Encodes with the store's encoder, decodes with its decoder (which checks the hash).
    fn round_trip(plain: &[u8]) -> (Codec, usize) {
        let (codec, stored) = Encoder::new(1, true).unwrap().encode(plain);
        let id = ObjectId::of(plain);
        let mut out = Vec::new();
        Decoder::new(1 << 24).decode_append(codec, &stored, plain.len(), &id, &mut out).unwrap();
        assert_eq!(out, plain);
        (codec, stored.len())
    }

    #[test]
    fn split_puts_byte_i_of_each_word_in_lane_i_and_join_undoes_it() {
        let plain: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for w in [2, 4] {
            for words in 0..70 {
                let mut lanes = vec![0u8; words * w];
                split(&plain[..words * w], w, &mut lanes);
                for i in 0..words {
                    for b in 0..w {
                        assert_eq!(
                            lanes[b * words + i],
                            plain[i * w + b],
                            "width {w}, {words} words, word {i} byte {b}"
                        );
                    }
                }
                let mut back = vec![0u8; words * w];
                let each: Vec<&[u8]> = (0..w).map(|b| &lanes[b * words..(b + 1) * words]).collect();
                join(&each, w, &mut back);
                assert_eq!(back, plain[..words * w]);
            }
        }
    }

    #[test]
    fn weights_and_optimizer_state_take_the_float_codec_and_shrink() {
        let w = normal(32768, 0.02, 1);
        let (codec, stored) = round_trip(&bf16(&w));
        assert_eq!(codec, Codec::Floats);
        assert!(stored < 65536 * 70 / 100, "bf16 weights stored at {stored} of 65536");
        let (codec, stored) = round_trip(&fp32(&w[..16384]));
        assert_eq!(codec, Codec::Floats);
        assert!(stored < 65536 * 85 / 100, "fp32 weights stored at {stored} of 65536");
        // Adam's second moment: small positive values.
        let v: Vec<f32> = normal(16384, 1e-4, 2).iter().map(|x| x * x).collect();
        assert_eq!(round_trip(&fp32(&v)).0, Codec::Floats);
    }

    #[test]
    fn a_lane_of_one_byte_value_takes_a_code_of_no_bits() {
        // Layer-norm gains near 1: every high byte is 0x3f, the low bytes vary.
        let gains: Vec<f32> = normal(32768, 0.05, 6).iter().map(|x| 1.0 + x.clamp(-0.4, 0.4)).collect();
        let plain = bf16(&gains);
        let mut stored = Vec::new();
        let mut zstd = zstd::bulk::Compressor::new(1).unwrap();
        let plan = Plan { width: 2, compress: 0b10 };
        encode(&plain, plan, LaneCoding::Huffman, &mut zstd, &mut Scratch::default(), &mut stored);
        let f = layout(&stored, plain.len(), &ObjectId::of(&plain)).unwrap();
        assert_eq!(f.lanes[1].codec, LaneCodec::Huffman);
        // k - 1, one pair of length 0, 32 empty substreams' ends.
        assert_eq!(f.lanes[1].stored.len(), 1 + 2 + 4 * 32);
        let mut back = vec![0u8; plain.len()];
        let mut d = zstd::bulk::Decompressor::new().unwrap();
        decode(&stored, &mut back, &mut d, &mut Scratch::default(), &ObjectId::of(&plain)).unwrap();
        assert_eq!(back, plain);
    }

    #[test]
    fn text_pointers_and_random_bytes_do_not_look_like_floats() {
        let text: Vec<u8> =
            b"fn main() { println!(\"hello\"); } // comment\n".iter().cycle().take(65536).copied().collect();
        assert_eq!(survey(&text), Survey::Bytes);
        let mut x = 7u64;
        let random: Vec<u8> = (0..65536)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        assert_eq!(survey(&random), Survey::Random);
        assert_eq!(round_trip(&random).0, Codec::Raw);
        assert_eq!(round_trip(&text).0, Codec::Zstd);
        // Random where one piece of the sample lies, zeros elsewhere: zstd is tried and keeps
        // it. Random except where one piece lies: taken for bytes, not random.
        let mut mixed = vec![0u8; 65536];
        mixed[..24576].copy_from_slice(&random[..24576]);
        assert_eq!(survey(&mixed), Survey::Bytes);
        assert_eq!(round_trip(&mixed).0, Codec::Zstd);
        let mut mostly = random.clone();
        mostly[40000..44000].fill(0);
        assert_eq!(survey(&mostly), Survey::Bytes);
    }

    #[test]
    fn odd_lengths_nans_denormals_and_constant_words_round_trip() {
        let mut v = normal(20000, 0.02, 3);
        v[5] = f32::NAN;
        v[6] = f32::INFINITY;
        v[7] = f32::MIN_POSITIVE / 8.0;
        v[8] = -0.0;
        for len in [40001usize, 40002, 40003, 80000 - 1] {
            let bytes = fp32(&v);
            round_trip(&bytes[..len.min(bytes.len())]);
        }
        let constant: Vec<u8> = fp32(&[1.5f32; 20000]);
        round_trip(&constant);
        // Forced through each width, whatever the sample says.
        for width in [2, 4] {
            let plain = bf16(&v);
            let mut out = Vec::new();
            let mut zstd = zstd::bulk::Compressor::new(1).unwrap();
            for coding in [LaneCoding::Huffman, LaneCoding::Zstd] {
                encode(
                    &plain[..plain.len() - 1],
                    Plan { width, compress: 0b1010 },
                    coding,
                    &mut zstd,
                    &mut Scratch::default(),
                    &mut out,
                );
                let mut back = vec![0u8; plain.len() - 1];
                let mut d = zstd::bulk::Decompressor::new().unwrap();
                decode(&out, &mut back, &mut d, &mut Scratch::default(), &ObjectId::of(b"x")).unwrap();
                assert_eq!(back, &plain[..plain.len() - 1]);
            }
        }
    }

    #[test]
    fn damaged_lanes_are_refused_or_caught_by_the_hash() {
        let plain = bf16(&normal(32768, 0.02, 4));
        let (codec, stored) = Encoder::new(1, true).unwrap().encode(&plain);
        assert_eq!(codec, Codec::Floats);
        let id = ObjectId::of(&plain);
        let mut d = Decoder::new(1 << 24);
        for at in [0, 1, 3, 6, stored.len() / 2, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 0x21;
            let err = d.decode_append(codec, &bad, plain.len(), &id, &mut Vec::new()).expect_err("damage");
            assert!(err.to_string().contains("corrupt chunk"), "{err}");
        }
        for cut in [0, 1, 5, stored.len() - 1] {
            assert!(d.decode_append(codec, &stored[..cut], plain.len(), &id, &mut Vec::new()).is_err());
        }
    }

    #[test]
    fn the_layout_points_at_each_lane_and_the_tail() {
        // What GPU decoding relies on: raw lanes hold byte i of every word at the range the
        // layout names, zstd and Huffman lanes decode to `words` bytes there, the tail is the
        // rest.
        let plain = bf16(&normal(20001, 0.02, 5));
        let plain = &plain[..plain.len() - 1];
        for coding in [LaneCoding::Huffman, LaneCoding::Zstd] {
            for (width, compress) in [(2, 0b10), (2, 0b00), (4, 0b1010)] {
                let mut stored = Vec::new();
                encode(
                    plain,
                    Plan { width, compress },
                    coding,
                    &mut zstd::bulk::Compressor::new(1).unwrap(),
                    &mut Scratch::default(),
                    &mut stored,
                );
                let f = layout(&stored, plain.len(), &ObjectId::of(plain)).unwrap();
                assert_eq!((f.width, f.words), (width, plain.len() / width));
                for (i, lane) in f.lanes.iter().enumerate() {
                    let want: Vec<u8> = plain.chunks_exact(width).map(|w| w[i]).collect();
                    let body = &stored[lane.stored.clone()];
                    let got = match lane.codec {
                        LaneCodec::Zstd => zstd::bulk::decompress(body, f.words).unwrap(),
                        LaneCodec::Huffman => {
                            let mut out = vec![0u8; f.words];
                            crate::codec::huffman::decode(body, &mut out).unwrap();
                            out
                        }
                        LaneCodec::Raw => body.to_vec(),
                    };
                    let expected = match (compress & (1 << i) != 0, coding) {
                        (false, _) => LaneCodec::Raw,
                        (true, LaneCoding::Huffman) => LaneCodec::Huffman,
                        (true, LaneCoding::Zstd) => LaneCodec::Zstd,
                    };
                    assert_eq!(lane.codec, expected, "lane {i}");
                    assert_eq!(got, want, "lane {i}");
                }
                assert_eq!(&stored[f.tail.clone()], &plain[f.words * width..]);
            }
        }
        // A lane running past the end and a wrong tail are refused.
        let mut stored = Vec::new();
        encode(
            plain,
            Plan { width: 2, compress: 0 },
            LaneCoding::Huffman,
            &mut zstd::bulk::Compressor::new(1).unwrap(),
            &mut Scratch::default(),
            &mut stored,
        );
        assert!(layout(&stored[..stored.len() - 2], plain.len(), &ObjectId::of(plain)).is_err());
        assert!(layout(&stored, plain.len() + 1, &ObjectId::of(plain)).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip_through_either_width(data in proptest::collection::vec(any::<u8>(), 0..5000), width in prop_oneof![Just(2usize), Just(4usize)], compress in 0u8..16, huffman in any::<bool>()) {
            let mut out = Vec::new();
            let mut zstd = zstd::bulk::Compressor::new(1).unwrap();
            let coding = if huffman { LaneCoding::Huffman } else { LaneCoding::Zstd };
            encode(&data, Plan { width, compress }, coding, &mut zstd, &mut Scratch::default(), &mut out);
            let mut back = vec![0u8; data.len()];
            decode(&out, &mut back, &mut zstd::bulk::Decompressor::new().unwrap(), &mut Scratch::default(), &ObjectId::of(b"p")).unwrap();
            prop_assert_eq!(back, data);
        }

        #[test]
        fn float_like_buffers_round_trip_through_the_encoder(seed in 1u64..1000, len in 0usize..70000, scale in prop_oneof![Just(0.02f32), Just(1.0f32), Just(1e-30f32)]) {
            let bytes = fp32(&normal(len / 4 + 1, scale, seed));
            round_trip(&bytes[..len.min(bytes.len())]);
            let bytes = bf16(&normal(len / 2 + 1, scale, seed));
            round_trip(&bytes[..len.min(bytes.len())]);
        }
    }
}
