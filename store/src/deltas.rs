//! How a push stores new chunks of page images as deltas against stored chunks like them
//! (docs/FORMAT.md, codec 4; docs/ARCHITECTURE.md, "Page images").

use crate::codec::{self, BaseSource, Codec, DeltaBases};
use crate::error::Result;
use crate::id::ObjectId;
use crate::key::{Family, ObjectKey};
use crate::lease::{self, Lease};
use crate::similar::{self, Sketch};
use crate::store::Store;
use crate::tag::{TagRecord, TagRef};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A delta is kept only when it is below this fraction of the chunk's own encoding: it costs
/// a second read (its base) to restore.
const DELTA_BELOW: f64 = 0.9;

/// A delta against one base that is at most this (plus a 64th of the chunk's own encoding)
/// holds about one changed page: no second base is looked for.
const ONE_PAGE_LEFT: usize = similar::PAGE as usize;

/// Second bases tried for one chunk, at most.
const SECOND_TRIES: usize = 4;

/// The chunks before and after each chunk of the parent image's page images.
type Neighbors = HashMap<ObjectId, (Option<ObjectId>, Option<ObjectId>)>;

/// Stores a push's new page-image chunks as deltas. A base is always a chunk stored whole,
/// in a pack the push has named in its lease and found without a tombstone (docs/GC.md, push
/// step 4), so gc keeps it until the push's tag names the image; after that the delta keeps
/// it alive.
pub(crate) struct Deltas<'a> {
    /// The store pushed to.
    pub(crate) store: &'a Store,
    /// The push's lease (none for a dry run).
    lease: Option<&'a Lease>,
    /// The tag the push sets: its parent image is the latest image of the same name.
    tag: &'a TagRef,
    /// Packs checked as homes of bases: true when a base in them may be relied on.
    vetted: Mutex<HashMap<ObjectId, bool>>,
    /// The parent image's neighbors, read when first needed.
    neighbors: OnceLock<Neighbors>,
}

impl<'a> Deltas<'a> {
    /// Deltas for a push into `store` under `lease`, setting `tag`.
    pub(crate) fn new(store: &'a Store, lease: Option<&'a Lease>, tag: &'a TagRef) -> Deltas<'a> {
        Deltas { store, lease, tag, vetted: Mutex::default(), neighbors: OnceLock::new() }
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
        let index = self.store.index()?;
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
        let Some(loc) = self.store.index()?.locate_for_dedup(base)? else { return Ok(None) };
        if loc.codec == Codec::Delta || !self.vet(loc.pack)? {
            return Ok(None);
        }
        match self.store.base_plain(base) {
            Ok(b) => Ok(Some(b)),
            // Gone or damaged meanwhile: not a base.
            Err(e) if e.is_damage() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// True when every one of `bases` (if any) is in a pack that [`Deltas::vet`] accepts.
    pub(crate) fn bases_are_reliable(&self, bases: Option<DeltaBases>) -> Result<bool> {
        for base in bases.iter().flat_map(DeltaBases::iter) {
            match self.store.index()?.locate_for_dedup(&base)? {
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
        let ok = !lease::has_tombstone(self.store.backend(), &key)?
            && self.store.backend().size(&key.to_string())?.is_some();
        vetted.insert(pack, ok);
        Ok(ok)
    }

    /// The chunks before and after each chunk of the parent image's page images (read once).
    fn neighbors(&self) -> &Neighbors {
        self.neighbors.get_or_init(|| parent_neighbors(self.store, self.tag).unwrap_or_default())
    }
}

/// The neighbors in the page images of the parent of a push setting `tag`: the image the tag
/// names now, else the one last set among the tag's name's other versions. Only a hint for
/// choosing bases, so an unreadable parent gives none.
fn parent_neighbors(store: &Store, tag: &TagRef) -> Option<Neighbors> {
    let parent = match store.get_tag(tag).ok()? {
        Some(rec) => rec,
        None => {
            let prefix = format!("{}/{}/", Family::Tags.prefix(), tag.name);
            let mut latest: Option<TagRecord> = None;
            for listed in store.backend().list(&prefix).ok()? {
                let Ok(ObjectKey::Tag(t)) = ObjectKey::parse(&listed.key) else { continue };
                let Ok(Some(rec)) = store.get_tag(&t) else { continue };
                if latest.as_ref().is_none_or(|l| l.set_time() < rec.set_time()) {
                    latest = Some(rec);
                }
            }
            latest?
        }
    };
    let manifest = store.get_manifest(&parent.manifest_id().ok()?).ok()?;
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
    Some(out)
}
