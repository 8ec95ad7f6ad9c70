//! How a push stores new chunks of page images as deltas against stored chunks like them
//! (docs/FORMAT.md, codec 4; docs/INTERNALS.md, "Page images").

use crate::codec::{self, BaseSource, Codec, DeltaBases};
use crate::dedup::similar::{self, Sketch};
use crate::error::Result;
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use crate::format::manifest::{ChunkRef, Manifest};
use crate::format::tag::{TagRecord, TagRef};
use crate::repo::indexed::IndexedStore;
use crate::repo::leases::{self as lease, Lease};
use crate::repo::store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A delta is kept only when it is below this fraction of the chunk's own encoding: it costs
/// a second read (its base) to restore.
const DELTA_BELOW: f64 = 0.9;

/// The same for an XOR delta against the parent's chunk at the same place: that base is
/// the previous checkpoint's, which a restore of this one seldom reads anyway, so a smaller
/// saving is kept (floats a few steps apart save 5-15 % this way, docs/BENCHMARKS.md).
const XOR_BELOW: f64 = 0.97;

/// A delta against one base that is at most this (plus a 64th of the chunk's own encoding)
/// holds about one changed page: no second base is looked for.
const ONE_PAGE_LEFT: usize = similar::PAGE as usize;

/// Second bases tried for one chunk, at most.
const SECOND_TRIES: usize = 4;

/// The chunks before and after each chunk of the parent image's page images.
type Neighbors = HashMap<ObjectId, (Option<ObjectId>, Option<ObjectId>)>;

/// The parent image's files: each file's size and its chunks with where each starts.
type ParentFiles = HashMap<String, (u64, Vec<(u64, ChunkRef)>)>;

/// Stores a push's new page-image chunks as deltas. A base is always a chunk stored whole,
/// in a pack the push has named in its lease and found without a tombstone (docs/GC.md, push
/// step 4), so gc keeps it until the push's tag names the image; after that the delta keeps
/// it alive.
pub(crate) struct Deltas<'a> {
    /// The store pushed to.
    pub(crate) store: &'a IndexedStore,
    /// The push's lease (none for a dry run).
    lease: Option<&'a Lease>,
    /// The tag the push sets: its parent image is the latest image of the same name.
    tag: &'a TagRef,
    /// The parent image named outright (the push's `parent` metadata), if it was.
    parent_tag: Option<TagRef>,
    /// The parent image, read when first needed.
    parent: OnceLock<Option<Manifest>>,
    /// The parent image's files, read when first needed.
    parent_files: OnceLock<ParentFiles>,
    /// Packs checked as homes of bases: true when a base in them may be relied on.
    vetted: Mutex<HashMap<ObjectId, bool>>,
    /// The parent image's neighbors, read when first needed.
    neighbors: OnceLock<Neighbors>,
}

/// A span of a unit's bytes cut where the parent image's same file was cut, with the parent's
/// chunk there.
pub(crate) type AlignedSpan = (std::ops::Range<usize>, ChunkRef);

/// File names of tensors saved in place, checkpoint after checkpoint: cut where the parent's
/// same file was cut ([`Deltas::aligned_spans`]). Other files keep content-defined cuts, which
/// survive insertions.
const TENSOR_FILES: [&str; 7] = [".safetensors", ".distcp", ".pt", ".pth", ".bin", ".npy", ".gguf"];

/// Whether `path` names a file of tensors ([`TENSOR_FILES`]).
pub(crate) fn is_tensor_file(path: &str) -> bool {
    TENSOR_FILES.iter().any(|ext| path.ends_with(ext))
}

impl<'a> Deltas<'a> {
    /// Deltas for a push into `store` under `lease`, setting `tag`; its parent image is
    /// `parent_tag`'s when given, else the latest of `tag`'s name.
    pub(crate) fn new(
        store: &'a IndexedStore,
        lease: Option<&'a Lease>,
        tag: &'a TagRef,
        parent_tag: Option<TagRef>,
    ) -> Deltas<'a> {
        Deltas {
            store,
            lease,
            tag,
            parent_tag,
            parent: OnceLock::new(),
            parent_files: OnceLock::new(),
            vetted: Mutex::default(),
            neighbors: OnceLock::new(),
        }
    }

    /// The spans of a file's unit (`len` bytes at `offset` of file `path`, `size` bytes in
    /// all) cut where the parent image's same file was, when it has one of the same size:
    /// tensors saved again in place then meet their old values chunk for chunk, for
    /// [`Deltas::encode_aligned`]. `None` when there is no such file, or its chunks do not
    /// tile the unit (another segment size).
    pub(crate) fn aligned_spans(&self, path: &str, size: u64, offset: u64, len: u64) -> Option<Vec<AlignedSpan>> {
        if !is_tensor_file(path) {
            return None;
        }
        let (parent_size, chunks) = self.parent_files().get(path)?;
        if *parent_size != size {
            return None;
        }
        let first = chunks.partition_point(|(start, _)| *start < offset);
        let mut at = offset;
        let mut spans = Vec::new();
        for (start, c) in &chunks[first..] {
            if at == offset + len {
                break;
            }
            let end = start + c.len as u64;
            if *start != at || end > offset + len {
                return None;
            }
            spans.push(((start - offset) as usize..(end - offset) as usize, *c));
            at = end;
        }
        (at == offset + len).then_some(spans)
    }

    /// `plain` stored as an XOR delta against `parent`, the parent image's chunk at the same
    /// place (a chunk of the same length stored whole in a pack [`Deltas::vet`] accepts), when
    /// that is enough smaller than `whole` bytes (its own encoding).
    pub(crate) fn encode_aligned(
        &self,
        encoder: &mut codec::Encoder,
        plain: &[u8],
        parent: &ChunkRef,
        whole: usize,
    ) -> Result<Option<(DeltaBases, Vec<u8>)>> {
        if parent.zero || parent.len as usize != plain.len() {
            return Ok(None);
        }
        let Some(base) = self.usable_base(&parent.id)? else { return Ok(None) };
        let limit = (whole as f64 * XOR_BELOW) as usize;
        Ok(encoder.encode_xor_delta(plain, parent.id, &base, limit).map(|d| (DeltaBases::one(parent.id), d)))
    }

    /// The parent image (read once): `parent_tag`'s, else the latest of the tag's name.
    fn parent(&self) -> Option<&Manifest> {
        self.parent.get_or_init(|| parent_manifest(self.store, self.parent_tag.as_ref(), self.tag)).as_ref()
    }

    /// The parent image's files (read once; a push of tensor files reads them before its
    /// workers start, so that they are not read from many threads at once).
    pub(crate) fn parent_files(&self) -> &ParentFiles {
        self.parent_files.get_or_init(|| {
            let mut out = ParentFiles::new();
            for (entry, chunks) in self.parent().into_iter().flat_map(Manifest::files) {
                let mut at = 0u64;
                let placed = chunks
                    .iter()
                    .map(|c| {
                        let start = at;
                        at += c.len as u64;
                        (start, *c)
                    })
                    .collect();
                out.insert(entry.path.clone(), (entry.size, placed));
            }
            out
        })
    }

    /// The bases and stored bytes of `plain` (chunk `id` at file offset `at`, after chunk
    /// `before` in its file, sketch `sketch`) as a delta, when stored chunks like it are
    /// found and the delta is enough smaller than `whole` bytes (its own encoding). The first
    /// base is the stored chunk most like it, else the chunk that followed `before` in the
    /// parent image (a chunk whose new content outweighs its old keeps few features of the
    /// old). When that leaves more than about a page (a changed page moved a chunk boundary,
    /// so the chunk spans two old ones), a second base is added, the best of: the stored
    /// chunk most like the part the first does not hold ([`similar::uncovered`]), the first
    /// base's neighbors in the parent image, the chunk that followed `before` there, and the
    /// next most like the whole chunk.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode(
        &self,
        encoder: &mut codec::Encoder,
        id: &ObjectId,
        plain: &[u8],
        at: u64,
        before: Option<ObjectId>,
        sketch: &Sketch,
        whole: usize,
    ) -> Result<Option<(DeltaBases, Vec<u8>)>> {
        let limit = (whole as f64 * DELTA_BELOW) as usize;
        let index = self.store.index();
        let hinted = before.and_then(|b| self.neighbors().get(&b).and_then(|n| n.1));
        let mut candidates = index.similar(sketch)?;
        candidates.extend(hinted.filter(|h| !candidates.contains(h)));
        let Some((first, first_plain)) = self.first_usable(&candidates, id)? else { return Ok(None) };
        let one = DeltaBases::one(first);
        let mut best = encoder.encode_delta(plain, &one, &first_plain, limit).map(|d| (one, d));
        // About a page left is as good as it gets. So, nearly always, is a chunk that starts
        // and ends as its base does (its base changed inside): on CRIU images of real
        // processes the second bases tried for such chunks made no delta smaller.
        if best.as_ref().is_some_and(|(_, d)| d.len() <= ONE_PAGE_LEFT + whole / 64)
            || similar::same_ends(plain, &first_plain)
        {
            return Ok(best);
        }
        let mut seconds: Vec<ObjectId> = Vec::new();
        let rest = similar::uncovered(plain, at, &first_plain)
            .and_then(|r| similar::sketch(&plain[r.clone()], at + r.start as u64));
        if let Some(rest) = rest {
            seconds.extend(index.similar(&rest)?.into_iter().take(1));
        }
        if let Some(&(prev, next)) = self.neighbors().get(&first) {
            seconds.extend(prev.into_iter().chain(next));
        }
        seconds.extend(hinted);
        seconds.extend(candidates.iter().filter(|c| **c != first).take(1));
        // Each candidate once, in that order, neither the chunk itself nor its first base.
        let mut seen = vec![*id, first];
        seconds.retain(|s| {
            !seen.contains(s) && {
                seen.push(*s);
                true
            }
        });
        for second in seconds.into_iter().take(SECOND_TRIES) {
            let Some(second_plain) = self.usable_base(&second)? else { continue };
            let two = DeltaBases { first, second: Some(second) };
            let prefix = [&first_plain[..], &second_plain[..]].concat();
            let room = best.as_ref().map_or(limit, |(_, d)| d.len());
            if let Some(d) = encoder.encode_delta(plain, &two, &prefix, room) {
                best = Some((two, d));
            }
        }
        Ok(best)
    }

    /// The first of `candidates`, other than chunk `id` itself, that may serve as a base,
    /// with its bytes.
    fn first_usable(&self, candidates: &[ObjectId], id: &ObjectId) -> Result<Option<(ObjectId, Arc<Vec<u8>>)>> {
        for base in candidates.iter().filter(|c| *c != id) {
            if let Some(plain) = self.usable_base(base)? {
                return Ok(Some((*base, plain)));
            }
        }
        Ok(None)
    }

    /// The plain bytes of `base` when it may serve as a base: stored whole, in a pack
    /// [`Deltas::vet`] accepts, and readable.
    fn usable_base(&self, base: &ObjectId) -> Result<Option<Arc<Vec<u8>>>> {
        let Some(loc) = self.store.index().locate_for_dedup(base)? else { return Ok(None) };
        if loc.codec == Codec::Delta || !self.vet(loc.pack)? {
            return Ok(None);
        }
        match self.store.base_plain(base).map_err(crate::StoreError::from) {
            Ok(b) => Ok(Some(b)),
            // Gone or damaged meanwhile: not a base.
            Err(e) if e.is_damage() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// True when every one of `bases` (if any) is in a pack that [`Deltas::vet`] accepts.
    pub(crate) fn bases_are_reliable(&self, bases: Option<DeltaBases>) -> Result<bool> {
        for base in bases.iter().flat_map(DeltaBases::iter) {
            match self.store.index().locate_for_dedup(&base)? {
                Some(loc) if self.vet(loc.pack)? => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// True when chunks in `pack` may serve as bases: named in the lease, then found with no
    /// tombstone and still there (checked once per pack).
    pub(crate) fn vet(&self, pack: ObjectId) -> Result<bool> {
        let Some(lease) = self.lease else { return Ok(true) };
        let mut vetted = self.vetted.lock().expect("vetted packs lock");
        if let Some(&ok) = vetted.get(&pack) {
            return Ok(ok);
        }
        lease.protect(&[pack], &[])?;
        let key = ObjectKey::Pack(pack);
        let ok = !lease::has_tombstone(self.store.backend(), &key)? && self.store.backend().size(&key)?.is_some();
        vetted.insert(pack, ok);
        Ok(ok)
    }

    /// The chunks before and after each chunk of the parent image's page images (read once).
    fn neighbors(&self) -> &Neighbors {
        self.neighbors.get_or_init(|| self.parent().map(page_neighbors).unwrap_or_default())
    }
}

/// The parent of a push setting `tag`: the image `named` names when given, else the image
/// the tag names now, else the one last set among the tag's name's other versions. Only a
/// hint for choosing bases, so an unreadable parent is none.
fn parent_manifest(store: &Store, named: Option<&TagRef>, tag: &TagRef) -> Option<Manifest> {
    let parent = match store.get_tag(named.unwrap_or(tag)).ok()? {
        Some(rec) => rec,
        None if named.is_some() => return None,
        None => {
            let prefix = format!("{}/{}/", Family::Tags.prefix(), tag.name);
            let mut latest: Option<TagRecord> = None;
            for listed in store.backend().list(&prefix).ok()? {
                let ObjectKey::Tag(t) = &listed.key else { continue };
                let Ok(Some(rec)) = store.get_tag(t) else { continue };
                if latest.as_ref().is_none_or(|l| l.set_time() < rec.set_time()) {
                    latest = Some(rec);
                }
            }
            latest?
        }
    };
    store.get_manifest(&parent.manifest_id().ok()?).ok()
}

/// The chunks before and after each chunk of `manifest`'s page images.
fn page_neighbors(manifest: &Manifest) -> Neighbors {
    let mut out = Neighbors::new();
    for (entry, chunks) in manifest.files() {
        if !similar::is_page_image_path(&entry.path) {
            continue;
        }
        for (i, c) in chunks.iter().enumerate() {
            let before = i.checked_sub(1).map(|j| chunks[j].id);
            let after = chunks.get(i + 1).map(|n| n.id);
            out.entry(c.id).or_insert((before, after));
        }
    }
    out
}
