//! What the store holds, object by object (docs/FORMAT.md): the configuration, ids, object keys,
//! manifests, packs, tags, leases, restore profiles and damage records, and the versioned JSON
//! records' one decoder.

pub(crate) mod config;
pub mod damage;
pub(crate) mod id;
pub mod key;
pub mod lease;
pub mod manifest;
pub mod meta;
pub mod pack;
pub mod profile;
pub mod record;
pub mod tag;

/// Seconds since the Unix epoch (the times objects record).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
