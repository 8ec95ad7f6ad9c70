//! The store handle and what it keeps on this machine: where the store is, the handle opened
//! with and without the local index, tags, the process lock, the range cache, the
//! delta-base cache and the tags seen of an encrypted store.

pub(crate) mod base_cache;
pub(crate) mod bases;
pub mod cache;
pub(crate) mod chunk_location;
pub mod damage;
pub mod index;
pub(crate) mod indexed;
pub mod leases;
pub(crate) mod location;
pub(crate) mod lock;
pub mod packs;
pub mod plans;
pub(crate) mod profiles;
pub(crate) mod seen;
#[cfg(feature = "simulation")]
pub(crate) mod simulation;
pub(crate) mod store;
pub(crate) mod tags;
