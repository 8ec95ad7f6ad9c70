//! The plain bytes of delta bases a store handle read lately: a restore of an image whose
//! chunks are deltas against the same few bases reads each base once.

use crate::codec::{decode_base, BaseSource, DeltaBases, KnownBases};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::repo::index::ChunkLocation;
use crate::repo::indexed::IndexedStore;
use crate::ObjectKind;
use rayon::prelude::*;

impl BaseSource for IndexedStore {
    fn base_plain(&self, id: &ObjectId) -> gstore_format::Result<std::sync::Arc<Vec<u8>>> {
        if let Some(hit) = self.bases.get(id) {
            return Ok(hit);
        }
        let loc = self.locate(id)?;
        Ok(self.read_base(id, loc)?)
    }
}

/// Where a reader's delta chunks find their bases: the store, whose index locates the ones
/// not cached ([`IndexedStore`]), or a set read ahead of time ([`KnownBases`]).
pub trait BaseReader: BaseSource {
    /// Makes the bases of a batch of delta chunks ready before the batch is decoded; they stay
    /// ready while the result is held ([`IndexedStore::prefetch_bases`]).
    fn prefetch(&self, bases: &mut dyn Iterator<Item = DeltaBases>) -> Result<HeldBases>;
}

impl BaseReader for IndexedStore {
    fn prefetch(&self, bases: &mut dyn Iterator<Item = DeltaBases>) -> Result<HeldBases> {
        self.prefetch_bases(bases)
    }
}

impl BaseReader for KnownBases {
    fn prefetch(&self, _: &mut dyn Iterator<Item = DeltaBases>) -> Result<HeldBases> {
        Ok(HeldBases { _held: Vec::new() })
    }
}

/// Delta bases read at once by [`IndexedStore::prefetch_bases`]: each read waits on the disk or the
/// network, not the CPU, so more are in flight than there are cores.
const BASE_READS_IN_FLIGHT: usize = 16;

impl IndexedStore {
    /// Reads the delta bases among `bases` that this handle's base cache does not hold, side
    /// by side, into the cache, and returns all of them held: the cache keeps them while the
    /// caller holds the result. A reader about to decode a batch of delta chunks calls it with
    /// their bases first and holds the result while it decodes, rather than waiting for one
    /// base read after another.
    pub fn prefetch_bases(&self, bases: impl IntoIterator<Item = DeltaBases>) -> Result<HeldBases> {
        let mut wanted: Vec<ObjectId> = bases.into_iter().flat_map(|b| b.iter()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut held = Vec::with_capacity(wanted.len());
        let mut missing = Vec::new();
        for id in wanted {
            match self.bases.get(&id) {
                Some(plain) => held.push(plain),
                None => missing.push(id),
            }
        }
        if missing.len() < 2 {
            return Ok(HeldBases { _held: held });
        }
        let locs = self.locate_many(&missing)?;
        let mut found = Vec::with_capacity(missing.len());
        for (id, loc) in missing.into_iter().zip(locs) {
            found.push((id, loc.ok_or_else(|| base_not_found(&id))?));
        }
        // In pack order, neighbours read together: the bases of consecutive deltas are
        // often consecutive chunks of the image before, and a disk reads them in one go.
        found.sort_unstable_by_key(|(_, loc)| (loc.pack, loc.offset));
        // Through a chunk cache, each base is its own range.
        let local = self.cache.is_none();
        let mut runs: Vec<&[(ObjectId, ChunkLocation)]> = Vec::new();
        let mut start = 0;
        for i in 1..=found.len() {
            let joins = found.get(i).is_some_and(|(_, loc)| {
                let (_, first) = &found[start];
                let (_, prev) = &found[i - 1];
                local
                    && loc.pack == prev.pack
                    && loc.offset <= prev.range().end + BASE_READ_GAP
                    && loc.range().end - first.offset <= BASE_READ_SPAN
            });
            if !joins {
                runs.push(&found[start..i]);
                start = i;
            }
        }
        let read: Vec<Vec<std::sync::Arc<Vec<u8>>>> =
            base_readers()?.install(|| runs.par_iter().map(|run| self.read_bases(run)).collect::<Result<_>>())?;
        held.extend(read.into_iter().flatten());
        Ok(HeldBases { _held: held })
    }

    /// Reads the delta bases among `bases` (those of the delta chunks a reader will decode)
    /// into a [`KnownBases`], each checked against its id.
    pub fn known_bases(&self, bases: impl IntoIterator<Item = DeltaBases>) -> Result<KnownBases> {
        let bases: Vec<DeltaBases> = bases.into_iter().collect();
        let _held = self.prefetch_bases(bases.iter().copied())?;
        let mut known = KnownBases::default();
        for id in bases.iter().flat_map(|b| b.iter()) {
            if !known.contains(&id) {
                known.insert(id, self.base_plain(&id)?);
            }
        }
        Ok(known)
    }

    /// Puts delta bases a caller read from elsewhere (a restore's seed) into the base cache,
    /// each checked against its id first (one that does not match is dropped, and read from
    /// the store when a delta needs it). They stay cached while the result is held.
    pub fn offer_bases(&self, bases: impl IntoIterator<Item = (ObjectId, Vec<u8>)>) -> HeldBases {
        let held = bases
            .into_iter()
            .filter(|(id, plain)| self.chunk_ids.id(plain) == *id)
            .map(|(id, plain)| self.keep_base(&id, plain))
            .collect();
        HeldBases { _held: held }
    }

    /// Reads, checks and caches base `id`, found at `loc`.
    fn read_base(&self, id: &ObjectId, loc: Option<ChunkLocation>) -> Result<std::sync::Arc<Vec<u8>>> {
        let loc = loc.ok_or_else(|| base_not_found(id))?;
        let mut read = self.read_bases(&[(*id, loc)])?;
        read.pop().ok_or_else(|| base_not_found(id))
    }

    /// Reads, checks and caches bases that lie in one pack in offset order: through the
    /// chunk cache one by one where the store has one, else with one read of the local pack
    /// — a `pread`, cheaper than mapping it, and many threads mapping and unmapping at once
    /// would wait on each other.
    fn read_bases(&self, run: &[(ObjectId, ChunkLocation)]) -> Result<Vec<std::sync::Arc<Vec<u8>>>> {
        let (Some((_, first)), Some((_, last))) = (run.first(), run.last()) else { return Ok(Vec::new()) };
        if self.cache.is_some() {
            return run
                .iter()
                .map(|(id, loc)| {
                    let plain = self.read_checked_range(&loc.pack, loc.range(), |s| self.decode_base(id, loc, s))?;
                    Ok(self.keep_base(id, plain))
                })
                .collect();
        }
        let span = first.offset..last.range().end;
        let mut stored = vec![0; (span.end - span.start) as usize];
        self.read_pack_range_into(&first.pack, span.clone(), &mut stored)?;
        run.iter()
            .map(|(id, loc)| {
                let at = (loc.offset - span.start) as usize..(loc.range().end - span.start) as usize;
                Ok(self.keep_base(id, self.decode_base(id, loc, &stored[at])?))
            })
            .collect()
    }

    /// Decodes and checks base `id` (at `loc`) from its stored bytes.
    fn decode_base(&self, id: &ObjectId, loc: &ChunkLocation, stored: &[u8]) -> Result<Vec<u8>> {
        Ok(decode_base(loc.codec, stored, loc.plain_len as usize, id, self.config.chunk_max, self.chunk_ids)?)
    }

    /// Puts base `id` into the base cache.
    fn keep_base(&self, id: &ObjectId, plain: Vec<u8>) -> std::sync::Arc<Vec<u8>> {
        let plain = std::sync::Arc::new(plain);
        self.bases.put(*id, plain.clone());
        plain
    }
}

/// Delta bases a reader fetched with [`IndexedStore::prefetch_bases`]: while it holds them, the
/// store's base cache keeps them, so that decoding its deltas finds every base there.
#[must_use = "the bases stay cached only while this is held"]
pub struct HeldBases {
    _held: Vec<std::sync::Arc<Vec<u8>>>,
}

/// Bases this close to each other in a local pack are read together (the bytes between
/// are read and dropped).
const BASE_READ_GAP: u64 = 64 << 10;
/// The most bytes read at once for bases.
const BASE_READ_SPAN: u64 = 4 << 20;

/// The error for a delta base the index does not know.
fn base_not_found(id: &ObjectId) -> StoreError {
    StoreError::NotFound { what: ObjectKind::DeltaBase, key: id.to_hex() }
}

/// The threads [`IndexedStore::prefetch_bases`] reads on, started once.
fn base_readers() -> Result<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(pool);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(BASE_READS_IN_FLIGHT)
        .thread_name(|i| format!("gstore-bases-{i}"))
        .build()
        .map_err(|e| StoreError::Internal(format!("starting the base reader threads: {e}")))?;
    Ok(POOL.get_or_init(|| pool))
}
