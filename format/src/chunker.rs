//! Content-defined chunking (FastCDC v2020), cut in parallel over fixed segments.
//!
//! A file is split into segments of `segment_size` bytes; each segment is chunked on its own
//! core. A segment edge is therefore always a chunk edge, which keeps the cut points
//! deterministic for a given store configuration while letting big files use every core.

use crate::config::StoreConfig;
use std::ops::Range;

/// The byte range of one chunk within its input.
pub type Span = Range<usize>;

/// Cuts one contiguous piece of data (one segment) into chunks.
pub fn cut_segment(data: &[u8], cfg: &StoreConfig) -> Vec<Span> {
    if data.is_empty() {
        return Vec::new();
    }
    fastcdc::v2020::FastCDC::new(data, cfg.chunk_min as usize, cfg.chunk_avg as usize, cfg.chunk_max as usize)
        .map(|c| c.offset..c.offset + c.length)
        .collect()
}

/// The segment ranges of an input of `len` bytes.
pub fn segments(len: u64, cfg: &StoreConfig) -> Vec<Range<u64>> {
    let seg = cfg.segment_size.max(1);
    (0..len).step_by(seg as usize).map(|s| s..(s + seg).min(len)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cuts a whole input, segment after segment, as push does.
    fn cut(data: &[u8], cfg: &StoreConfig) -> Vec<Span> {
        segments(data.len() as u64, cfg)
            .into_iter()
            .flat_map(|seg| {
                let base = seg.start as usize;
                cut_segment(&data[base..seg.end as usize], cfg).into_iter().map(move |s| s.start + base..s.end + base)
            })
            .collect()
    }

    fn noise(n: usize, seed: u8) -> Vec<u8> {
        let mut v = vec![0u8; n];
        blake3::Hasher::new().update(&[seed]).finalize_xof().fill(&mut v);
        v
    }

    fn small_cfg() -> StoreConfig {
        StoreConfig {
            chunk_min: 1024,
            chunk_avg: 4096,
            chunk_max: 16384,
            segment_size: 128 * 1024,
            ..Default::default()
        }
    }

    #[test]
    fn spans_tile_the_input_within_bounds() {
        let cfg = small_cfg();
        let data = noise(1_000_003, 1);
        let spans = cut(&data, &cfg);
        let mut pos = 0;
        for s in &spans {
            assert_eq!(s.start, pos);
            assert!(s.len() <= cfg.chunk_max as usize);
            pos = s.end;
        }
        assert_eq!(pos, data.len());
        assert!(spans.len() > 100, "expected many chunks, got {}", spans.len());
    }

    #[test]
    fn an_insertion_disturbs_only_nearby_chunks() {
        let cfg = small_cfg();
        let a = noise(600_000, 2);
        let mut b = a[..300_000].to_vec();
        b.extend_from_slice(b"inserted bytes");
        b.extend_from_slice(&a[300_000..]);
        let ids = |d: &[u8]| -> std::collections::HashSet<blake3::Hash> {
            cut(d, &cfg).into_iter().map(|s| blake3::hash(&d[s])).collect()
        };
        let (ia, ib) = (ids(&a), ids(&b));
        let shared = ia.intersection(&ib).count();
        // Segment edges are at fixed offsets, so chunks around each edge after the
        // insertion point may differ too; most must still be shared.
        assert!(shared * 10 >= ia.len() * 8, "shared {shared} of {}", ia.len());
    }
}
