//! The local RocksDB index: where every stored chunk lives (pack, offset, lengths, codec) and
//! per-pack statistics. It is a cache of what the pack footers say and can be rebuilt from
//! them at any time (`gstore index rebuild`).

use crate::codec::Codec;
use crate::error::{Result, StoreError};
use crate::id::ObjectId;
use crate::pack::PackEntry;
use rocksdb::{ColumnFamilyDescriptor, Options, WriteBatch, DB};
use std::path::{Path, PathBuf};

const CF_CHUNKS: &str = "chunks";
const CF_PACKS: &str = "packs";

/// Where one chunk's stored bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLocation {
    /// The pack holding it.
    pub pack: ObjectId,
    /// Offset of the stored bytes in the pack.
    pub offset: u64,
    /// Stored length.
    pub stored_len: u32,
    /// Plain length.
    pub plain_len: u32,
    /// Codec of the stored bytes.
    pub codec: Codec,
}

impl ChunkLocation {
    fn encode(&self) -> [u8; 49] {
        let mut v = [0u8; 49];
        v[..32].copy_from_slice(&self.pack.0);
        v[32..40].copy_from_slice(&self.offset.to_le_bytes());
        v[40..44].copy_from_slice(&self.stored_len.to_le_bytes());
        v[44..48].copy_from_slice(&self.plain_len.to_le_bytes());
        v[48] = self.codec as u8;
        v
    }

    fn decode(v: &[u8]) -> Option<Self> {
        if v.len() != 49 {
            return None;
        }
        Some(ChunkLocation {
            pack: ObjectId::from_slice(&v[..32])?,
            offset: u64::from_le_bytes(v[32..40].try_into().ok()?),
            stored_len: u32::from_le_bytes(v[40..44].try_into().ok()?),
            plain_len: u32::from_le_bytes(v[44..48].try_into().ok()?),
            codec: Codec::from_byte(v[48])?,
        })
    }

    /// The byte range of the stored chunk inside its pack.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.stored_len as u64
    }
}

/// Statistics of one pack, as recorded when it was indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PackStats {
    /// Size of the pack object in bytes.
    pub size: u64,
    /// Number of chunks in it.
    pub chunks: u32,
    /// Sum of the chunks' plain lengths.
    pub plain_bytes: u64,
}

impl PackStats {
    fn encode(&self) -> [u8; 20] {
        let mut v = [0u8; 20];
        v[..8].copy_from_slice(&self.size.to_le_bytes());
        v[8..12].copy_from_slice(&self.chunks.to_le_bytes());
        v[12..20].copy_from_slice(&self.plain_bytes.to_le_bytes());
        v
    }

    fn decode(v: &[u8]) -> Option<Self> {
        Some(PackStats {
            size: u64::from_le_bytes(v.get(..8)?.try_into().ok()?),
            chunks: u32::from_le_bytes(v.get(8..12)?.try_into().ok()?),
            plain_bytes: u64::from_le_bytes(v.get(12..20)?.try_into().ok()?),
        })
    }
}

/// An open index.
pub struct Index {
    db: DB,
    path: PathBuf,
}

impl Index {
    /// Opens (creating if needed) the index at `path`. The caller holds the store lock.
    pub fn open(path: &Path) -> Result<Index> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_keep_log_file_num(2);
        let mut chunk_opts = Options::default();
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        chunk_opts.set_block_based_table_factory(&table);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_CHUNKS, chunk_opts),
            ColumnFamilyDescriptor::new(CF_PACKS, Options::default()),
        ];
        let db = DB::open_cf_descriptors(&opts, path, cfs)
            .map_err(|e| StoreError::Index { path: path.into(), message: e.to_string() })?;
        Ok(Index { db, path: path.into() })
    }

    fn ierr(&self, e: rocksdb::Error) -> StoreError {
        StoreError::Index { path: self.path.clone(), message: e.to_string() }
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("column family created at open")
    }

    /// Where a chunk is stored, if the index knows it. A damaged entry reads as unknown.
    pub fn locate(&self, id: &ObjectId) -> Result<Option<ChunkLocation>> {
        let v = self.db.get_pinned_cf(self.cf(CF_CHUNKS), id.0).map_err(|e| self.ierr(e))?;
        Ok(v.and_then(|v| ChunkLocation::decode(&v)))
    }

    /// Records a pack and all its chunks in one atomic batch. Chunks already located in
    /// another pack keep their first location.
    pub fn add_pack(&self, pack: ObjectId, size: u64, entries: &[PackEntry]) -> Result<()> {
        let mut batch = WriteBatch::default();
        let mut plain = 0u64;
        for e in entries {
            plain += e.plain_len as u64;
            if self.locate(&e.id)?.is_some() {
                continue;
            }
            let loc = ChunkLocation {
                pack,
                offset: e.offset,
                stored_len: e.stored_len,
                plain_len: e.plain_len,
                codec: e.codec,
            };
            batch.put_cf(self.cf(CF_CHUNKS), e.id.0, loc.encode());
        }
        let stats = PackStats { size, chunks: entries.len() as u32, plain_bytes: plain };
        batch.put_cf(self.cf(CF_PACKS), pack.0, stats.encode());
        self.db.write(batch).map_err(|e| self.ierr(e))
    }

    /// Statistics of one pack, if indexed.
    pub fn pack_stats(&self, pack: &ObjectId) -> Result<Option<PackStats>> {
        let v = self.db.get_pinned_cf(self.cf(CF_PACKS), pack.0).map_err(|e| self.ierr(e))?;
        Ok(v.and_then(|v| PackStats::decode(&v)))
    }

    /// Every indexed pack with its statistics.
    pub fn packs(&self) -> Result<Vec<(ObjectId, PackStats)>> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(CF_PACKS), rocksdb::IteratorMode::Start) {
            let (k, v) = item.map_err(|e| self.ierr(e))?;
            if let (Some(id), Some(s)) = (ObjectId::from_slice(&k), PackStats::decode(&v)) {
                out.push((id, s));
            }
        }
        Ok(out)
    }

    /// Removes every entry (before a rebuild).
    pub fn clear(&self) -> Result<()> {
        for cf in [CF_CHUNKS, CF_PACKS] {
            self.db.delete_range_cf(self.cf(cf), &[0u8; 0][..], &[0xffu8; 33][..]).map_err(|e| self.ierr(e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_locate_clear() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::open(&dir.path().join("idx")).unwrap();
        let pack = ObjectId::of(b"pack");
        let e = PackEntry { id: ObjectId::of(b"c"), offset: 8, stored_len: 5, plain_len: 9, codec: Codec::Zstd };
        idx.add_pack(pack, 100, &[e]).unwrap();
        let loc = idx.locate(&e.id).unwrap().unwrap();
        assert_eq!((loc.pack, loc.offset, loc.stored_len, loc.plain_len, loc.codec), (pack, 8, 5, 9, Codec::Zstd));
        // A second pack with the same chunk does not move it.
        idx.add_pack(ObjectId::of(b"other"), 50, &[PackEntry { offset: 99, ..e }]).unwrap();
        assert_eq!(idx.locate(&e.id).unwrap().unwrap().pack, pack);
        assert_eq!(idx.packs().unwrap().len(), 2);
        assert_eq!(idx.pack_stats(&pack).unwrap().unwrap().plain_bytes, 9);
        idx.clear().unwrap();
        assert!(idx.locate(&e.id).unwrap().is_none());
        assert!(idx.packs().unwrap().is_empty());
    }
}
