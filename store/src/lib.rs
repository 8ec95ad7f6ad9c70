//! gstore's content-addressed store.
//!
//! Data is cut into content-defined chunks (FastCDC v2020), named by BLAKE3, compressed per
//! chunk (zstd, or raw when that saves too little, or a zero marker) and appended into pack
//! objects with a checksummed footer. Images are manifests (content-addressed, ordered
//! entries with chunk lists) and tags point at them. Packs, manifests and tags live in an
//! `object_store` backend and are the truth; a local RocksDB index says where each chunk is
//! and can be rebuilt from the pack footers. docs/FORMAT.md gives the byte layouts.

pub mod backend;
pub use gstore_format::codec;
pub mod commands;
pub mod crypto;
pub mod dedup;
pub mod environment;
mod error;
pub mod format;
mod memory;
pub mod progress;
pub mod repo;
pub mod units;

pub use error::{format_kind, ErrorKind, ObjectKind, Result, StoreError};
pub use format::config::{StoreConfig, FORMAT_VERSION};
pub use format::id::{ChunkIds, ObjectId};
pub use format::tag::TagRef;
pub use gstore_format::FormatError;
pub use repo::bases::{BaseReader, HeldBases};
pub use repo::indexed::IndexedStore;
pub use repo::location::StoreLocation;
pub use repo::store::Store;
