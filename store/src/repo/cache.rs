//! A local, size-bounded cache of pack ranges fetched from a remote store, so a second
//! restore on the same node reads locally. Only ranges whose chunks were checked go in
//! ([`crate::Store::read_checked_range`]). Entries are files named after the pack, the range
//! and a BLAKE3 prefix of their content (checked on every hit, so a damaged entry is a miss).
//! Least recently used entries are evicted once the cache exceeds its limit; a limit of 0
//! means no cache at all. Every failure here is a miss: the cache never makes a restore fail.

use crate::format::id::ObjectId;
use bytes::Bytes;
use std::ops::Range;
use std::path::PathBuf;

/// Default size limit: 8 GiB (override with `GSTORE_CACHE_BYTES`).
pub const DEFAULT_LIMIT: u64 = 8 << 30;

/// A directory of cached pack ranges.
pub struct RangeCache {
    dir: PathBuf,
    limit: u64,
}

impl RangeCache {
    /// A cache in `dir` holding at most `limit` bytes; `None` (no caching, no reads of what
    /// an earlier run cached) when `limit` is 0.
    pub fn new(dir: PathBuf, limit: u64) -> Option<RangeCache> {
        (limit > 0).then_some(RangeCache { dir, limit })
    }

    fn prefix(pack: &ObjectId, range: &Range<u64>) -> String {
        format!("{}-{}-{}-", pack.to_hex(), range.start, range.end)
    }

    /// The cache entry holding `range` of `pack`, if any.
    fn entry(&self, pack: &ObjectId, range: &Range<u64>) -> Option<std::fs::DirEntry> {
        let prefix = Self::prefix(pack, range);
        std::fs::read_dir(&self.dir).ok()?.flatten().find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
    }

    /// The cached bytes of `range` of `pack`, if present, intact and within the limit (an
    /// entry larger than the limit, cached under a larger one, is dropped).
    pub fn get(&self, pack: &ObjectId, range: &Range<u64>) -> Option<Bytes> {
        let entry = self.entry(pack, range)?;
        let path = entry.path();
        if range.end - range.start > self.limit {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let data = std::fs::read(&path).ok()?;
        let name = entry.file_name().to_string_lossy().to_string();
        if data.len() as u64 != range.end - range.start
            || !name.ends_with(&hex::encode(&blake3::hash(&data).as_bytes()[..8]))
        {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let _ =
            std::fs::File::options().write(true).open(&path).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        Some(Bytes::from(data))
    }

    /// Drops the entry of `range` of `pack` (one whose bytes failed a check).
    pub fn remove(&self, pack: &ObjectId, range: &Range<u64>) {
        if let Some(e) = self.entry(pack, range) {
            let _ = std::fs::remove_file(e.path());
        }
    }

    /// Stores `data` as `range` of `pack`, then evicts the least recently used entries while
    /// the cache is over its limit.
    pub fn put(&self, pack: &ObjectId, range: &Range<u64>, data: &[u8]) {
        if self.limit < data.len() as u64 || std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let name = format!("{}{}", Self::prefix(pack, range), hex::encode(&blake3::hash(data).as_bytes()[..8]));
        let tmp = self.dir.join(format!(".{name}.{}", std::process::id()));
        if std::fs::write(&tmp, data).and_then(|()| std::fs::rename(&tmp, self.dir.join(&name))).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.evict();
    }

    fn evict(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let md = e.metadata().ok()?;
                Some((md.modified().ok()?, md.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.limit {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_miss_damage_and_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RangeCache::new(dir.path().join("c"), 250).unwrap();
        let p = ObjectId::of(b"pack");
        assert!(cache.get(&p, &(0..100)).is_none());
        cache.put(&p, &(0..100), &[1u8; 100]);
        assert_eq!(&cache.get(&p, &(0..100)).unwrap()[..], &[1u8; 100][..]);
        assert!(cache.get(&p, &(0..99)).is_none());
        // A damaged entry is a miss (and is removed).
        let f = std::fs::read_dir(dir.path().join("c")).unwrap().next().unwrap().unwrap().path();
        std::fs::write(&f, [2u8; 100]).unwrap();
        assert!(cache.get(&p, &(0..100)).is_none());
        // Over the limit, the oldest entries go.
        for i in 0..4u64 {
            cache.put(&p, &(i * 100..i * 100 + 100), &[i as u8; 100]);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(cache.get(&p, &(0..100)).is_none());
        assert!(cache.get(&p, &(300..400)).is_some());
    }

    #[test]
    fn removed_entries_and_entries_over_the_limit_are_misses() {
        let dir = tempfile::tempdir().unwrap();
        let p = ObjectId::of(b"pack");
        let big = RangeCache::new(dir.path().join("c"), 1000).unwrap();
        big.put(&p, &(0..100), &[1u8; 100]);
        big.put(&p, &(100..300), &[2u8; 200]);
        big.remove(&p, &(0..100));
        assert!(big.get(&p, &(0..100)).is_none());
        // The same directory under a lower limit: the larger entry is not served, and goes.
        let small = RangeCache::new(dir.path().join("c"), 150).unwrap();
        assert!(small.get(&p, &(100..300)).is_none());
        assert!(big.get(&p, &(100..300)).is_none(), "the entry over the limit was dropped");
        // A limit of 0 is no cache.
        assert!(RangeCache::new(dir.path().join("c"), 0).is_none());
    }
}
