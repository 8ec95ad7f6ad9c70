//! A restore plan: every distinct chunk an image needs, fetched once even when it repeats,
//! grouped into coalesced pack range reads, ordered by first use in the manifest.

use gstore_store::index::ChunkLocation;
use gstore_store::manifest::Manifest;
use gstore_store::{ObjectId, Result, Store, StoreError};
use std::collections::HashMap;

/// Two chunks of one pack are read together when at most this many bytes lie between them.
pub const MAX_GAP: u64 = 64 * 1024;
/// A single range read covers at most this many bytes.
pub const MAX_READ: u64 = 16 * 1024 * 1024;

/// Where one restored copy of a chunk goes: (entry index in the manifest, byte offset).
pub type Target = (usize, u64);

/// One distinct chunk and every place it is written to.
#[derive(Debug, Clone)]
pub struct PlannedChunk {
    /// Chunk id.
    pub id: ObjectId,
    /// Where it is stored.
    pub loc: ChunkLocation,
    /// Where it goes.
    pub targets: Vec<Target>,
}

/// One range read of one pack and the chunks it yields.
#[derive(Debug, Clone)]
pub struct RangeRead {
    /// The pack.
    pub pack: ObjectId,
    /// First byte read.
    pub start: u64,
    /// One past the last byte read.
    pub end: u64,
    /// Chunks inside the range, by offset.
    pub chunks: Vec<PlannedChunk>,
}

/// The whole plan.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Range reads, in order of first use.
    pub reads: Vec<RangeRead>,
    /// Plain bytes that will be written (repeats counted each time; zero chunks excluded).
    pub write_bytes: u64,
    /// Bytes that will be fetched from packs.
    pub fetch_bytes: u64,
}

/// Plans the restore of every file of `m`.
pub fn plan(store: &Store, m: &Manifest) -> Result<Plan> {
    // id -> (first use, planned chunk)
    let mut by_id: HashMap<ObjectId, (usize, PlannedChunk)> = HashMap::new();
    let mut write_bytes = 0;
    let mut seq = 0usize;
    for (i, (entry, chunks)) in m.files().enumerate() {
        let mut off = 0u64;
        for c in chunks {
            if !c.zero {
                write_bytes += c.len as u64;
                if let Some((_, p)) = by_id.get_mut(&c.id) {
                    p.targets.push((i, off));
                } else {
                    let loc = store.locate(&c.id)?.ok_or_else(|| {
                        StoreError::NotFound {
                            what: "chunk",
                            key: format!("{} of {:?} (in no indexed pack: the store is damaged, or run `gstore index rebuild`)", c.id, entry.path),
                        }
                    })?;
                    if loc.plain_len != c.len {
                        return Err(StoreError::corrupt("chunk", c.id.to_hex(), format!("index says {} bytes, manifest says {}", loc.plain_len, c.len)));
                    }
                    by_id.insert(c.id, (seq, PlannedChunk { id: c.id, loc, targets: vec![(i, off)] }));
                    seq += 1;
                }
            }
            off += c.len as u64;
        }
    }
    let mut chunks: Vec<(usize, PlannedChunk)> = by_id.into_values().collect();
    chunks.sort_by_key(|(_, p)| (p.loc.pack, p.loc.offset));
    let mut reads: Vec<(usize, RangeRead)> = Vec::new();
    for (first, p) in chunks {
        let r = p.loc.range();
        match reads.last_mut() {
            Some((f, cur)) if cur.pack == p.loc.pack && r.start >= cur.end && r.start - cur.end <= MAX_GAP && r.end - cur.start <= MAX_READ => {
                cur.end = r.end;
                *f = (*f).min(first);
                cur.chunks.push(p);
            }
            _ => reads.push((first, RangeRead { pack: p.loc.pack, start: r.start, end: r.end, chunks: vec![p] })),
        }
    }
    reads.sort_by_key(|(f, _)| *f);
    let reads: Vec<RangeRead> = reads.into_iter().map(|(_, r)| r).collect();
    let fetch_bytes = reads.iter().map(|r| r.end - r.start).sum();
    Ok(Plan { reads, write_bytes, fetch_bytes })
}
