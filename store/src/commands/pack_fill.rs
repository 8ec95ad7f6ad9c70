//! Packs filled one after another, as push, copy and gc's rewrite write them: chunks go into
//! the pack being filled, and one that reaches the store's target size comes out to be
//! written while a new one is begun.

use crate::dedup::similar::Sketch;
use crate::format::id::ObjectId;
use crate::format::pack::PackBuilder;
use crate::repo::store::Store;

/// The pack being filled for `store` (it derefs to the [`PackBuilder`] chunks are pushed
/// into), with the resemblance sketches of its chunks.
pub(crate) struct PackFill<'a> {
    store: &'a Store,
    pack: Filled,
}

/// A filled pack, and the resemblance sketches of chunks in it: the index records them once
/// the pack is stored, so that later chunks like them can be stored as deltas (they are not
/// part of the pack).
pub(crate) struct Filled {
    pub(crate) pack: PackBuilder,
    pub(crate) sketches: Vec<(ObjectId, Sketch)>,
}

impl Filled {
    /// An empty pack of `store`'s, with no sketches.
    fn empty(store: &Store) -> Filled {
        Filled { pack: store.new_pack(), sketches: Vec::new() }
    }
}

impl<'a> PackFill<'a> {
    /// An empty pack of `store`'s.
    pub(crate) fn new(store: &'a Store) -> PackFill<'a> {
        PackFill { store, pack: Filled::empty(store) }
    }

    /// Notes the resemblance sketch of chunk `id` (added to this pack).
    pub(crate) fn add_sketch(&mut self, id: ObjectId, sketch: Sketch) {
        self.pack.sketches.push((id, sketch));
    }

    /// The pack, once it has reached the store's target size, a new one taking its place.
    pub(crate) fn full(&mut self) -> Option<Filled> {
        (self.pack.pack.len() >= self.store.config().pack_target)
            .then(|| std::mem::replace(&mut self.pack, Filled::empty(self.store)))
    }

    /// The last pack, unless it is empty.
    pub(crate) fn last(self) -> Option<Filled> {
        (!self.pack.pack.is_empty()).then_some(self.pack)
    }
}

impl std::ops::Deref for PackFill<'_> {
    type Target = PackBuilder;

    fn deref(&self) -> &PackBuilder {
        &self.pack.pack
    }
}

impl std::ops::DerefMut for PackFill<'_> {
    fn deref_mut(&mut self) -> &mut PackBuilder {
        &mut self.pack.pack
    }
}
