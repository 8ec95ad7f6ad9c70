//! Packs filled one after another, as push, copy and gc's rewrite write them: chunks go into
//! the pack being filled, and one that reaches the store's target size comes out to be
//! written while a new one is begun.

use crate::format::pack::PackBuilder;
use crate::repo::store::Store;

/// The pack being filled for `store` (it derefs to the [`PackBuilder`] chunks are pushed
/// into).
pub(crate) struct PackFill<'a> {
    store: &'a Store,
    pack: PackBuilder,
}

impl<'a> PackFill<'a> {
    /// An empty pack of `store`'s.
    pub(crate) fn new(store: &'a Store) -> PackFill<'a> {
        PackFill { store, pack: store.new_pack() }
    }

    /// The pack, once it has reached the store's target size, a new one taking its place.
    pub(crate) fn full(&mut self) -> Option<PackBuilder> {
        (self.pack.len() >= self.store.config().pack_target)
            .then(|| std::mem::replace(&mut self.pack, self.store.new_pack()))
    }

    /// The last pack, unless it is empty.
    pub(crate) fn last(self) -> Option<PackBuilder> {
        (!self.pack.is_empty()).then_some(self.pack)
    }
}

impl std::ops::Deref for PackFill<'_> {
    type Target = PackBuilder;

    fn deref(&self) -> &PackBuilder {
        &self.pack
    }
}

impl std::ops::DerefMut for PackFill<'_> {
    fn deref_mut(&mut self) -> &mut PackBuilder {
        &mut self.pack
    }
}
