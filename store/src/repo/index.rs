//! The local RocksDB index: where every stored chunk lives (pack, offset, lengths, codec) and
//! per-pack statistics. It is a cache of what the pack footers say and can be rebuilt from
//! them at any time (`gstore index rebuild`).
//!
//! A chunk may be held by more than one pack (two machines uploaded it at once, or gc copied
//! it into a new pack), so chunk entries are keyed by chunk id and pack id. Packs that gc has
//! tombstoned ("doomed") are used only when no other pack holds the chunk, and never to
//! deduplicate a push against.

use crate::codec::{Codec, DeltaBases};
use crate::dedup::similar::Sketch;
use crate::error::{Result, StoreError};
use crate::format::damage::DamagedCopy;
use crate::format::id::ObjectId;
use crate::format::pack::PackEntry;
use rocksdb::{ColumnFamilyDescriptor, Options, SliceTransform, WriteBatch, DB};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// What to do about an index that cannot be used.
const REBUILD_HINT: &str = "it is only a cache of the pack footers: run `gstore index rebuild`";

const CF_CHUNKS: &str = "chunks";
const CF_PACKS: &str = "packs";
const CF_DOOMED: &str = "doomed";
/// Resemblance sketches of stored chunks (crate::dedup::similar): `[feature index, super-feature
/// u64 LE]` -> chunk id, for finding the stored chunk a new one is most like.
const CF_SIMILAR: &str = "similar";
/// Where every chunk of an image was found when it was last planned ([`Index::put_plan`]).
const CF_PLANS: &str = "plans";
/// Stored copies damage records name ([`crate::format::damage`]): `[chunk id, pack id]` -> nothing.
const CF_DAMAGED: &str = "damaged";
/// Every column family but the default one.
const FAMILIES: [&str; 6] = [CF_CHUNKS, CF_PACKS, CF_DOOMED, CF_SIMILAR, CF_PLANS, CF_DAMAGED];
/// Key (in the default column family) holding the index layout version.
const FORMAT_KEY: &[u8] = b"format";
/// The layout written by this version: chunk entries keyed by chunk id + pack id. Layout 3
/// adds the damaged copies and drops the plans layout 2 recorded (they may name orphan deltas:
/// [`Index::pick`]).
const FORMAT: &[u8] = b"3";

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
    /// For a delta chunk, the chunks it is stored against.
    pub bases: Option<DeltaBases>,
}

impl ChunkLocation {
    /// Where the chunk of footer entry `e` of pack `pack` is.
    pub fn in_pack(pack: ObjectId, e: &PackEntry) -> ChunkLocation {
        ChunkLocation {
            pack,
            offset: e.offset,
            stored_len: e.stored_len,
            plain_len: e.plain_len,
            codec: e.codec,
            bases: e.bases,
        }
    }

    /// Value of a chunk entry (the pack id is in its key): 17 bytes, and a delta's base ids.
    fn encode_value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(81);
        v.extend_from_slice(&self.offset.to_le_bytes());
        v.extend_from_slice(&self.stored_len.to_le_bytes());
        v.extend_from_slice(&self.plain_len.to_le_bytes());
        v.push(self.codec as u8);
        for b in self.bases.iter().flat_map(DeltaBases::iter) {
            v.extend_from_slice(&b.0);
        }
        v
    }

    fn decode(key: &[u8], v: &[u8]) -> Option<Self> {
        if key.len() != 64 || ![17, 49, 81].contains(&v.len()) {
            return None;
        }
        let codec = Codec::from_byte(v[16])?;
        let bases = v
            .get(17..49)
            .and_then(ObjectId::from_slice)
            .map(|first| DeltaBases { first, second: v.get(49..81).and_then(ObjectId::from_slice) });
        if (codec == Codec::Delta) != bases.is_some() {
            return None;
        }
        Some(ChunkLocation {
            pack: ObjectId::from_slice(&key[32..])?,
            offset: u64::from_le_bytes(v[..8].try_into().ok()?),
            stored_len: u32::from_le_bytes(v[8..12].try_into().ok()?),
            plain_len: u32::from_le_bytes(v[12..16].try_into().ok()?),
            codec,
            bases,
        })
    }

    /// The byte range of the stored chunk inside its pack.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.stored_len as u64
    }
}

/// The value [`Index::put_plan`] records, built one location at a time: the packs named (32
/// bytes each, after their count, u32 LE), then the count of locations (u32 LE) and each as
/// its pack's number (u32 LE), its value's length (u8) and its chunk entry value.
#[derive(Default)]
pub struct PlanRecord {
    packs: Vec<ObjectId>,
    numbers: std::collections::HashMap<ObjectId, u32>,
    body: Vec<u8>,
    count: u32,
}

impl PlanRecord {
    /// Appends the next location.
    pub fn push(&mut self, loc: &ChunkLocation) {
        let next = self.packs.len() as u32;
        let n = *self.numbers.entry(loc.pack).or_insert_with(|| next);
        if n == next {
            self.packs.push(loc.pack);
        }
        let v = loc.encode_value();
        self.body.extend_from_slice(&n.to_le_bytes());
        self.body.push(v.len() as u8);
        self.body.extend_from_slice(&v);
        self.count += 1;
    }

    fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 32 * self.packs.len() + self.body.len());
        out.extend_from_slice(&(self.packs.len() as u32).to_le_bytes());
        for p in &self.packs {
            out.extend_from_slice(&p.0);
        }
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

/// A plan [`Index::put_plan`] recorded, read back: its framing checked, its locations decoded
/// one by one as they are taken (a large model's plan holds hundreds of thousands), each
/// `None` where its value does not decode.
pub struct RecordedPlan {
    value: Vec<u8>,
    packs: Vec<ObjectId>,
    /// Where the next location starts.
    at: usize,
    left: usize,
}

impl RecordedPlan {
    /// Checks the framing of a recorded value: the pack list, and every location's pack
    /// number and length within it, with nothing behind the last.
    fn parse(value: Vec<u8>) -> Option<RecordedPlan> {
        let v = &value;
        let u32_at = |at: usize| Some(u32::from_le_bytes(v.get(at..at + 4)?.try_into().ok()?) as usize);
        let np = u32_at(0)?;
        let packs: Vec<ObjectId> = v
            .get(4..4usize.checked_add(np.checked_mul(32)?)?)?
            .chunks_exact(32)
            .map(ObjectId::from_slice)
            .collect::<Option<_>>()?;
        let first = 4 + 32 * np + 4;
        let count = u32_at(first - 4)?;
        let mut at = first;
        for _ in 0..count {
            if u32_at(at)? >= packs.len() {
                return None;
            }
            at += 5 + *v.get(at + 4)? as usize;
        }
        (at == v.len()).then_some(RecordedPlan { value, packs, at: first, left: count })
    }

    /// The locations it holds.
    pub fn len(&self) -> usize {
        self.left
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

impl Iterator for RecordedPlan {
    type Item = Option<ChunkLocation>;

    fn next(&mut self) -> Option<Option<ChunkLocation>> {
        if self.left == 0 {
            return None;
        }
        let v = &self.value;
        // The framing was checked when the plan was read.
        let pack = &self.packs[u32::from_le_bytes(v[self.at..self.at + 4].try_into().expect("four bytes")) as usize];
        let len = v[self.at + 4] as usize;
        let mut key = [0u8; 64];
        key[32..].copy_from_slice(&pack.0);
        let loc = ChunkLocation::decode(&key, &v[self.at + 5..self.at + 5 + len]);
        self.at += 5 + len;
        self.left -= 1;
        Some(loc)
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
    /// Packs gc has tombstoned, as last seen (mirrors the doomed column family).
    doomed: RwLock<HashSet<ObjectId>>,
    /// Stored copies damage records name, as last read (mirrors the damaged column family).
    damaged: RwLock<HashSet<DamagedCopy>>,
    /// True when the index was created (or reset from an older layout) by this open and has
    /// to be filled from the pack footers.
    empty_at_open: bool,
}

/// Writes what this handle added to the index into its table files before it closes, so
/// that the next open reads them rather than replaying the write-ahead log entry by entry
/// (after a push of 4 GiB of page images, 0.35 s of the next command's start). A failed flush
/// loses nothing: the log still holds the writes.
impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

fn similar_key(feature: usize, sf: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = feature as u8;
    k[1..].copy_from_slice(&sf.to_le_bytes());
    k
}

fn chunk_key(chunk: &ObjectId, pack: &ObjectId) -> [u8; 64] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(&chunk.0);
    k[32..].copy_from_slice(&pack.0);
    k
}

impl Index {
    /// Opens (creating if needed) the index at `path`. The caller holds the store lock. An
    /// index in an older layout is emptied; [`Index::needs_fill`] then says so.
    pub fn open(path: &Path) -> Result<Index> {
        // A command writes at most a few MB of index: preallocating each new log for a whole
        // memtable (~70 MB by default) only costs time at every open (pages zeroed on tmpfs,
        // extents on ext4): a fifth of gc_sim's time went there. (No setter in the crate.)
        let mut opts = Options::default()
            .get_options_from_string("allow_fallocate=false")
            .map_err(|e| StoreError::Internal(format!("index options: {e}")))?;
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_keep_log_file_num(2);
        let mut chunk_opts = Options::default();
        chunk_opts.set_prefix_extractor(SliceTransform::create_fixed_prefix(32));
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(false);
        chunk_opts.set_block_based_table_factory(&table);
        chunk_opts.set_memtable_prefix_bloom_ratio(0.1);
        // Ids and features are random bytes: compressing their tables costs time and saves
        // nothing.
        chunk_opts.set_compression_type(rocksdb::DBCompressionType::None);
        // Most features a push looks up are in no stored chunk: a filter answers those.
        let mut similar_opts = Options::default();
        let mut similar_table = rocksdb::BlockBasedOptions::default();
        similar_table.set_bloom_filter(10.0, false);
        similar_opts.set_block_based_table_factory(&similar_table);
        similar_opts.set_compression_type(rocksdb::DBCompressionType::None);
        similar_opts.set_memtable_whole_key_filtering(true);
        similar_opts.set_memtable_prefix_bloom_ratio(0.1);
        // A push adds 8 entries for each new chunk of a page image (~22 MB of memtable per
        // 4 GiB): smaller memtables are written out while the push runs, leaving less to
        // write when the handle closes.
        similar_opts.set_write_buffer_size(8 << 20);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_CHUNKS, chunk_opts),
            ColumnFamilyDescriptor::new(CF_PACKS, Options::default()),
            ColumnFamilyDescriptor::new(CF_DOOMED, Options::default()),
            ColumnFamilyDescriptor::new(CF_SIMILAR, similar_opts),
            ColumnFamilyDescriptor::new(CF_PLANS, Options::default()),
            ColumnFamilyDescriptor::new(CF_DAMAGED, Options::default()),
        ];
        // Whatever stops the index from opening, rebuilding it (which deletes it unopened)
        // gets past it: say so.
        let unusable = |e: rocksdb::Error| StoreError::Index {
            path: path.into(),
            message: format!("cannot open the local index ({e}); {REBUILD_HINT} to build it anew"),
        };
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(unusable)?;
        let mut index = Index {
            db,
            path: path.into(),
            doomed: RwLock::new(HashSet::new()),
            damaged: RwLock::new(HashSet::new()),
            empty_at_open: false,
        };
        let format = index.db.get(FORMAT_KEY).map_err(unusable)?;
        if format.as_deref() != Some(FORMAT) {
            index.clear()?;
            index.db.put(FORMAT_KEY, FORMAT).map_err(|e| index.ierr(e))?;
            index.empty_at_open = true;
        }
        let mut doomed = HashSet::new();
        for item in index.db.iterator_cf(index.cf(CF_DOOMED), rocksdb::IteratorMode::Start) {
            let (k, _) = item.map_err(unusable)?;
            doomed.extend(ObjectId::from_slice(&k));
        }
        index.doomed = RwLock::new(doomed);
        let mut damaged = HashSet::new();
        for item in index.db.iterator_cf(index.cf(CF_DAMAGED), rocksdb::IteratorMode::Start) {
            let (k, _) = item.map_err(unusable)?;
            if let (Some(c), Some(p)) =
                (k.get(..32).and_then(ObjectId::from_slice), k.get(32..).and_then(ObjectId::from_slice))
            {
                damaged.insert((c, p));
            }
        }
        index.damaged = RwLock::new(damaged);
        Ok(index)
    }

    /// True when this open created the index (or reset one in an older layout), so it must be
    /// filled from the pack footers before use.
    pub fn needs_fill(&self) -> bool {
        self.empty_at_open
    }

    fn ierr(&self, e: rocksdb::Error) -> StoreError {
        let message = if e.kind() == rocksdb::ErrorKind::Corruption {
            format!("{e}: the local index is damaged; {REBUILD_HINT}")
        } else {
            e.to_string()
        };
        StoreError::Index { path: self.path.clone(), message }
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("column family created at open")
    }

    /// An iterator over the chunk entries, for looking up chunks one after another.
    fn chunk_iterator(&self) -> rocksdb::DBRawIterator<'_> {
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_prefix_same_as_start(true);
        self.db.raw_iterator_cf_opt(self.cf(CF_CHUNKS), opts)
    }

    /// Every pack holding chunk `id`, read through `it` (damaged entries are skipped).
    fn holders_in(&self, it: &mut rocksdb::DBRawIterator<'_>, id: &ObjectId) -> Result<Vec<ChunkLocation>> {
        it.seek(id.0);
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(&id.0) {
                break;
            }
            out.extend(ChunkLocation::decode(k, v));
            it.next();
        }
        it.status().map_err(|e| self.ierr(e))?;
        Ok(out)
    }

    /// The holder of chunk `id` to use among `holders`, looked up through `it`: one whose
    /// bytes can be decoded, i.e. not a delta whose bases are stored whole nowhere (gc may keep
    /// a dead delta in a pack that stays for its other chunks while it deletes the delta's
    /// bases: such an orphan is no copy of the chunk). A copy in a pack gc has not tombstoned
    /// is preferred, then one in a tombstoned pack (readable until gc deletes it), then one a
    /// damage record names; `for_dedup` takes only the first kind, for the delta and its bases
    /// alike. A damaged copy of a base never counts.
    fn pick(
        &self,
        it: &mut rocksdb::DBRawIterator<'_>,
        id: &ObjectId,
        holders: Vec<ChunkLocation>,
        for_dedup: bool,
    ) -> Result<Option<ChunkLocation>> {
        let doomed = self.doomed.read().expect("doomed set lock");
        let damaged = self.damaged.read().expect("damaged set lock");
        let mut best: Option<(u8, ChunkLocation)> = None;
        for l in holders {
            let tier = if damaged.contains(&(*id, l.pack)) { 2 } else { u8::from(doomed.contains(&l.pack)) };
            if (for_dedup && tier > 0) || best.is_some_and(|(t, _)| t <= tier) {
                continue;
            }
            let base_ok = |base: &ObjectId, pack: &ObjectId| {
                !(damaged.contains(&(*base, *pack)) || for_dedup && doomed.contains(pack))
            };
            if !self.bases_stored_whole(it, &l, base_ok)? {
                continue;
            }
            if tier == 0 {
                return Ok(Some(l));
            }
            best = Some((tier, l));
        }
        Ok(best.map(|(_, l)| l))
    }

    /// True when every base of `loc` (none unless it is a delta) is stored whole in some pack
    /// where `accept(base, pack)` takes it.
    fn bases_stored_whole(
        &self,
        it: &mut rocksdb::DBRawIterator<'_>,
        loc: &ChunkLocation,
        accept: impl Fn(&ObjectId, &ObjectId) -> bool,
    ) -> Result<bool> {
        for base in loc.bases.iter().flat_map(DeltaBases::iter) {
            let holders = self.holders_in(it, &base)?;
            if !holders.iter().any(|h| h.codec != Codec::Delta && accept(&base, &h.pack)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Every pack holding chunk `id`, per the index, usable or not (to tell why none is).
    pub fn holders(&self, id: &ObjectId) -> Result<Vec<ChunkLocation>> {
        self.holders_in(&mut self.chunk_iterator(), id)
    }

    /// Where a chunk is stored, if the index knows a usable copy: in a pack gc has not
    /// tombstoned if there is one, else in a tombstoned one (still readable until gc deletes
    /// it). A delta counts only while its bases are stored whole.
    pub fn locate(&self, id: &ObjectId) -> Result<Option<ChunkLocation>> {
        let mut it = self.chunk_iterator();
        let holders = self.holders_in(&mut it, id)?;
        self.pick(&mut it, id, holders, false)
    }

    /// [`Index::locate`] for many chunks (answers in `ids`' order), through one iterator
    /// seeking them in key order: for planning restores, which look up every distinct chunk
    /// of an image.
    pub fn locate_many(&self, ids: &[ObjectId]) -> Result<Vec<Option<ChunkLocation>>> {
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_unstable_by_key(|&i| ids[i]);
        let mut it = self.chunk_iterator();
        let mut found = vec![None; ids.len()];
        for i in order {
            let holders = self.holders_in(&mut it, &ids[i])?;
            found[i] = self.pick(&mut it, &ids[i], holders, false)?;
        }
        Ok(found)
    }

    /// Where a chunk is stored in a pack a push may deduplicate against (one gc has not
    /// tombstoned), if any; a delta only while its bases are stored whole in such packs.
    pub fn locate_for_dedup(&self, id: &ObjectId) -> Result<Option<ChunkLocation>> {
        let mut it = self.chunk_iterator();
        let holders = self.holders_in(&mut it, id)?;
        self.pick(&mut it, id, holders, true)
    }

    /// Records a pack and all its chunks in one atomic batch.
    pub fn add_pack(&self, pack: ObjectId, size: u64, entries: &[PackEntry]) -> Result<()> {
        let mut batch = WriteBatch::default();
        let mut value = Vec::with_capacity(20 + 32 * entries.len());
        value.extend_from_slice(&[0u8; 20]);
        let mut plain = 0u64;
        for e in entries {
            plain += e.plain_len as u64;
            let loc = ChunkLocation::in_pack(pack, e);
            batch.put_cf(self.cf(CF_CHUNKS), chunk_key(&e.id, &pack), loc.encode_value());
            value.extend_from_slice(&e.id.0);
        }
        let stats = PackStats { size, chunks: entries.len() as u32, plain_bytes: plain };
        value[..20].copy_from_slice(&stats.encode());
        batch.put_cf(self.cf(CF_PACKS), pack.0, value);
        self.db.write(batch).map_err(|e| self.ierr(e))
    }

    /// Records the resemblance sketches of newly stored chunks (a later one with the same
    /// super-feature replaces an earlier one).
    pub fn add_sketches(&self, sketches: &[(ObjectId, Sketch)]) -> Result<()> {
        let mut entries: Vec<([u8; 9], &ObjectId)> = sketches
            .iter()
            .flat_map(|(id, sketch)| sketch.iter().enumerate().map(move |(i, sf)| (similar_key(i, *sf), id)))
            .collect();
        // In key order (the last of equal keys kept): each goes into the memtable from where
        // the one before went, not from the top of its skip list.
        entries.sort_by_key(|(k, _)| *k);
        let mut batch = WriteBatch::default();
        for (key, id) in entries {
            batch.put_cf(self.cf(CF_SIMILAR), key, id.0);
        }
        self.db.write(batch).map_err(|e| self.ierr(e))
    }

    /// Stored chunks that share a super-feature with `sketch`, most shared first (ties in
    /// feature order); entries may name chunks since deleted: callers locate them.
    pub fn similar(&self, sketch: &Sketch) -> Result<Vec<ObjectId>> {
        let keys: Vec<_> =
            sketch.iter().enumerate().map(|(i, sf)| (self.cf(CF_SIMILAR), similar_key(i, *sf))).collect();
        let mut found: Vec<(ObjectId, usize)> = Vec::new();
        for v in self.db.multi_get_cf(keys) {
            let Some(id) = v.map_err(|e| self.ierr(e))?.and_then(|v| ObjectId::from_slice(&v)) else { continue };
            match found.iter_mut().find(|(f, _)| *f == id) {
                Some((_, n)) => *n += 1,
                None => found.push((id, 1)),
            }
        }
        found.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        Ok(found.into_iter().map(|(id, _)| id).collect())
    }

    /// Forgets a pack (gc deleted it) and every chunk entry pointing into it.
    pub fn remove_pack(&self, pack: &ObjectId) -> Result<()> {
        let Some(v) = self.db.get_pinned_cf(self.cf(CF_PACKS), pack.0).map_err(|e| self.ierr(e))? else {
            return Ok(());
        };
        let mut batch = WriteBatch::default();
        for id in v.get(20..).unwrap_or_default().chunks_exact(32) {
            let id = ObjectId::from_slice(id).expect("32 bytes");
            batch.delete_cf(self.cf(CF_CHUNKS), chunk_key(&id, pack));
        }
        batch.delete_cf(self.cf(CF_PACKS), pack.0);
        batch.delete_cf(self.cf(CF_DOOMED), pack.0);
        // Recorded plans may name the pack: they go too (the next plan of each image looks
        // its chunks up again).
        batch.delete_range_cf(self.cf(CF_PLANS), &[0u8; 0][..], &[0xffu8; 33][..]);
        drop(v);
        self.db.write(batch).map_err(|e| self.ierr(e))?;
        self.doomed.write().expect("doomed set lock").remove(pack);
        Ok(())
    }

    /// Replaces the set of packs gc has tombstoned (as just listed).
    pub fn set_doomed(&self, packs: &HashSet<ObjectId>) -> Result<()> {
        let mut current = self.doomed.write().expect("doomed set lock");
        let mut batch = WriteBatch::default();
        for p in current.difference(packs) {
            batch.delete_cf(self.cf(CF_DOOMED), p.0);
        }
        for p in packs.difference(&current) {
            batch.put_cf(self.cf(CF_DOOMED), p.0, []);
        }
        self.db.write(batch).map_err(|e| self.ierr(e))?;
        *current = packs.clone();
        Ok(())
    }

    /// Replaces the set of stored copies damage records name (as just read). Recorded plans go
    /// when it changes: they may name a copy now known to be damaged.
    pub fn set_damaged(&self, copies: &HashSet<DamagedCopy>) -> Result<()> {
        let mut current = self.damaged.write().expect("damaged set lock");
        if *current == *copies {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for (c, p) in current.difference(copies) {
            batch.delete_cf(self.cf(CF_DAMAGED), chunk_key(c, p));
        }
        for (c, p) in copies.difference(&current) {
            batch.put_cf(self.cf(CF_DAMAGED), chunk_key(c, p), []);
        }
        batch.delete_range_cf(self.cf(CF_PLANS), &[0u8; 0][..], &[0xffu8; 33][..]);
        self.db.write(batch).map_err(|e| self.ierr(e))?;
        *current = copies.clone();
        Ok(())
    }

    /// Records where every chunk of an image is (`locations`, in the planner's order), under
    /// `key`, which names the image's chunk list ([`PlanRecord`] builds the value).
    pub fn put_plan(&self, key: &ObjectId, record: PlanRecord) -> Result<()> {
        self.db.put_cf(self.cf(CF_PLANS), key.0, record.finish()).map_err(|e| self.ierr(e))
    }

    /// The locations recorded under `key` by [`Index::put_plan`], if there are and they still
    /// hold: every pack they name is indexed, not tombstoned and holds no copy a damage
    /// record names (a pack is written once and never changed while it exists:
    /// docs/FORMAT.md; a plan made before a healing push names the damaged copy, the index
    /// now a good one). A record whose framing is damaged counts as none.
    pub fn plan(&self, key: &ObjectId) -> Result<Option<RecordedPlan>> {
        let Some(v) = self.db.get_cf(self.cf(CF_PLANS), key.0).map_err(|e| self.ierr(e))? else {
            return Ok(None);
        };
        let Some(plan) = RecordedPlan::parse(v) else { return Ok(None) };
        {
            let doomed = self.doomed.read().expect("doomed set lock");
            let damaged = self.damaged.read().expect("damaged set lock");
            if plan.packs.iter().any(|p| doomed.contains(p) || damaged.iter().any(|(_, d)| d == p)) {
                return Ok(None);
            }
        }
        for p in &plan.packs {
            if self.db.get_pinned_cf(self.cf(CF_PACKS), p.0).map_err(|e| self.ierr(e))?.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(plan))
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
        for cf in FAMILIES {
            self.db.delete_range_cf(self.cf(cf), &[0u8; 0][..], &[0xffu8; 65][..]).map_err(|e| self.ierr(e))?;
        }
        self.doomed.write().expect("doomed set lock").clear();
        self.damaged.write().expect("damaged set lock").clear();
        // A range deletion in a memtable turns its bloom filter off (RocksDB reads every key
        // through the table then): written to table files, it leaves a fresh memtable, whose
        // filter answers the sketch lookups of the push that follows (they were a quarter of
        // the extra CPU time of a store's first push of page images).
        self.flush()
    }

    /// Writes every column family's memtable to table files.
    fn flush(&self) -> Result<()> {
        let handles: Vec<&rocksdb::ColumnFamily> = FAMILIES.iter().filter_map(|n| self.db.cf_handle(n)).collect();
        self.db.flush_cfs_opt(&handles, &rocksdb::FlushOptions::default()).map_err(|e| self.ierr(e))?;
        self.db.flush().map_err(|e| self.ierr(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_locate_remove_clear() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::open(&dir.path().join("idx")).unwrap();
        assert!(idx.needs_fill());
        let pack = ObjectId::of(b"pack");
        let e = PackEntry {
            id: ObjectId::of(b"c"),
            offset: 8,
            stored_len: 5,
            plain_len: 9,
            codec: Codec::Zstd,
            bases: None,
        };
        idx.add_pack(pack, 100, &[e]).unwrap();
        let loc = idx.locate(&e.id).unwrap().unwrap();
        assert_eq!((loc.pack, loc.offset, loc.stored_len, loc.plain_len, loc.codec), (pack, 8, 5, 9, Codec::Zstd));
        // A second pack with the same chunk is a second holder.
        let other = ObjectId::of(b"other");
        idx.add_pack(other, 50, &[PackEntry { offset: 99, ..e }]).unwrap();
        assert_eq!(idx.holders(&e.id).unwrap().len(), 2);
        assert_eq!(idx.packs().unwrap().len(), 2);
        assert_eq!(idx.pack_stats(&pack).unwrap().unwrap().plain_bytes, 9);
        // A doomed holder is used only when it is the last one, and never for dedup.
        idx.set_doomed(&[pack].into()).unwrap();
        assert_eq!(idx.locate(&e.id).unwrap().unwrap().pack, other);
        idx.remove_pack(&other).unwrap();
        assert_eq!(idx.locate(&e.id).unwrap().unwrap().pack, pack);
        assert!(idx.locate_for_dedup(&e.id).unwrap().is_none());
        drop(idx);
        // The doomed set and the format survive a reopen.
        let idx = Index::open(&dir.path().join("idx")).unwrap();
        assert!(!idx.needs_fill());
        assert!(idx.locate_for_dedup(&e.id).unwrap().is_none());
        idx.clear().unwrap();
        assert!(idx.locate(&e.id).unwrap().is_none());
        assert!(idx.packs().unwrap().is_empty());
    }

    #[test]
    fn a_recorded_plan_comes_back_while_its_packs_are_there() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::open(&dir.path().join("idx")).unwrap();
        let (p1, p2) = (ObjectId::of(b"p1"), ObjectId::of(b"p2"));
        let entry = |name: &[u8], offset, codec, bases| PackEntry {
            id: ObjectId::of(name),
            offset,
            stored_len: 10,
            plain_len: 20,
            codec,
            bases,
        };
        let delta = entry(b"d", 30, Codec::Delta, Some(DeltaBases { first: ObjectId::of(b"a"), second: None }));
        idx.add_pack(p1, 100, &[entry(b"a", 24, Codec::Raw, None), delta]).unwrap();
        idx.add_pack(p2, 100, &[entry(b"b", 24, Codec::Zstd, None)]).unwrap();
        let locations: Vec<ChunkLocation> = [b"b".as_slice(), b"a", b"d", b"b"]
            .iter()
            .map(|n| idx.locate(&ObjectId::of(n)).unwrap().unwrap())
            .collect();
        let located: Vec<Option<ChunkLocation>> = locations.iter().cloned().map(Some).collect();
        let key = ObjectId::of(b"image");
        assert!(idx.plan(&key).unwrap().is_none());
        let record_plan = || {
            let mut record = PlanRecord::default();
            locations.iter().for_each(|l| record.push(l));
            idx.put_plan(&key, record).unwrap();
        };
        record_plan();
        assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
        // A tombstoned pack: not used (its chunks may have moved).
        idx.set_doomed(&[p2].into()).unwrap();
        assert!(idx.plan(&key).unwrap().is_none());
        idx.set_doomed(&HashSet::new()).unwrap();
        assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
        // A plan recorded once a copy in it was known damaged (by the restore that failed on
        // it) is not used once a push stored a good copy: it names the pack holding the bad one.
        idx.set_damaged(&[(ObjectId::of(b"b"), p2)].into()).unwrap();
        record_plan();
        assert!(idx.plan(&key).unwrap().is_none(), "a plan naming a damaged copy was used");
        idx.set_damaged(&HashSet::new()).unwrap();
        record_plan();
        assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), located);
        // A record whose framing is damaged counts as none; a location whose value does not
        // decode comes back as none, the others as they were.
        idx.db.put_cf(idx.cf(CF_PLANS), key.0, [1u8, 0, 0]).unwrap();
        assert!(idx.plan(&key).unwrap().is_none());
        record_plan();
        let mut value = idx.db.get_cf(idx.cf(CF_PLANS), key.0).unwrap().unwrap();
        let mut cut = value.clone();
        cut.pop();
        idx.db.put_cf(idx.cf(CF_PLANS), key.0, &cut).unwrap();
        assert!(idx.plan(&key).unwrap().is_none(), "a record cut short was used");
        // The first location's codec byte (behind the pack list, the count, its pack number,
        // its length and 16 bytes of offset and lengths).
        let codec_at = 4 + 32 * 2 + 4 + 5 + 16;
        value[codec_at] = 0xee;
        idx.db.put_cf(idx.cf(CF_PLANS), key.0, &value).unwrap();
        let mut damaged_first = located.clone();
        damaged_first[0] = None;
        assert_eq!(idx.plan(&key).unwrap().unwrap().collect::<Vec<_>>(), damaged_first);
        record_plan();
        // A pack gc removed takes every record with it.
        idx.remove_pack(&p2).unwrap();
        assert!(idx.plan(&key).unwrap().is_none());
        assert!(idx.db.get_cf(idx.cf(CF_PLANS), key.0).unwrap().is_none());
    }

    #[test]
    fn a_delta_whose_bases_are_gone_is_no_copy() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::open(dir.path()).unwrap();
        // Pack ids ordered so that the orphan's pack comes first among the holders.
        let (orphan_pack, whole_pack, base_pack) = (ObjectId([1; 32]), ObjectId([2; 32]), ObjectId([3; 32]));
        let (chunk, base) = (ObjectId::of(b"chunk"), ObjectId::of(b"base"));
        let entry = |id, codec, bases| PackEntry { id, offset: 24, stored_len: 10, plain_len: 20, codec, bases };
        let delta = entry(chunk, Codec::Delta, Some(DeltaBases::one(base)));
        idx.add_pack(orphan_pack, 100, &[delta]).unwrap();
        // Its base is stored nowhere: the chunk has no usable copy.
        assert!(idx.locate(&chunk).unwrap().is_none());
        assert!(idx.locate_for_dedup(&chunk).unwrap().is_none());
        assert_eq!(idx.locate_many(&[chunk]).unwrap(), vec![None]);
        // A whole copy elsewhere is the one used.
        idx.add_pack(whole_pack, 100, &[entry(chunk, Codec::Zstd, None)]).unwrap();
        for found in [idx.locate(&chunk), idx.locate_for_dedup(&chunk), idx.locate_many(&[chunk]).map(|v| v[0])] {
            assert_eq!(found.unwrap().unwrap().pack, whole_pack);
        }
        // With its base stored whole, the delta (first in key order) is a copy again...
        idx.add_pack(base_pack, 100, &[entry(base, Codec::Raw, None)]).unwrap();
        assert_eq!(idx.locate_for_dedup(&chunk).unwrap().unwrap().pack, orphan_pack);
        // ...but not for dedup while its base's only pack is tombstoned, nor when that base
        // is itself only a delta.
        idx.set_doomed(&[base_pack].into()).unwrap();
        assert_eq!(idx.locate_for_dedup(&chunk).unwrap().unwrap().pack, whole_pack);
        assert_eq!(idx.locate(&chunk).unwrap().unwrap().pack, orphan_pack);
        idx.remove_pack(&whole_pack).unwrap();
        assert!(idx.locate_for_dedup(&chunk).unwrap().is_none());
        idx.remove_pack(&base_pack).unwrap();
        let other = ObjectId::of(b"other");
        idx.add_pack(base_pack, 100, &[entry(base, Codec::Delta, Some(DeltaBases::one(other)))]).unwrap();
        assert!(idx.locate(&chunk).unwrap().is_none());
    }

    #[test]
    fn a_damaged_copy_is_used_last_and_never_for_dedup() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::open(dir.path()).unwrap();
        let (p1, p2) = (ObjectId([1; 32]), ObjectId([2; 32]));
        let c = ObjectId::of(b"c");
        let e = PackEntry { id: c, offset: 24, stored_len: 10, plain_len: 20, codec: Codec::Zstd, bases: None };
        idx.add_pack(p1, 100, &[e]).unwrap();
        idx.set_damaged(&[(c, p1)].into()).unwrap();
        // Its only copy: read (a clear error then), never deduplicated against.
        assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p1);
        assert!(idx.locate_for_dedup(&c).unwrap().is_none());
        // Another copy, even in a tombstoned pack, comes first.
        idx.add_pack(p2, 100, &[e]).unwrap();
        idx.set_doomed(&[p2].into()).unwrap();
        assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p2);
        assert_eq!(idx.locate_many(&[c]).unwrap()[0].unwrap().pack, p2);
        drop(idx);
        // The set survives a reopen.
        let idx = Index::open(dir.path()).unwrap();
        assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p2);
        idx.set_damaged(&HashSet::new()).unwrap();
        assert_eq!(idx.locate(&c).unwrap().unwrap().pack, p1);
    }

    #[test]
    fn many_lookups_answer_as_single_ones_in_the_order_asked() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::open(dir.path()).unwrap();
        let (a, b) = (ObjectId::of(b"pack a"), ObjectId::of(b"pack b"));
        let entry = |n: u32| PackEntry {
            id: ObjectId::of(&n.to_le_bytes()),
            offset: u64::from(n) * 10,
            stored_len: 10,
            plain_len: 10,
            codec: Codec::Raw,
            bases: None,
        };
        idx.add_pack(a, 1000, &(0..50).map(entry).collect::<Vec<_>>()).unwrap();
        // Chunks 40..60 are in both packs; pack a is doomed, so b holds them for lookups.
        idx.add_pack(b, 1000, &(40..60).map(entry).collect::<Vec<_>>()).unwrap();
        idx.set_doomed(&[a].into()).unwrap();
        let ids: Vec<ObjectId> = (0..70u32).rev().map(|n| ObjectId::of(&n.to_le_bytes())).collect();
        let many = idx.locate_many(&ids).unwrap();
        let single: Vec<_> = ids.iter().map(|id| idx.locate(id).unwrap()).collect();
        assert_eq!(
            many.iter().map(|l| l.map(|l| (l.pack, l.offset))).collect::<Vec<_>>(),
            single.iter().map(|l| l.map(|l| (l.pack, l.offset))).collect::<Vec<_>>()
        );
        assert_eq!(many.iter().filter(|l| l.is_none()).count(), 10, "60..70 are unknown");
        assert_eq!(many[70 - 1 - 45].unwrap().pack, b, "a chunk in both packs comes from the live one");
        assert_eq!(many[70 - 1 - 5].unwrap().pack, a, "a chunk only a doomed pack holds comes from it");
    }
}
