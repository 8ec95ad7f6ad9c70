//! The store handle and what it keeps on this machine: the local index, the process lock, the range cache, the delta-base cache, the tags seen of an encrypted store, and reused buffers.

pub(crate) mod bases;
pub mod cache;
pub mod index;
pub(crate) mod lock;
pub(crate) mod memory;
pub(crate) mod seen;
pub(crate) mod store;
