//! The plain bytes of delta bases a store handle read lately: a restore of an image whose
//! chunks are deltas against the same few bases reads each base once.

use crate::id::ObjectId;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Plain bytes of bases held at most (oldest dropped first).
const HELD_BYTES: usize = 64 << 20;

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

    /// Holds base `id`, dropping the oldest bases past the limit.
    pub(crate) fn put(&self, id: ObjectId, plain: Arc<Vec<u8>>) {
        let mut held = self.inner.lock().expect("base cache lock");
        held.bytes += plain.len();
        match held.by_id.insert(id, plain) {
            Some(old) => held.bytes -= old.len(),
            None => held.order.push_back(id),
        }
        while held.bytes > HELD_BYTES {
            let Some(old) = held.order.pop_front() else { break };
            if let Some(p) = held.by_id.remove(&old) {
                held.bytes -= p.len();
            }
        }
    }
}
