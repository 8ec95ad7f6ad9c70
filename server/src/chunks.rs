//! The server's map of chunks to packs, built in memory from pack footers (the server keeps no
//! files of its own) and refreshed, reading only new footers, when a chunk is not found. It
//! also knows which packs gc has tombstoned: those still serve reads, but a push must not
//! deduplicate against them (docs/GC.md), so they never make a chunk count as present.
//!
//! Listing and footer reads go through the store's own protocol helpers (the same ones
//! `IndexedStore::sync_index` uses); they block, so callers run refreshes on blocking threads.

use gstore_store::backend::Backend;

use gstore_store::repo::index::ChunkLocation;
use gstore_store::{repo::leases as lease, ObjectId, Result};
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

/// Where each chunk is.
pub struct ChunkMap {
    inner: RwLock<Known>,
    /// The store's `chunk_max`: packs listing a longer chunk are damaged.
    chunk_max: u32,
}

#[derive(Default)]
struct Known {
    /// Every pack known to hold each chunk.
    chunks: HashMap<ObjectId, Vec<ChunkLocation>>,
    packs: HashSet<ObjectId>,
    /// Packs with a gc tombstone, as last listed.
    doomed: HashSet<ObjectId>,
}

impl Known {
    /// A holder of `id` without a tombstone whose bytes decode (see [`Known::usable`]), if any.
    fn live(&self, id: &ObjectId) -> Option<ChunkLocation> {
        self.chunks.get(id)?.iter().find(|l| !self.doomed.contains(&l.pack) && self.usable(l, true)).copied()
    }

    /// True when `l` is a copy of its chunk: stored whole, or a delta each of whose bases is
    /// stored whole in some pack (without a tombstone, when `live`). gc may keep a dead delta
    /// in a pack that stays for other chunks while it deletes the delta's bases.
    fn usable(&self, l: &ChunkLocation, live: bool) -> bool {
        l.bases.iter().flat_map(|b| b.iter()).all(|b| self.whole(&b, live).is_some())
    }

    /// A holder of `id` storing it whole (not as a delta), without a tombstone when `live`.
    fn whole(&self, id: &ObjectId, live: bool) -> Option<ChunkLocation> {
        self.chunks.get(id)?.iter().find(|l| l.bases.is_none() && !(live && self.doomed.contains(&l.pack))).copied()
    }
}

impl ChunkMap {
    /// An empty map for a store whose chunks are at most `chunk_max` bytes.
    pub fn new(chunk_max: u32) -> ChunkMap {
        ChunkMap { inner: RwLock::default(), chunk_max }
    }

    fn known(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn known_mut(&self) -> std::sync::RwLockWriteGuard<'_, Known> {
        self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where to read `id` from, if known: a pack without a tombstone if there is one, else a
    /// tombstoned one (readable until gc deletes it).
    pub fn get(&self, id: &ObjectId) -> Option<ChunkLocation> {
        let k = self.known();
        k.live(id).or_else(|| k.chunks.get(id)?.iter().find(|l| k.usable(l, false)).copied())
    }

    /// Where `id` is stored whole (for a delta base), preferring a pack without a tombstone.
    pub fn get_whole(&self, id: &ObjectId) -> Option<ChunkLocation> {
        let k = self.known();
        k.whole(id, true).or_else(|| k.whole(id, false))
    }

    /// True when a pack without a tombstone (as last listed) holds `id`: one a push may rely on.
    pub fn held_live(&self, id: &ObjectId) -> bool {
        self.known().live(id).is_some()
    }

    /// Lists gc's tombstones again, so [`ChunkMap::held_live`] answers for now. Blocks.
    pub fn refresh_tombstones(&self, backend: &Backend) -> Result<()> {
        let doomed = lease::tombstoned_packs(backend)?;
        self.known_mut().doomed = doomed;
        Ok(())
    }

    /// Lists tombstones, then packs (in that order, as every store does), and reads the
    /// footers of packs not seen yet. Damaged packs are skipped. When gc deleted a known pack,
    /// the map is rebuilt (chunks it held may live in another pack now). Blocks.
    pub fn refresh(&self, backend: &Backend) -> Result<()> {
        let (doomed, listed) = lease::doomed_then_listed(backend)?;
        let present: HashSet<ObjectId> = listed.iter().filter_map(|l| l.key.pack()).collect();
        let mut known = {
            let mut k = self.known_mut();
            k.doomed = doomed;
            if !k.packs.is_subset(&present) {
                k.chunks.clear();
                k.packs.clear();
            }
            k.packs.clone()
        };
        for l in listed {
            let Some(id) = l.key.pack() else { continue };
            if !known.insert(id) {
                continue;
            }
            if let Ok((entries, _)) = gstore_store::repo::packs::read_tail(backend, &id, l.size, self.chunk_max) {
                let mut k = self.known_mut();
                k.packs.insert(id);
                for e in &entries {
                    k.chunks.entry(e.id).or_default().push(ChunkLocation::in_pack(id, e));
                }
            }
        }
        Ok(())
    }
}
