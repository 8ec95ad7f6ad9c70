//! Recently read delta bases, held for the next delta that needs one (a store handle keeps
//! one cache; [`crate::repo::bases`] reads through it).

use crate::format::id::ObjectId;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Plain bytes of bases held at most (oldest dropped first).
const HELD_BYTES: usize = 64 << 20;

/// Bases a put looks at, at most, for ones to drop: held bases are put back at the end, and
/// looking through all of them on every put (while hundreds are held by readers on 16
/// threads) would hold the lock long enough to slow a restore by half. A put adds one base
/// and may drop several, so the cache comes back under its limit once bases are let go.
const EVICT_LOOKS: usize = 4;

/// Recently read delta bases, oldest first out.
#[derive(Default)]
pub(crate) struct BaseCache {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_id: HashMap<ObjectId, Arc<Vec<u8>>>,
    order: VecDeque<ObjectId>,
    bytes: usize,
}

impl BaseCache {
    /// The base `id`, if held.
    pub(crate) fn get(&self, id: &ObjectId) -> Option<Arc<Vec<u8>>> {
        self.inner.lock().expect("base cache lock").by_id.get(id).cloned()
    }

    /// Holds base `id`, dropping the oldest bases past the limit — except those a reader
    /// still holds (see [`crate::IndexedStore::prefetch_bases`]): with many readers each fetching
    /// bases for a batch of deltas, the batches together can outgrow the limit, and a base
    /// dropped before its delta is decoded would be read again, alone.
    pub(crate) fn put(&self, id: ObjectId, plain: Arc<Vec<u8>>) {
        let mut held = self.inner.lock().expect("base cache lock");
        held.bytes += plain.len();
        match held.by_id.insert(id, plain) {
            Some(old) => held.bytes -= old.len(),
            None => held.order.push_back(id),
        }
        let mut looked = 0;
        while held.bytes > HELD_BYTES && looked < EVICT_LOOKS.min(held.order.len()) {
            let Some(old) = held.order.pop_front() else { break };
            looked += 1;
            match held.by_id.get(&old) {
                Some(p) if Arc::strong_count(p) > 1 => held.order.push_back(old),
                Some(_) => {
                    let p = held.by_id.remove(&old).expect("just found");
                    held.bytes -= p.len();
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bases_stay_past_the_limit_and_go_once_let_go() {
        let cache = BaseCache::default();
        let base = |i: u32| (ObjectId::of(&i.to_le_bytes()), Arc::new(vec![i as u8; 1 << 20]));
        // A reader holds the first 48 MiB of bases while 64 MiB more are put.
        let held: Vec<_> = (0..48).map(base).collect();
        for (id, plain) in &held {
            cache.put(*id, plain.clone());
        }
        for i in 48..112 {
            let (id, plain) = base(i);
            cache.put(id, plain);
        }
        assert!(held.iter().all(|(id, _)| cache.get(id).is_some()), "a held base was dropped");
        // Bases nobody holds went, oldest first, down to the limit with the held ones.
        assert!(cache.get(&base(48).0).is_none() && cache.get(&base(111).0).is_some());
        // Let go, the held ones go as the next bases come.
        drop(held);
        for i in 112..176 {
            let (id, plain) = base(i);
            cache.put(id, plain);
        }
        assert!(cache.get(&base(0).0).is_none() && cache.get(&base(175).0).is_some());
        assert!(cache.inner.lock().unwrap().bytes <= HELD_BYTES);
    }
}
