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
pub use crate::repo::chunk_location::ChunkLocation;
use crate::repo::plans::{PlanFiles, PlanRecord, RecordedPlan};
use rocksdb::{ColumnFamilyDescriptor, Options, SliceTransform, WriteBatch, DB};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

/// What to do about an index that cannot be used.
const REBUILD_HINT: &str = "it is only a cache of the pack footers: run `gstore index rebuild`";

const CF_CHUNKS: &str = "chunks";
const CF_PACKS: &str = "packs";
const CF_DOOMED: &str = "doomed";
/// Resemblance sketches of stored chunks (crate::dedup::similar): `[feature index, super-feature
/// u64 LE]` -> chunk id, for finding the stored chunk a new one is most like.
const CF_SIMILAR: &str = "similar";
/// Where layout 3 recorded plans (now files: [`crate::repo::plans`]); dropped when a
/// writable open finds it.
const CF_OLD_PLANS: &str = "plans";
/// Stored copies damage records name ([`crate::format::damage`]): `[chunk id, pack id]` -> nothing.
const CF_DAMAGED: &str = "damaged";
/// Every column family but the default one.
const FAMILIES: [&str; 5] = [CF_CHUNKS, CF_PACKS, CF_DOOMED, CF_SIMILAR, CF_DAMAGED];
/// Key (in the default column family) holding the index layout version.
const FORMAT_KEY: &[u8] = b"format";
/// The layout written by this version: chunk entries keyed by chunk id + pack id. Layout 3
/// adds the damaged copies and drops the plans layout 2 recorded (they may name orphan deltas:
/// [`Index::pick`]).
const FORMAT: &[u8] = b"3";
/// Key (in the default column family) holding the packs the backend listed when the index was
/// last caught up with it, ids sorted and joined; removed when a pack is added or removed. A
/// handle that only added packs writes it back when it closes, with its packs among them
/// ([`Kept`]).
const CAUGHT_UP_KEY: &[u8] = b"caught-up";
/// Table files per thread opening them (at most 16 threads, at least one).
const TABLES_PER_OPENING_THREAD: usize = 16;

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
    /// False when opened read-only ([`Index::open_read_only`]): nothing may be written.
    writable: bool,
    /// The plans recorded beside it.
    plans: PlanFiles,
    /// What this handle writes back as the caught-up record when it closes.
    kept: Mutex<Kept>,
}

/// The caught-up record a writable handle writes back when it closes, so that the next
/// command finds the index current with a backend no one else changed. The record itself is
/// removed at the first pack added, so a process that stops before closing leaves none (the
/// next open catches up).
enum Kept {
    /// Not read since the handle opened or last recorded a catch-up.
    Unread,
    /// The packs the record named when this handle first added a pack, and those it added
    /// since (each stored before it was added): all the index holds.
    Keeping(HashSet<ObjectId>),
    /// Nothing to write back: there was no record, or a pack was removed or the index cleared.
    Dropped,
}

/// Writes what this handle added to the index into its table files before it closes, so
/// that the next open reads them rather than replaying the write-ahead log entry by entry
/// (after a push of 4 GiB of page images, 0.35 s of the next command's start). A failed flush
/// loses nothing: the log still holds the writes.
impl Drop for Index {
    fn drop(&mut self) {
        if self.writable {
            if let Kept::Keeping(packs) = self.kept.get_mut().expect("kept packs lock") {
                // A failed write leaves no record: the next open catches up.
                let _ = self.db.put(CAUGHT_UP_KEY, sorted_ids(packs));
            }
            let _ = self.flush();
        }
    }
}

/// Whether an open of the index writes its memtables (a writable open) or never does (a
/// read-only one).
#[derive(Clone, Copy)]
enum Memtables {
    Written,
    Unwritten,
}

fn similar_key(feature: usize, sf: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = feature as u8;
    k[1..].copy_from_slice(&sf.to_le_bytes());
    k
}

/// The ids of `packs`, sorted and joined.
fn sorted_ids(packs: &HashSet<ObjectId>) -> Vec<u8> {
    let mut ids: Vec<&ObjectId> = packs.iter().collect();
    ids.sort_unstable();
    ids.iter().flat_map(|id| id.0).collect()
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
        let mut opts = Index::db_options(path)?;
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let unusable = |e| Index::unusable(path, e);
        // Every column family that exists must be opened for writing: layout 3's plans too,
        // which go.
        let old_plans = DB::list_cf(&opts, path).is_ok_and(|cfs| cfs.iter().any(|c| c == CF_OLD_PLANS));
        let mut cfs = Index::families(Memtables::Written);
        if old_plans {
            cfs.push(ColumnFamilyDescriptor::new(CF_OLD_PLANS, Options::default()));
        }
        let mut db = DB::open_cf_descriptors(&opts, path, cfs).map_err(unusable)?;
        if old_plans {
            db.drop_cf(CF_OLD_PLANS).map_err(unusable)?;
        }
        let mut index = Index::with_db(path, db, true)?;
        let format = index.db.get(FORMAT_KEY).map_err(unusable)?;
        if format.as_deref() != Some(FORMAT) {
            index.clear()?;
            index.db.put(FORMAT_KEY, FORMAT).map_err(|e| index.ierr(e))?;
            index.empty_at_open = true;
        }
        Ok(index)
    }

    /// Opens the index at `path` read-only (the caller holds the store lock), for a command
    /// that only reads it: none of a writable open's own writes (a new manifest and options
    /// file, synced), nothing flushed when it closes. None when there is no index there, or
    /// one in another layout: open it writable then.
    pub fn open_read_only(path: &Path) -> Result<Option<Index>> {
        if !path.join("CURRENT").exists() {
            return Ok(None);
        }
        let opts = Index::db_options(path)?;
        // Read-only, the column families opened may be fewer than those that exist.
        let cfs = Index::families(Memtables::Unwritten);
        let db = DB::open_cf_descriptors_read_only(&opts, path, cfs, false).map_err(|e| Index::unusable(path, e))?;
        let index = Index::with_db(path, db, false)?;
        let format = index.db.get(FORMAT_KEY).map_err(|e| index.ierr(e))?;
        Ok((format.as_deref() == Some(FORMAT)).then_some(index))
    }

    /// The database options of both opens.
    fn db_options(path: &Path) -> Result<Options> {
        // A command writes at most a few MB of index: preallocating each new log for a whole
        // memtable (~70 MB by default) only costs time at every open (pages zeroed on tmpfs,
        // extents on ext4): a fifth of gc_sim's time went there. (No setter in the crate.)
        let mut opts = Options::default()
            .get_options_from_string("allow_fallocate=false")
            .map_err(|e| StoreError::Internal(format!("index options: {e}")))?;
        opts.set_keep_log_file_num(2);
        // Every open logs its options (1,500 lines): only warnings and errors are kept.
        opts.set_log_level(rocksdb::LogLevel::Warn);
        // Each column family's table files are opened by a pool of threads started for it:
        // for the few files of most indexes, starting the threads took longer than opening
        // the files (a 2 GiB store's 16 table files, on a 2-core machine: a writable open 17 ms
        // with RocksDB's 16 threads per family, 8 ms with one).
        let tables = std::fs::read_dir(path)
            .map(|d| d.filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".sst"))).count())
            .unwrap_or(0);
        opts.set_max_file_opening_threads((tables / TABLES_PER_OPENING_THREAD).clamp(1, 16) as i32);
        Ok(opts)
    }

    /// The column families' descriptors (their options), but the default one, for an open
    /// whose memtables are `written` or not.
    fn families(memtables: Memtables) -> Vec<ColumnFamilyDescriptor> {
        // A memtable's prefix filter (a tenth of its write buffer, ~6.7 MB for the chunks'
        // family) is allocated and zeroed at every open; a read-only open never writes its
        // memtables, so it goes without: that cut the first read-only open in a process to
        // a third (docs/BENCHMARKS.md, issue #62).
        let memtable_filter = match memtables {
            Memtables::Written => 0.1,
            Memtables::Unwritten => 0.0,
        };
        let mut chunk_opts = Options::default();
        chunk_opts.set_prefix_extractor(SliceTransform::create_fixed_prefix(32));
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(false);
        chunk_opts.set_block_based_table_factory(&table);
        chunk_opts.set_memtable_prefix_bloom_ratio(memtable_filter);
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
        similar_opts.set_memtable_prefix_bloom_ratio(memtable_filter);
        // A push adds 8 entries for each new chunk of a page image (~22 MB of memtable per
        // 4 GiB): smaller memtables are written out while the push runs, leaving less to
        // write when the handle closes.
        similar_opts.set_write_buffer_size(8 << 20);
        vec![
            ColumnFamilyDescriptor::new(CF_CHUNKS, chunk_opts),
            ColumnFamilyDescriptor::new(CF_PACKS, Options::default()),
            ColumnFamilyDescriptor::new(CF_DOOMED, Options::default()),
            ColumnFamilyDescriptor::new(CF_SIMILAR, similar_opts),
            ColumnFamilyDescriptor::new(CF_DAMAGED, Options::default()),
        ]
    }

    /// Whatever stops the index at `path` from opening: rebuilding it (which deletes it
    /// unopened) gets past it, so the error says so.
    fn unusable(path: &Path, e: rocksdb::Error) -> StoreError {
        StoreError::Index {
            path: path.into(),
            message: format!("cannot open the local index ({e}); {REBUILD_HINT} to build it anew"),
        }
    }

    /// The index on `db`, opened at `path`, with its doomed packs and damaged copies read.
    fn with_db(path: &Path, db: DB, writable: bool) -> Result<Index> {
        let unusable = |e| Index::unusable(path, e);
        let mut doomed = HashSet::new();
        for item in db.iterator_cf(db.cf_handle(CF_DOOMED).expect("opened"), rocksdb::IteratorMode::Start) {
            let (k, _) = item.map_err(unusable)?;
            doomed.extend(ObjectId::from_slice(&k));
        }
        let mut damaged = HashSet::new();
        for item in db.iterator_cf(db.cf_handle(CF_DAMAGED).expect("opened"), rocksdb::IteratorMode::Start) {
            let (k, _) = item.map_err(unusable)?;
            if let (Some(c), Some(p)) =
                (k.get(..32).and_then(ObjectId::from_slice), k.get(32..).and_then(ObjectId::from_slice))
            {
                damaged.insert((c, p));
            }
        }
        Ok(Index {
            db,
            path: path.into(),
            doomed: RwLock::new(doomed),
            damaged: RwLock::new(damaged),
            empty_at_open: false,
            writable,
            plans: PlanFiles::of(path),
            kept: Mutex::new(Kept::Unread),
        })
    }

    /// True when catching up with `packs` (the packs the backend lists now), `doomed` and
    /// `damaged` (as just read) would change nothing: the index was caught up with the same
    /// packs ([`Index::set_caught_up`]), none was added or removed since, and the same packs
    /// are tombstoned and copies damaged. A read-only open then serves.
    pub fn current_with(
        &self,
        packs: &HashSet<ObjectId>,
        doomed: &HashSet<ObjectId>,
        damaged: &HashSet<DamagedCopy>,
    ) -> Result<bool> {
        if *self.doomed.read().expect("doomed set lock") != *doomed
            || *self.damaged.read().expect("damaged set lock") != *damaged
        {
            return Ok(false);
        }
        let caught_up = self.db.get_pinned(CAUGHT_UP_KEY).map_err(|e| self.ierr(e))?;
        Ok(caught_up.is_some_and(|v| *v == *sorted_ids(packs)))
    }

    /// Records that the index was just caught up with the backend's listing `packs`.
    pub fn set_caught_up(&self, packs: &HashSet<ObjectId>) -> Result<()> {
        self.check_writable()?;
        *self.kept.lock().expect("kept packs lock") = Kept::Unread;
        self.db.put(CAUGHT_UP_KEY, sorted_ids(packs)).map_err(|e| self.ierr(e))
    }

    /// Fails unless the index was opened writable (a command that opened it read-only wrote).
    fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(StoreError::Internal(format!("the index at {} was opened read-only", self.path.display())))
        }
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

    /// Records a pack (already stored) and all its chunks in one atomic batch.
    pub fn add_pack(&self, pack: ObjectId, size: u64, entries: &[PackEntry]) -> Result<()> {
        self.check_writable()?;
        {
            let mut kept = self.kept.lock().expect("kept packs lock");
            if let Kept::Unread = *kept {
                // The record is there only while no pack was added or removed since it was
                // written: the packs it names, and those added from here, are then all the
                // index holds.
                *kept = match self.db.get_pinned(CAUGHT_UP_KEY).map_err(|e| self.ierr(e))? {
                    Some(ids) => Kept::Keeping(ids.chunks_exact(32).filter_map(ObjectId::from_slice).collect()),
                    None => Kept::Dropped,
                };
            }
        }
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
        batch.delete(CAUGHT_UP_KEY);
        self.db.write(batch).map_err(|e| self.ierr(e))?;
        if let Kept::Keeping(packs) = &mut *self.kept.lock().expect("kept packs lock") {
            packs.insert(pack);
        }
        Ok(())
    }

    /// Records the resemblance sketches of newly stored chunks (a later one with the same
    /// super-feature replaces an earlier one).
    pub fn add_sketches(&self, sketches: &[(ObjectId, Sketch)]) -> Result<()> {
        self.check_writable()?;
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
        self.check_writable()?;
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
        batch.delete(CAUGHT_UP_KEY);
        *self.kept.lock().expect("kept packs lock") = Kept::Dropped;
        drop(v);
        // Recorded plans may name the pack: they go first (the next plan of each image looks
        // its chunks up again).
        self.plans.forget_all()?;
        self.db.write(batch).map_err(|e| self.ierr(e))?;
        self.doomed.write().expect("doomed set lock").remove(pack);
        Ok(())
    }

    /// Replaces the set of packs gc has tombstoned (as just listed).
    pub fn set_doomed(&self, packs: &HashSet<ObjectId>) -> Result<()> {
        self.check_writable()?;
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
        self.check_writable()?;
        self.plans.forget_all()?;
        let mut batch = WriteBatch::default();
        for (c, p) in current.difference(copies) {
            batch.delete_cf(self.cf(CF_DAMAGED), chunk_key(c, p));
        }
        for (c, p) in copies.difference(&current) {
            batch.put_cf(self.cf(CF_DAMAGED), chunk_key(c, p), []);
        }
        self.db.write(batch).map_err(|e| self.ierr(e))?;
        *current = copies.clone();
        Ok(())
    }

    /// Records where every chunk of an image is (`locations`, in the planner's order), under
    /// `key`, which names the image's chunk list ([`PlanRecord`] builds the value).
    pub fn put_plan(&self, key: &ObjectId, record: PlanRecord) -> Result<()> {
        self.plans.put(key, record)
    }

    /// The locations recorded under `key` by [`Index::put_plan`], if there are and they still
    /// hold: every pack they name is indexed, not tombstoned and holds no copy a damage
    /// record names (a pack is written once and never changed while it exists:
    /// docs/FORMAT.md; a plan made before a healing push names the damaged copy, the index
    /// now a good one). A record whose framing is damaged counts as none.
    pub fn plan(&self, key: &ObjectId) -> Result<Option<RecordedPlan>> {
        let Some(plan) = self.plans.get(key) else { return Ok(None) };
        {
            let doomed = self.doomed.read().expect("doomed set lock");
            let damaged = self.damaged.read().expect("damaged set lock");
            if plan.packs().iter().any(|p| doomed.contains(p) || damaged.iter().any(|(_, d)| d == p)) {
                return Ok(None);
            }
        }
        // While the index is as it was caught up, its packs are those recorded then: one read
        // (each pack's entry holds the ids of all its chunks, megabytes for a large image).
        let caught_up = self.db.get_pinned(CAUGHT_UP_KEY).map_err(|e| self.ierr(e))?;
        let caught_up: Option<Vec<&[u8]>> = caught_up.as_ref().map(|ids| ids.chunks_exact(32).collect());
        for p in plan.packs() {
            let indexed = match &caught_up {
                Some(ids) => ids.binary_search(&p.0.as_slice()).is_ok(),
                None => self.db.get_pinned_cf(self.cf(CF_PACKS), p.0).map_err(|e| self.ierr(e))?.is_some(),
            };
            if !indexed {
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
        self.check_writable()?;
        *self.kept.lock().expect("kept packs lock") = Kept::Dropped;
        self.db.delete(CAUGHT_UP_KEY).map_err(|e| self.ierr(e))?;
        self.plans.forget_all()?;
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
mod tests;
