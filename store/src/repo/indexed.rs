//! A store opened with its index: the handle for everything that reads or writes chunks.
//! Opening it takes the store lock and brings the index up to date with the backend (packs
//! pushed elsewhere indexed, packs gc removed forgotten); the index is only a cache of the
//! pack footers, rebuilt from them when asked.

use crate::backend::{self, Backend};
use crate::codec::Decoder;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::manifest::Manifest;
use crate::format::pack::{self, PackEntry};
use crate::format::tag::{TagRecord, TagRef};
use crate::repo::index::{ChunkLocation, Index};
use crate::repo::location::StoreLocation;
use crate::repo::lock::StoreLock;
use crate::repo::store::Store;
use std::collections::HashSet;
use std::path::PathBuf;

/// A store opened with its index ([`Store::open_indexed`], [`Store::with_index`]), holding
/// the store lock that guards the index while it lives. It derefs to its [`Store`], so code
/// that needs only tags and manifests takes a `&Store` and is given either handle; code that
/// locates, reads or writes chunks takes an `&IndexedStore`, and so cannot be reached with a
/// handle opened without the index.
pub struct IndexedStore {
    store: Store,
    // Dropped before the lock that guards it (fields drop in order).
    index: Index,
    _lock: StoreLock,
}

impl std::ops::Deref for IndexedStore {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}

impl Store {
    /// Opens an existing store with its index, waiting (after calling `on_wait`) while another
    /// process holds it. An index that does not exist yet is built from the pack footers.
    pub fn open_indexed(location: &StoreLocation, on_wait: &dyn Fn(&str)) -> Result<IndexedStore> {
        Store::open(location)?.with_index(on_wait)
    }

    /// Opens a store with its index to read an image (as [`Store::with_index_to_read`]:
    /// read-only while it is up to date) and reads the manifest of the image `reference` names
    /// (see [`Store::resolve`]). The tag and manifest reads run beside
    /// the index's opening and catch-up: a remote store's round trips overlap, and a local
    /// store's manifest (9.7 MB for 16 GiB of weights) is read and checked meanwhile.
    pub fn open_image(
        location: &StoreLocation,
        reference: &str,
        on_wait: &dyn Fn(&str),
    ) -> Result<(IndexedStore, ObjectId, Manifest)> {
        let (store, id, manifest, ()) = Store::open_image_then(|| Store::open(location), reference, on_wait, |_| ())?;
        Ok((store, id, manifest))
    }

    /// [`Store::open_image`] on the store `open` opens (twice: once for the index, once for
    /// the image, at the same time; e.g. with an index slot), with `then` run on the manifest
    /// beside the index's opening too (a load works out what the image needs meanwhile);
    /// returns what it gives as well.
    pub fn open_image_then<T: Send>(
        open: impl Fn() -> Result<Store> + Sync,
        reference: &str,
        on_wait: &dyn Fn(&str),
        then: impl FnOnce(&Manifest) -> T + Send,
    ) -> Result<(IndexedStore, ObjectId, Manifest, T)> {
        let read_image = || -> Result<_> {
            let store = open()?;
            let id = store.resolve(reference)?;
            let manifest = store.get_manifest(&id)?;
            let more = then(&manifest);
            Ok((id, manifest, more))
        };
        std::thread::scope(|s| {
            let image = s.spawn(read_image);
            let store = open().and_then(|s| s.with_index_to_read(on_wait));
            let image = image.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            let store = store?;
            let (id, manifest, more) = image?;
            Ok((store, id, manifest, more))
        })
    }

    /// Opens this store's index (see [`Store::open_indexed`]). An index that cannot be opened
    /// (damaged) is an error that says to run `gstore index rebuild`.
    pub fn with_index(self, on_wait: &dyn Fn(&str)) -> Result<IndexedStore> {
        let (dir, lock) = self.lock_index(on_wait)?;
        self.open_index_writable(dir, lock, None)
    }

    /// [`Store::with_index`] for a command that only reads chunks (a restore, a load): the
    /// index is opened read-only, which is several times faster, when it is up to date with
    /// the backend (no pack pushed or removed elsewhere, nothing newly tombstoned or damaged
    /// since it was last caught up); otherwise writable, and caught up. Plans are recorded
    /// either way ([`crate::repo::plans`]); anything else written through a read-only index
    /// fails.
    pub fn with_index_to_read(self, on_wait: &dyn Fn(&str)) -> Result<IndexedStore> {
        let (dir, lock) = self.lock_index(on_wait)?;
        let (index, listing) = std::thread::scope(|s| {
            let listing = s.spawn(|| Listing::read(&self.backend));
            let index = Index::open_read_only(&dir);
            (index, listing.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        });
        let listing = listing?;
        if let Some(index) = index? {
            let present: HashSet<ObjectId> = listing.packs.iter().filter_map(|l| l.key.pack()).collect();
            if index.current_with(&present, &listing.doomed, &listing.damaged)? {
                return Ok(IndexedStore { store: self, index, _lock: lock });
            }
        }
        self.open_index_writable(dir, lock, Some(listing))
    }

    /// Opens the index at `dir` (guarded by `lock`) writable and catches it up with the
    /// backend's `listing`, read beside the opening unless given.
    fn open_index_writable(self, dir: PathBuf, lock: StoreLock, listing: Option<Listing>) -> Result<IndexedStore> {
        // Under the lock, the backend's listing (round trips on a remote store) runs while
        // the index opens.
        let (index, listing) = std::thread::scope(|s| {
            let listing = s.spawn(|| listing.map_or_else(|| Listing::read(&self.backend), Ok));
            let index = Index::open(&dir);
            (index, listing.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        });
        let index = index?;
        let fresh = index.needs_fill();
        let store = IndexedStore { store: self, index, _lock: lock };
        if fresh {
            store.fill_index(listing?, &crate::progress::Silent)?;
        } else {
            // Other processes and machines push packs and gc removes them: catch up.
            store.catch_up(listing?)?;
        }
        Ok(store)
    }

    /// Opens this store with a new index built from the pack footers (`gstore index
    /// rebuild`): the old index is deleted without being opened, so a damaged one is no
    /// obstacle (it is only a cache). Returns the store, the packs indexed, and the damaged
    /// packs skipped with their errors.
    pub fn with_new_index(
        self,
        on_wait: &dyn Fn(&str),
        progress: &dyn crate::progress::Progress,
    ) -> Result<(IndexedStore, usize, Vec<StoreError>)> {
        let (dir, lock) = self.lock_index(on_wait)?;
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::io("removing the old index", &dir, e))
            }
            _ => {}
        }
        crate::repo::plans::PlanFiles::of(&dir).forget_all()?;
        let store = IndexedStore { index: Index::open(&dir)?, store: self, _lock: lock };
        let (indexed, damaged) = store.rebuild_index(progress)?;
        Ok((store, indexed, damaged))
    }

    /// Takes the store lock (waiting for another process that holds it); returns it with the
    /// index directory it guards.
    fn lock_index(&self, on_wait: &dyn Fn(&str)) -> Result<(PathBuf, StoreLock)> {
        let dir = self.index_dir();
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::io("creating", parent, e))?;
        }
        let lock = StoreLock::acquire(&dir.with_extension("lock"), on_wait)?;
        Ok((dir, lock))
    }
}

impl IndexedStore {
    /// The index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Where a chunk is stored, per the index.
    pub fn locate(&self, id: &ObjectId) -> Result<Option<ChunkLocation>> {
        self.index.locate(id)
    }

    /// Where each of many chunks is stored, per the index, in `ids`' order (faster per chunk
    /// than [`IndexedStore::locate`]: one index iterator seeks them in key order).
    pub fn locate_many(&self, ids: &[ObjectId]) -> Result<Vec<Option<ChunkLocation>>> {
        self.index.locate_many(ids)
    }

    /// Where every chunk of an image was when a restore last planned it, recorded under `key`
    /// (which names the image's chunk list), if those packs are all still there
    /// ([`crate::repo::index::Index::plan`]).
    pub fn recorded_plan(&self, key: &ObjectId) -> Result<Option<crate::repo::plans::RecordedPlan>> {
        self.index.plan(key)
    }

    /// Records a plan's locations under `key`, for the next plan of the same image.
    pub fn record_plan(&self, key: &ObjectId, record: crate::repo::plans::PlanRecord) -> Result<()> {
        self.index.put_plan(key, record)
    }

    /// A chunk decoder for this store: it reads the bases of delta chunks from it.
    pub fn decoder(&self) -> Decoder<'_> {
        self.decoder_over(self)
    }

    /// Stores a finished pack, then records it in the index (pack before index).
    pub fn put_pack(&self, p: pack::FinishedPack) -> Result<()> {
        let size = p.size();
        let key = ObjectKey::Pack(p.id);
        let pieces: object_store::PutPayload = p.pieces.into_iter().collect();
        if self.is_remote() && size > backend::MULTIPART_ABOVE {
            self.backend.put_multipart(&key, pieces)?;
        } else {
            self.backend.put(&key, pieces)?;
        }
        self.index.add_pack(p.id, size, &p.entries)
    }

    /// Points `tag` at an image already in the store (`gstore tag`). A lease protects the
    /// image while it has no tag, and the image is refused if gc has tombstoned its manifest
    /// or a pack its chunks are only in (docs/GC.md, "A push", the tag copy): gc might delete
    /// them any moment. A tag whose name reads as a manifest id is refused
    /// ([`TagRef::check_new`]). Needs the index.
    pub fn tag_existing(&self, tag: &TagRef, id: ObjectId) -> Result<TagRecord> {
        tag.check_new()?;
        let lease = crate::repo::leases::Lease::take(&self.backend, &format!("tag {tag}"))?;
        self.hold_images(&lease, &[id])?;
        let rec = self.set_tag(tag, id)?;
        drop(lease);
        Ok(rec)
    }

    /// Names images `ids` in `lease` so that gc keeps them, and reads their manifests; an
    /// image gc has begun to remove (its manifest, or a pack its chunks are only in,
    /// tombstoned) is refused: gc might delete it any moment. Needs the index.
    pub(crate) fn hold_images(&self, lease: &crate::repo::leases::Lease, ids: &[ObjectId]) -> Result<Vec<Manifest>> {
        lease.protect(&[], ids)?;
        self.sync_index()?;
        let mut manifests = Vec::with_capacity(ids.len());
        for id in ids {
            let manifest_doomed = crate::repo::leases::has_tombstone(&self.backend, &ObjectKey::Manifest(*id))?;
            let m = self.get_manifest(id)?;
            let mut chunks_doomed = false;
            for c in m.chunks.iter().filter(|c| !c.zero) {
                if self.index.locate_for_dedup(&c.id)?.is_none() {
                    chunks_doomed = true;
                    break;
                }
            }
            if manifest_doomed || chunks_doomed {
                return Err(StoreError::Conflict(format!(
                    "image {} is being garbage-collected (gc tombstoned part of it): push it again instead",
                    id.to_hex()
                )));
            }
            manifests.push(m);
        }
        Ok(manifests)
    }

    /// Brings the index up to date with the backend, reading only footers: indexes packs it
    /// does not know yet (pushed by other processes or machines), forgets packs that are gone
    /// (deleted by gc) and records which packs gc has tombstoned. Tombstones are listed before
    /// packs (docs/GC.md). Damaged packs are skipped (verify names the images they break).
    /// Returns how many packs were added.
    pub fn sync_index(&self) -> Result<usize> {
        self.catch_up(Listing::read(&self.backend)?)
    }

    /// [`IndexedStore::sync_index`] from a listing of tombstoned packs, then packs, taken under the
    /// store lock.
    fn catch_up(&self, Listing { doomed, packs: listed, damaged }: Listing) -> Result<usize> {
        let index = &self.index;
        index.set_damaged(&damaged)?;
        let present: HashSet<ObjectId> = listed.iter().filter_map(|l| l.key.pack()).collect();
        let mut known = HashSet::new();
        for (id, _) in index.packs()? {
            if present.contains(&id) {
                known.insert(id);
            } else {
                index.remove_pack(&id)?;
            }
        }
        index.set_doomed(&doomed)?;
        let new: Vec<(ObjectId, u64)> =
            listed.iter().filter_map(|l| Some((l.key.pack()?, l.size))).filter(|(id, _)| !known.contains(id)).collect();
        let mut added = 0;
        self.read_tails(&new, |id, size, read| {
            if let Ok(entries) = read {
                index.add_pack(id, size, &entries)?;
                added += 1;
            }
            Ok(())
        })?;
        index.set_caught_up(&present)?;
        Ok(added)
    }

    /// Reads the footers of `packs` and hands each result to `each` (in any order), with
    /// [`Store::reads_in_flight`] reads in flight: over the network the round trips overlap.
    fn read_tails(
        &self,
        packs: &[(ObjectId, u64)],
        mut each: impl FnMut(ObjectId, u64, Result<Vec<PackEntry>>) -> Result<()>,
    ) -> Result<()> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let readers = self.reads_in_flight();
            for _ in 0..readers.min(packs.len()) {
                let (tx, next) = (tx.clone(), &next);
                s.spawn(move || {
                    while let Some(&(id, size)) = packs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if tx.send((id, size, self.read_pack_tail(&id, size).map(|(e, _)| e))).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let handed = rx.iter().try_for_each(|(id, size, read)| each(id, size, read));
            // On a failure the readers stop at their next pack.
            next.store(packs.len(), Ordering::Relaxed);
            handed
        })
    }

    /// Fills the index from the pack footers in the backend. Returns (packs indexed,
    /// damaged packs skipped with their errors).
    fn rebuild_index(&self, progress: &dyn crate::progress::Progress) -> Result<(usize, Vec<StoreError>)> {
        self.fill_index(Listing::read(&self.backend)?, progress)
    }

    /// [`IndexedStore::rebuild_index`] from a listing of tombstoned packs, then packs, taken under
    /// the store lock.
    fn fill_index(
        &self,
        Listing { doomed, packs, damaged }: Listing,
        progress: &dyn crate::progress::Progress,
    ) -> Result<(usize, Vec<StoreError>)> {
        let index = &self.index;
        index.clear()?;
        index.set_doomed(&doomed)?;
        index.set_damaged(&damaged)?;
        let packs: Vec<(ObjectId, u64)> = packs.iter().filter_map(|l| Some((l.key.pack()?, l.size))).collect();
        let present: HashSet<ObjectId> = packs.iter().map(|(id, _)| *id).collect();
        progress.start("indexing packs", packs.len() as u64, crate::progress::Unit::Items);
        let mut ok = 0;
        let mut damaged = Vec::new();
        self.read_tails(&packs, |id, size, read| {
            match read {
                Ok(entries) => {
                    index.add_pack(id, size, &entries)?;
                    ok += 1;
                }
                Err(e) => damaged.push(e),
            }
            progress.advance(1);
            Ok(())
        })?;
        index.set_caught_up(&present)?;
        progress.finish();
        Ok((ok, damaged))
    }
}

/// What an index sync reads from the store: the tombstoned packs, then the listing of
/// `packs/` (in that order: docs/GC.md, push step 4), then the damaged copies damage records
/// name.
struct Listing {
    doomed: HashSet<ObjectId>,
    packs: Vec<backend::Listed>,
    damaged: HashSet<crate::format::damage::DamagedCopy>,
}

impl Listing {
    fn read(backend: &Backend) -> Result<Listing> {
        let (doomed, packs) = crate::repo::leases::doomed_then_listed(backend)?;
        let (damaged, _) = crate::repo::damage::read_all(backend)?;
        Ok(Listing { doomed, packs, damaged })
    }
}
