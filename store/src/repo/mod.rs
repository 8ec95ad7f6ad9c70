//! The store handle and what it keeps on this machine: the local index, the process lock, the range
//! cache, the delta-base cache and the tags seen of an encrypted store.

pub(crate) mod bases;
pub mod cache;
pub mod index;
pub(crate) mod lock;
pub(crate) mod seen;
pub(crate) mod store;
