//! gstore's byte layouts (docs/FORMAT.md), encode and decode only: object ids and keys, the
//! store's configuration, manifests, packs, tags, leases, restore profiles and damage records,
//! the versioned JSON records' one decoder, the per-chunk codecs, the content-defined chunker
//! and resemblance sketches. No backend, no store handle, no I/O beyond slices: the reference
//! reader FORMAT.md names. The store (`gstore-store`) reads and writes these objects.

pub mod chunker;
pub mod codec;
pub mod config;
pub mod damage;
mod error;
pub mod id;
pub mod key;
pub mod lease;
pub mod manifest;
pub mod meta;
pub mod pack;
pub mod profile;
pub mod record;
pub mod similar;
pub mod tag;

pub use config::{StoreConfig, FORMAT_VERSION};
pub use error::{FormatError, ObjectKind, Result};
pub use id::{ChunkIds, ObjectId};
pub use tag::TagRef;

/// Seconds since the Unix epoch (the times objects record).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
