//! Per-chunk codecs: how a chunk's plain bytes are kept in a pack.

use crate::error::{Result, StoreError};
use crate::id::ObjectId;

/// How a chunk is stored. The numeric value is the codec byte in pack footers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    /// Plain bytes, stored as they are.
    Raw = 0,
    /// A zstd frame.
    Zstd = 1,
    /// All zero bytes: nothing is stored, only the length.
    Zero = 2,
}

impl Codec {
    /// Decodes a codec byte, refusing unknown values.
    pub fn from_byte(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::Zero),
            _ => None,
        }
    }

    /// Lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::Zero => "zero",
        }
    }
}

/// zstd output is kept only when it is smaller than this fraction of the plain bytes.
const KEEP_ZSTD_BELOW: f64 = 0.97;

/// True when every byte of `data` is zero (word-at-a-time).
pub fn is_all_zero(data: &[u8]) -> bool {
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// Chooses a codec for a non-zero chunk and returns its stored bytes: zstd at `level` when it
/// saves at least ~3 %, raw otherwise.
pub fn encode(plain: &[u8], level: i32) -> (Codec, Vec<u8>) {
    let limit = (plain.len() as f64 * KEEP_ZSTD_BELOW) as usize;
    // A bound-sized buffer avoids reallocations; compress_to_buffer fails when the output would
    // not fit, which for a limit-sized buffer means "not worth it".
    let mut out = vec![0u8; limit];
    match zstd::bulk::compress_to_buffer(plain, &mut out, level) {
        Ok(n) if n < limit => {
            out.truncate(n);
            (Codec::Zstd, out)
        }
        _ => (Codec::Raw, plain.to_vec()),
    }
}

/// Decodes stored bytes into `out` (cleared first) and checks the result against `id`.
pub fn decode_into(codec: Codec, stored: &[u8], plain_len: usize, id: &ObjectId, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    match codec {
        Codec::Raw => out.extend_from_slice(stored),
        Codec::Zero => out.resize(plain_len, 0),
        Codec::Zstd => {
            out.reserve(plain_len);
            zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(stored, out))
                .map_err(|e| StoreError::corrupt("chunk", id.to_hex(), format!("zstd: {e}")))?;
        }
    }
    if out.len() != plain_len {
        return Err(StoreError::corrupt(
            "chunk",
            id.to_hex(),
            format!("decoded to {} bytes, expected {plain_len}", out.len()),
        ));
    }
    let got = ObjectId::of(out);
    if &got != id {
        return Err(StoreError::corrupt("chunk", id.to_hex(), format!("BLAKE3 mismatch: content hashes to {}", got.short())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(data: &[u8]) -> Codec {
        let id = ObjectId::of(data);
        let (codec, stored) = encode(data, 1);
        let mut out = Vec::new();
        decode_into(codec, &stored, data.len(), &id, &mut out).unwrap();
        assert_eq!(out, data);
        codec
    }

    #[test]
    fn compressible_uses_zstd_and_random_stays_raw() {
        assert_eq!(round_trip(&b"abcd".repeat(10_000)), Codec::Zstd);
        let mut noise = vec![0u8; 65536];
        blake3::Hasher::new().update(b"seed").finalize_xof().fill(&mut noise);
        assert_eq!(round_trip(&noise), Codec::Raw);
    }

    #[test]
    fn flipped_byte_is_caught() {
        let data = b"hello world".repeat(1000);
        let id = ObjectId::of(&data);
        for codec_bytes in [encode(&data, 1), (Codec::Raw, data.clone())] {
            let (codec, mut stored) = codec_bytes;
            let mid = stored.len() / 2;
            stored[mid] ^= 1;
            let mut out = Vec::new();
            assert!(decode_into(codec, &stored, data.len(), &id, &mut out).is_err());
        }
    }

    #[test]
    fn zero_detection() {
        assert!(is_all_zero(&[0u8; 1000]));
        let mut v = vec![0u8; 1001];
        v[1000] = 1;
        assert!(!is_all_zero(&v));
        assert!(!is_all_zero(&v[1..]));
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip(data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            round_trip(&data);
        }
    }
}
