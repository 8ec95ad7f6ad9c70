//! Reading byte ranges of an image file straight from the store into a page-aligned buffer:
//! the chunks covering the range are fetched (consecutive ones of a pack in one range read),
//! checked against their BLAKE3 ids and decoded in place.

use crate::error::{LazyError, Result};
use gstore_gpu_dump::images::PAGE_SIZE;
use gstore_restore::plan::{locate_chunks, MAX_GAP};
use gstore_store::codec;
use gstore_store::format::manifest::Manifest;
use gstore_store::repo::index::ChunkLocation;
use gstore_store::ObjectKind;
use gstore_store::{IndexedStore, ObjectId, StoreError};
use std::ops::Range;

/// One chunk of a file, located in the store (`None`: an all-zero chunk, never fetched).
#[derive(Debug, Clone)]
pub struct Located {
    /// Offset in the file.
    pub offset: u64,
    /// Plain length.
    pub len: u32,
    /// Chunk id.
    pub id: ObjectId,
    /// Where it is stored.
    pub loc: Option<ChunkLocation>,
}

/// The chunks of one file of an image, located, in file order.
#[derive(Debug, Clone)]
pub struct FileChunks {
    /// The file's path in the image.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// Its chunks.
    pub chunks: Vec<Located>,
}

impl FileChunks {
    /// Locates every chunk of the file `path` of `m` (index lookups in parallel).
    pub fn locate(store: &IndexedStore, m: &Manifest, path: &str) -> Result<FileChunks> {
        let (entry, refs) = m.files().find(|(e, _)| e.path == path).ok_or_else(|| StoreError::NotFound {
            what: ObjectKind::ImageFile,
            key: format!("{path} (the image's page map names it, its manifest does not have it)"),
        })?;
        let stored: Vec<(ObjectId, u32)> = refs.iter().filter(|c| !c.zero).map(|c| (c.id, c.len)).collect();
        let mut locs = locate_chunks(store, &stored, path)?.into_iter();
        let mut at = 0u64;
        let chunks = refs
            .iter()
            .map(|c| {
                let loc = if c.zero { None } else { locs.next() };
                let located = Located { offset: at, len: c.len, id: c.id, loc };
                at += c.len as u64;
                located
            })
            .collect();
        Ok(FileChunks { path: path.to_string(), size: entry.size, chunks })
    }

    /// The chunks overlapping `range`.
    fn covering(&self, range: &Range<u64>) -> &[Located] {
        let first = self.chunks.partition_point(|c| c.offset + c.len as u64 <= range.start);
        let last = self.chunks.partition_point(|c| c.offset < range.end);
        &self.chunks[first..last.max(first)]
    }

    /// The buffer size [`FileChunks::read_into`] needs for ranges of up to `range_len` bytes
    /// in a store whose chunks are at most `chunk_max` bytes.
    pub fn buffer_len(range_len: u64, chunk_max: u32) -> usize {
        (range_len + 2 * chunk_max as u64 + 2 * PAGE_SIZE) as usize
    }

    /// Fetches, checks and decodes the chunks covering `range` (page-aligned) into `buf`; a
    /// local store's stored bytes are read into `scratch` first
    /// ([`gstore_store::Store::read_checked_range_buffered`]). Returns where `range.start`
    /// landed in `buf` (page-aligned, since `buf` is).
    pub fn read_into(
        &self,
        store: &IndexedStore,
        range: Range<u64>,
        buf: &mut [u8],
        scratch: &mut Vec<u8>,
        decoder: &mut codec::Decoder<'_>,
    ) -> Result<usize> {
        if range.end > self.size {
            return Err(StoreError::corrupt(
                ObjectKind::ImageFile,
                self.path.clone(),
                format!("the page map needs {} bytes, the file has {}", range.end, self.size),
            )
            .into());
        }
        let chunks = self.covering(&range);
        let base = chunks.first().map_or(range.start, |c| c.offset - c.offset % PAGE_SIZE);
        let need = chunks.last().map_or(0, |c| c.offset + c.len as u64) - base;
        if need as usize > buf.len() {
            return Err(StoreError::Internal(format!("{need} bytes do not fit a {}-byte buffer", buf.len())).into());
        }
        // The bases of delta chunks, read side by side before any is decoded.
        let _bases = store.prefetch_bases(chunks.iter().filter_map(|c| c.loc.and_then(|l| l.bases)))?;
        let mut i = 0;
        while i < chunks.len() {
            let Some(first) = chunks[i].loc else {
                let c = &chunks[i];
                let at = (c.offset - base) as usize;
                buf[at..at + c.len as usize].fill(0);
                i += 1;
                continue;
            };
            // Extend the read over following chunks stored just after this one in the same pack.
            let mut j = i + 1;
            let mut end = first.range().end;
            while let Some(Some(next)) = chunks.get(j).map(|c| c.loc) {
                let r = next.range();
                if next.pack != first.pack || r.start < end || r.start - end > MAX_GAP {
                    break;
                }
                end = r.end;
                j += 1;
            }
            let group = &chunks[i..j];
            let read = store.read_checked_range_buffered(&first.pack, first.offset..end, scratch, |data| {
                for c in group {
                    let loc = c.loc.expect("grouped chunks are stored");
                    let stored = &data[(loc.offset - first.offset) as usize..][..loc.stored_len as usize];
                    let at = (c.offset - base) as usize;
                    decoder
                        .decode_into(loc.codec, stored, &c.id, &mut buf[at..at + c.len as usize])
                        .map_err(|e| self.in_pack(e, &loc.pack))?;
                }
                Ok(())
            });
            read.map_err(|e| self.fetch_error(e, &chunks[i..j]))?;
            i = j;
        }
        Ok((range.start - base) as usize)
    }

    /// The bytes of `range` (page-aligned) from `range.start` on, straight from the store's
    /// range read without a copy, when every chunk covering it is
    /// stored raw, one after the other in one pack: each is checked against its id in place.
    /// `None` when the range is stored otherwise ([`FileChunks::read_into`] then decodes it).
    pub fn raw_view(
        &self,
        store: &IndexedStore,
        range: &Range<u64>,
    ) -> Option<Result<impl std::ops::Deref<Target = [u8]>>> {
        let chunks = self.covering(range);
        let (first, last) = (chunks.first()?, chunks.last()?);
        let start = first.loc?;
        if range.end > self.size || first.offset > range.start || last.offset + (last.len as u64) < range.end {
            return None;
        }
        let mut end = start.offset;
        for c in chunks {
            let l = c.loc?;
            if l.codec != codec::Codec::Raw || l.pack != start.pack || l.offset != end || l.stored_len != c.len {
                return None;
            }
            end += l.stored_len as u64;
        }
        let ids = store.chunk_ids();
        let from = (range.start - first.offset) as usize;
        let read = store.read_checked_range(&start.pack, start.offset..end, |data| {
            for c in chunks {
                let at = (c.offset - first.offset) as usize;
                codec::verify(&data[at..at + c.len as usize], c.len as usize, &c.id, &ids)
                    .map_err(|e| self.in_pack(e, &start.pack))?;
            }
            Ok(data.slice(from..))
        });
        Some(read.map_err(|e| self.fetch_error(e, chunks)))
    }

    /// `e` with the pack and this file named, for damage found in a chunk of it.
    fn in_pack(&self, e: impl Into<StoreError>, pack: &ObjectId) -> StoreError {
        e.into().found_in(format_args!("pack {}, file {}", pack.to_hex(), self.path))
    }

    /// The error of a failed read of `group`, chunks stored one after another in one pack: a
    /// damaged chunk names itself, its pack and file; anything else names the group.
    fn fetch_error(&self, e: StoreError, group: &[Located]) -> LazyError {
        match e {
            e @ StoreError::Corrupt { what: ObjectKind::Chunk, .. } => LazyError::Store(e),
            e => LazyError::Fetch {
                chunk: group[0].id.to_hex(),
                more: group.len() - 1,
                file: self.path.clone(),
                source: Box::new(e),
            },
        }
    }
}
