//! A restore plan: every distinct chunk an image needs, fetched once even when it repeats,
//! grouped into coalesced pack range reads, ordered by first use in the manifest (or by an
//! explicit access order when the image carries one).

use gstore_store::format::manifest::Manifest;
use gstore_store::repo::index::ChunkLocation;
use gstore_store::repo::plans::{PlanRecord, RecordedPlan};
use gstore_store::ObjectKind;
use gstore_store::{IndexedStore, ObjectId, Result, StoreError};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// Two chunks of one pack are read together when at most this many bytes lie between them.
pub const MAX_GAP: u64 = 64 * 1024;

/// Where one restored copy of a chunk goes: (entry index in the manifest, byte offset).
pub type Target = (usize, u64);

/// Every place one chunk goes: most chunks go to one place, held inline.
pub type Targets = SmallVec<[Target; 1]>;

/// One distinct chunk and every place it is written to.
#[derive(Debug, Clone)]
pub struct PlannedChunk {
    /// Chunk id.
    pub id: ObjectId,
    /// Where it is stored.
    pub loc: ChunkLocation,
    /// Where it goes.
    pub targets: Targets,
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

impl RangeRead {
    /// Plain bytes this read yields (each chunk once).
    pub fn plain_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.loc.plain_len as u64).sum()
    }
}

/// A run of zero bytes in an entry (zero chunks are never fetched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroRange {
    /// Entry index.
    pub entry: usize,
    /// Offset in the entry.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The whole plan.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Range reads, in order of first use.
    pub reads: Vec<RangeRead>,
    /// Zero runs, for sinks whose memory does not start zeroed.
    pub zeros: Vec<ZeroRange>,
}

impl Plan {
    /// Plain bytes that will be written (repeats counted each time; zero chunks excluded).
    pub fn write_bytes(&self) -> u64 {
        self.reads.iter().flat_map(|r| &r.chunks).map(|c| c.loc.plain_len as u64 * c.targets.len() as u64).sum()
    }

    /// Bytes that will be fetched from packs.
    pub fn fetch_bytes(&self) -> u64 {
        self.reads.iter().map(|r| r.end - r.start).sum()
    }

    /// Plain bytes of the distinct chunks to fetch.
    pub fn plain_bytes(&self) -> u64 {
        self.reads.iter().map(RangeRead::plain_bytes).sum()
    }

    /// Number of distinct chunks to fetch.
    pub fn chunk_count(&self) -> usize {
        self.reads.iter().map(|r| r.chunks.len()).sum()
    }

    /// Drops the chunks `present` says are already in place, shrinking or dropping reads.
    pub fn retain_missing(&mut self, present: impl Fn(&PlannedChunk) -> bool + Sync) {
        use rayon::prelude::*;
        self.reads.par_iter_mut().for_each(|r| {
            r.chunks.retain(|c| !present(c));
            if let (Some(first), Some(last)) = (r.chunks.first(), r.chunks.last()) {
                r.start = first.loc.offset;
                r.end = last.loc.range().end;
            }
        });
        self.reads.retain(|r| !r.chunks.is_empty());
    }
}

/// Entry indices in restore order: a recorded access order first, the rest in manifest order.
fn entry_order(m: &Manifest) -> Vec<usize> {
    let mut rank: Vec<usize> = (0..m.entries.len()).map(|i| m.entries.len() + i).collect();
    if let Some(order) = &m.meta.access_order {
        let by_path: std::collections::HashMap<&str, usize> =
            m.entries.iter().enumerate().map(|(i, e)| (e.path.as_str(), i)).collect();
        for (r, p) in order.iter().enumerate() {
            if let Some(&i) = by_path.get(p.as_str()) {
                rank[i] = rank[i].min(r);
            }
        }
    }
    let mut idx: Vec<usize> = (0..m.entries.len()).collect();
    idx.sort_by_key(|&i| rank[i]);
    idx
}

/// Where each chunk of `chunks` (id and plain length, parts of the image file `path`) is
/// stored, in their order: an error that names the file when the index knows no pack holding
/// one, or disagrees on its length. Where the same chunks were located before on this machine
/// and the packs found are all still there, their locations come from that record (a lazy
/// restore's write-out waits for them); otherwise they are looked up ([`look_up`]) and
/// recorded for next time, under a key that names the chunk list.
pub fn locate_chunks(store: &IndexedStore, chunks: &[(ObjectId, u32)], path: &str) -> Result<Vec<ChunkLocation>> {
    if chunks.is_empty() {
        return Ok(Vec::new());
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"gstore file plan 1");
    for (id, len) in chunks {
        hasher.update(&id.0);
        hasher.update(&len.to_le_bytes());
    }
    let key = ObjectId(*hasher.finalize().as_bytes());
    let ids: Vec<ObjectId> = chunks.iter().map(|(id, _)| *id).collect();
    let mut source = Locations::open(store, &key, chunks.len())?;
    let located: Vec<ChunkLocation> = source
        .next(store, &ids)?
        .into_iter()
        .zip(chunks)
        .map(|(found, (id, len))| check_location(found, id, *len, path))
        .collect::<Result<_>>()?;
    source.record(&located);
    source.finish(store, &key);
    Ok(located)
}

/// Where each of `ids` is stored, per the index, in their order: groups of [`LOOKUP_GROUP`]
/// looked up in parallel, an index iterator each.
fn look_up(store: &IndexedStore, ids: &[ObjectId]) -> Result<Vec<Option<ChunkLocation>>> {
    use rayon::prelude::*;
    let found: Vec<Vec<Option<ChunkLocation>>> =
        ids.par_chunks(LOOKUP_GROUP).map(|group| store.locate_many(group)).collect::<Result<_>>()?;
    Ok(found.into_iter().flatten().collect())
}

/// The location the index gave for chunk `id` of `len` bytes (used by file `path`): an error
/// that names the file when there is none, or when it disagrees on the chunk's length.
fn check_location(found: Option<ChunkLocation>, id: &ObjectId, len: u32, path: &str) -> Result<ChunkLocation> {
    let loc = found.ok_or_else(|| StoreError::NotFound {
        what: ObjectKind::Chunk,
        key: format!(
            "{id} of {path:?} (in no pack of the store: a pack is missing or damaged; gstore verify names the images it breaks)"
        ),
    })?;
    if loc.plain_len != len {
        return Err(StoreError::corrupt(
            ObjectKind::Chunk,
            id.to_hex(),
            format!("index says {} bytes, manifest says {len}", loc.plain_len),
        ));
    }
    Ok(loc)
}

/// Where a plan's locations come from: the image's recorded plan, or index lookups (recorded
/// as they are made, for the next plan).
enum Locations {
    Recorded(RecordedPlan),
    LookedUp(PlanRecord),
}

impl Locations {
    /// The plan recorded under `key`, if it holds the `total` locations asked for and its
    /// packs are all still there; else lookups, to be recorded.
    fn open(store: &IndexedStore, key: &ObjectId, total: usize) -> Result<Locations> {
        Ok(match store.recorded_plan(key)?.filter(|r| r.len() == total) {
            Some(recorded) => Locations::Recorded(recorded),
            None => Locations::LookedUp(PlanRecord::default()),
        })
    }

    /// Where the next chunks, `ids`, are stored, in their order (a location whose record does
    /// not decode is looked up).
    fn next(&mut self, store: &IndexedStore, ids: &[ObjectId]) -> Result<Vec<Option<ChunkLocation>>> {
        match self {
            Locations::Recorded(r) => ids
                .iter()
                .map(|id| match r.next().flatten() {
                    Some(loc) => Ok(Some(loc)),
                    None => store.locate(id),
                })
                .collect(),
            Locations::LookedUp(_) => look_up(store, ids),
        }
    }

    /// Adds the next locations, checked, to the record being made (lookups only).
    fn record<'a>(&mut self, located: impl IntoIterator<Item = &'a ChunkLocation>) {
        if let Locations::LookedUp(record) = self {
            located.into_iter().for_each(|loc| record.push(loc));
        }
    }

    /// Records the lookups under `key`, for the next plan of the same chunks. A cache, like
    /// the range cache: a restore whose plan cannot be recorded (a full disk under the index)
    /// goes on, and the next one looks its chunks up again.
    fn finish(self, store: &IndexedStore, key: &ObjectId) {
        if let Locations::LookedUp(record) = self {
            let _ = store.record_plan(key, record);
        }
    }
}

/// Distinct chunks in the first planning batch (later batches grow fourfold, up to the
/// caller's batch size).
const FIRST_BATCH: usize = 512;

/// Shards of chunk ids [`Needs::of`] searches in parallel for later uses of a chunk.
const NEED_SHARDS: usize = 16;

/// Bytes of chunk ids and lengths hashed at a time for a plan's key.
const KEY_BLOCK: usize = 64 << 10;

/// The [`NEED_SHARDS`] shard of chunk `id`.
fn shard_of(id: &ObjectId) -> usize {
    id.0[0] as usize % NEED_SHARDS
}

/// Distinct chunks one index iterator looks up while planning.
const LOOKUP_GROUP: usize = 512;

/// Two chunks share a range read only while it holds at most this many chunks, which bounds
/// the per-read bookkeeping a sink allocates up front (e.g. GPU decode scratch per slot).
pub const MAX_CHUNKS_PER_READ: usize = 512;

/// A range read holds at most this many delta chunks: their bases (one or two chunks each)
/// are read side by side before the read is decoded, and held meanwhile.
pub const MAX_DELTAS_PER_READ: usize = 64;

/// A distinct chunk an image needs, before the index is asked where it is.
struct Needed {
    id: ObjectId,
    /// The entry of its first use.
    entry: usize,
    len: u32,
    targets: Targets,
}

/// A use of a stored chunk: its place in the manifest's chunk table, and where it goes.
#[derive(Clone, Copy)]
struct Use {
    chunk: usize,
    entry: usize,
    offset: u64,
}

/// What an image needs, from its manifest alone: its distinct chunks in order of first use,
/// with every place each goes, and its zero runs. Planning it ([`Needs::plan_batches`]) asks
/// the index where each chunk is stored.
pub struct Needs {
    /// Every use of a stored chunk, in order (entries in access order, each from its start).
    uses: Vec<Use>,
    /// Whether each use is a later use of a chunk used before.
    repeated: Vec<bool>,
    /// The later uses of each first use that has some, in order.
    more: FxHashMap<usize, Vec<usize>>,
    /// Distinct chunks (first uses).
    distinct: usize,
    /// The image's zero runs.
    pub zeros: Vec<ZeroRange>,
    /// The name under which its plan is recorded: a hash of every use's chunk id and length,
    /// in order (worked out with the needs, off the planner's way).
    key: ObjectId,
}

impl Needs {
    /// Reads `m`: no index lookups, no I/O. Later uses of a chunk are found in parallel, a
    /// shard of chunk ids per thread (a large model's manifest has hundreds of thousands),
    /// beside the plan's key; the distinct chunks are listed as they are planned.
    pub fn of(m: &Manifest) -> Needs {
        use rayon::prelude::*;
        use std::collections::hash_map::Entry;
        let files: Vec<_> = m.files().collect();
        let starts: Vec<usize> = files
            .iter()
            .scan(0, |at, (_, list)| {
                let start = *at;
                *at += list.len();
                Some(start)
            })
            .collect();
        let mut uses: Vec<Use> = Vec::with_capacity(m.chunks.len());
        let mut zeros: Vec<ZeroRange> = Vec::new();
        for i in entry_order(m) {
            let mut off = 0u64;
            for (j, c) in files[i].1.iter().enumerate() {
                if !c.zero {
                    uses.push(Use { chunk: starts[i] + j, entry: i, offset: off });
                } else if let Some(z) = zeros.last_mut().filter(|z| z.entry == i && z.offset + z.len == off) {
                    z.len += c.len as u64;
                } else {
                    zeros.push(ZeroRange { entry: i, offset: off, len: c.len as u64 });
                }
                off += c.len as u64;
            }
        }
        let chunk = |u: &Use| &m.chunks[u.chunk];
        // (first use, later use) of every chunk used more than once. Chunk ids are uniformly
        // random: their first byte shards them, and a fast hash of them does.
        let find_later = || -> Vec<Vec<(usize, usize)>> {
            (0..NEED_SHARDS)
                .into_par_iter()
                .map(|shard| {
                    let mut first: FxHashMap<&ObjectId, usize> =
                        FxHashMap::with_capacity_and_hasher(uses.len() / NEED_SHARDS * 9 / 8, Default::default());
                    let mut later = Vec::new();
                    for (k, u) in uses.iter().enumerate() {
                        let id = &chunk(u).id;
                        if shard_of(id) != shard {
                            continue;
                        }
                        match first.entry(id) {
                            Entry::Occupied(f) => later.push((*f.get(), k)),
                            Entry::Vacant(v) => {
                                v.insert(k);
                            }
                        }
                    }
                    later
                })
                .collect()
        };
        // The key, from a buffer hashed a block at a time (the same hash as of all the bytes
        // at once).
        let key = || {
            let mut hasher = blake3::Hasher::new();
            hasher.update(b"gstore plan 2");
            let mut block = Vec::with_capacity(KEY_BLOCK + 36);
            for u in &uses {
                block.extend_from_slice(&chunk(u).id.0);
                block.extend_from_slice(&chunk(u).len.to_le_bytes());
                if block.len() >= KEY_BLOCK {
                    hasher.update(&block);
                    block.clear();
                }
            }
            hasher.update(&block);
            ObjectId(*hasher.finalize().as_bytes())
        };
        let (later, key) = rayon::join(find_later, key);
        let mut repeated = vec![false; uses.len()];
        let mut more: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
        for (f, k) in later.into_iter().flatten() {
            repeated[k] = true;
            more.entry(f).or_default().push(k);
        }
        let distinct = repeated.iter().filter(|r| !**r).count();
        Needs { uses, repeated, more, distinct, zeros, key }
    }

    /// The name under which the image's plan is recorded in the index.
    pub fn key(&self) -> ObjectId {
        self.key
    }

    /// The distinct chunks of `m` (the manifest these needs were worked out from), in order
    /// of first use, each with every place it goes.
    fn into_needed(self, m: &Manifest) -> impl Iterator<Item = Needed> + '_ {
        let Needs { uses, repeated, mut more, .. } = self;
        let place = |u: &Use| (u.entry, u.offset);
        (0..uses.len()).filter(move |&k| !repeated[k]).map(move |k| {
            let u = &uses[k];
            let c = &m.chunks[u.chunk];
            let mut targets: Targets = [place(u)].into();
            if let Some(later) = more.remove(&k) {
                targets.extend(later.into_iter().map(|j| place(&uses[j])));
            }
            Needed { id: c.id, entry: u.entry, len: c.len, targets }
        })
    }

    /// Plans the reads in batches of `batch` distinct chunks (in order of first use), handing
    /// each batch's reads (at most `max_read` bytes stored and plain, each) to `emit` as soon
    /// as they are planned, so a restore can start on them while later batches are looked up.
    /// Reads never span two batches. Stops at the first error, `emit`'s included.
    ///
    /// Where the image was planned before on this machine and the packs it found are all
    /// still there, their locations are read from that record in one go; otherwise every
    /// chunk is looked up in the index, and the result recorded for next time.
    pub fn plan_batches(
        self,
        store: &IndexedStore,
        m: &Manifest,
        max_read: u64,
        batch: usize,
        mut emit: impl FnMut(Vec<RangeRead>) -> Result<()>,
    ) -> Result<()> {
        let paths: Vec<&str> = m.entries.iter().map(|e| e.path.as_str()).collect();
        let key = self.key;
        let total = self.distinct;
        let mut source = Locations::open(store, &key, total)?;
        let mut needed = self.into_needed(m);
        // The first batches are small, so that the first reads go out early; later ones grow
        // to `batch`.
        let mut size = FIRST_BATCH.min(batch).max(1);
        let mut first = 0;
        while first < total {
            let chunks: Vec<Needed> = needed.by_ref().take(size).collect();
            size = size.saturating_mul(4).min(batch);
            let found = source.next(store, &chunks.iter().map(|n| n.id).collect::<Vec<_>>())?;
            let located: Vec<(usize, PlannedChunk)> = chunks
                .into_iter()
                .zip(found)
                .enumerate()
                .map(|(k, (n, found))| {
                    let loc = check_location(found, &n.id, n.len, paths[n.entry])?;
                    Ok((first + k, PlannedChunk { id: n.id, loc, targets: n.targets }))
                })
                .collect::<Result<_>>()?;
            source.record(located.iter().map(|(_, p)| &p.loc));
            first += located.len();
            emit(coalesce(located, max_read))?;
        }
        source.finish(store, &key);
        Ok(())
    }
}

/// Groups located chunks (each with its rank of first use) into range reads of at most
/// `max_read` bytes, [`MAX_CHUNKS_PER_READ`] chunks and [`MAX_DELTAS_PER_READ`] delta chunks,
/// ordered by first use.
fn coalesce(mut chunks: Vec<(usize, PlannedChunk)>, max_read: u64) -> Vec<RangeRead> {
    /// A read being built: its rank of first use, plain bytes and delta chunks so far.
    struct Building {
        first: usize,
        read: RangeRead,
        plain: u64,
        deltas: usize,
    }
    chunks.sort_by_key(|(_, p)| (p.loc.pack, p.loc.offset));
    let mut reads: Vec<Building> = Vec::new();
    for (first, p) in chunks {
        let r = p.loc.range();
        let plain = p.loc.plain_len as u64;
        let delta = usize::from(p.loc.bases.is_some());
        match reads.last_mut() {
            Some(cur)
                if cur.read.pack == p.loc.pack
                    && r.start >= cur.read.end
                    && r.start - cur.read.end <= MAX_GAP
                    && r.end - cur.read.start <= max_read
                    && cur.plain + plain <= max_read
                    && cur.read.chunks.len() < MAX_CHUNKS_PER_READ
                    && cur.deltas + delta <= MAX_DELTAS_PER_READ =>
            {
                cur.read.end = r.end;
                cur.first = cur.first.min(first);
                cur.plain += plain;
                cur.deltas += delta;
                cur.read.chunks.push(p);
            }
            _ => reads.push(Building {
                first,
                read: RangeRead { pack: p.loc.pack, start: r.start, end: r.end, chunks: vec![p] },
                plain,
                deltas: delta,
            }),
        }
    }
    reads.sort_by_key(|b| b.first);
    reads.into_iter().map(|b| b.read).collect()
}

/// Plans the restore of every file of `m`, with range reads of at most `max_read` bytes
/// (stored and plain alike), which bounds the memory one read needs.
pub fn plan(store: &IndexedStore, m: &Manifest, max_read: u64) -> Result<Plan> {
    let needs = Needs::of(m);
    let zeros = needs.zeros.clone();
    let mut reads = Vec::new();
    needs.plan_batches(store, m, max_read, usize::MAX, |batch| {
        reads.extend(batch);
        Ok(())
    })?;
    Ok(Plan { reads, zeros })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gstore_store::codec::{Codec, DeltaBases};

    /// Chunk `i` of 1000 bytes at offset `i * 1000` of one pack; a delta when `delta`.
    fn chunk(i: u64, delta: bool) -> (usize, PlannedChunk) {
        let id = ObjectId::of(&i.to_le_bytes());
        let loc = ChunkLocation {
            pack: ObjectId::of(b"pack"),
            offset: i * 1000,
            stored_len: 1000,
            plain_len: 4000,
            codec: if delta { Codec::Delta } else { Codec::Zstd },
            bases: delta.then(|| DeltaBases::one(ObjectId::of(b"base"))),
        };
        (i as usize, PlannedChunk { id, loc, targets: [(0, i * 4000)].into() })
    }

    #[test]
    fn a_read_holds_at_most_so_many_deltas_and_plain_chunks_still_share_reads() {
        let chunks: Vec<_> = (0..300).map(|i| chunk(i, (100..250).contains(&i))).collect();
        let reads = coalesce(chunks, 16 << 20);
        let deltas: Vec<usize> =
            reads.iter().map(|r| r.chunks.iter().filter(|c| c.loc.bases.is_some()).count()).collect();
        assert!(deltas.iter().all(|&d| d <= MAX_DELTAS_PER_READ), "deltas per read: {deltas:?}");
        assert_eq!(deltas.iter().sum::<usize>(), 150);
        // 150 deltas need three reads; the plain chunks around them ride along.
        assert_eq!(reads.len(), 3, "deltas per read: {deltas:?}");
        let mut offsets: Vec<u64> = reads.iter().flat_map(|r| r.chunks.iter().map(|c| c.loc.offset)).collect();
        offsets.sort_unstable();
        assert_eq!(offsets, (0..300).map(|i| i * 1000).collect::<Vec<_>>());
        assert_eq!(coalesce((0..300).map(|i| chunk(i, false)).collect(), 16 << 20).len(), 1);
    }

    /// Every distinct chunk once, in order of first use (entries in access order), with every
    /// place it goes in order; zero runs merged within an entry; the same key for the same
    /// chunks used whichever image names them.
    #[test]
    fn needs_list_each_chunk_once_with_all_its_places() {
        use gstore_store::format::manifest::{ChunkRef, Entry, EntryKind};
        let chunk = |n: u64, len: u32| ChunkRef { id: ObjectId::of(&n.to_le_bytes()), len, zero: false };
        let zero = |len: u32| ChunkRef { id: ObjectId::of(&[0u8; 8]), len, zero: true };
        let entry = |path: &str, list: &[ChunkRef]| Entry {
            path: path.into(),
            kind: EntryKind::File,
            mode: 0o644,
            size: list.iter().map(|c| c.len as u64).sum(),
            target: None,
            chunks: list.len() as u64,
        };
        // 600 distinct chunks (every shard), some used again in the same and the other file.
        let a: Vec<ChunkRef> = (0..300).map(|n| chunk(n, 10)).chain([zero(5), zero(7), chunk(3, 10)]).collect();
        let b: Vec<ChunkRef> =
            (300..600).map(|n| chunk(n, 10)).chain([chunk(3, 10), zero(4), chunk(599, 10)]).collect();
        let m = Manifest {
            created_unix: 0,
            meta: Default::default(),
            entries: vec![entry("a", &a), entry("b", &b)],
            chunks: a.iter().chain(&b).cloned().collect(),
        };
        let key = Needs::of(&m).key;
        let needed: Vec<Needed> = Needs::of(&m).into_needed(&m).collect();
        let ids: Vec<ObjectId> = needed.iter().map(|n| n.id).collect();
        assert_eq!(ids, (0..600).map(|n| chunk(n, 10).id).collect::<Vec<_>>());
        let places = |n: usize| needed[n].targets.to_vec();
        assert_eq!(places(3), vec![(0, 30), (0, 3012), (1, 3000)]);
        assert_eq!(places(599), vec![(1, 2990), (1, 3014)]);
        assert_eq!(places(7), vec![(0, 70)]);
        assert_eq!(needed[400].entry, 1);
        assert_eq!(
            Needs::of(&m).zeros.iter().map(|z| (z.entry, z.offset, z.len)).collect::<Vec<_>>(),
            vec![(0, 3000, 12), (1, 3010, 4)]
        );
        // The key names the chunks used in order: other metadata keeps it, fewer chunks
        // change it, and it is the hash of them all at once.
        let mut other = m.clone();
        other.meta.other.insert("x".into(), 1.into());
        assert_eq!(Needs::of(&other).key, key);
        let fewer = Manifest { entries: vec![entry("a", &a)], chunks: a.clone(), ..m.clone() };
        assert_ne!(Needs::of(&fewer).key, key);
        let mut bytes = b"gstore plan 2".to_vec();
        for c in a.iter().chain(&b).filter(|c| !c.zero) {
            bytes.extend_from_slice(&c.id.0);
            bytes.extend_from_slice(&c.len.to_le_bytes());
        }
        assert_eq!(key, ObjectId(*blake3::hash(&bytes).as_bytes()));
    }
}
