//! A store handle for a deterministic simulation (feature `simulation`, for tests only): pack
//! salts derived from a seed and a counter instead of fresh randomness, and requests made one
//! at a time, so that a seeded run writes the same packs in the same order every time.

use crate::format::pack::{self, PackIds};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a simulated store handle does differently.
pub(crate) struct Simulation {
    seed: u64,
    salts_made: AtomicU64,
}

impl Simulation {
    /// A simulation seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Simulation {
        Simulation { seed, salts_made: AtomicU64::new(0) }
    }

    /// A new, empty pack builder whose salt is the next one of the seed's.
    pub(crate) fn new_pack(&self, ids: PackIds) -> pack::PackBuilder {
        let n = self.salts_made.fetch_add(1, Ordering::Relaxed);
        let h = blake3::hash(&[self.seed.to_le_bytes(), n.to_le_bytes()].concat());
        let salt = h.as_bytes()[..pack::SALT_LEN].try_into().expect("16 bytes");
        pack::PackBuilder::with_salt(salt, ids)
    }
}
