//! gstore's content-addressed store.
//!
//! Data is cut into content-defined chunks (FastCDC v2020), named by BLAKE3, compressed per
//! chunk (zstd, or raw when that saves too little, or a zero marker) and appended into pack
//! objects with a checksummed footer. Images are manifests (content-addressed, ordered
//! entries with chunk lists) and tags point at them. Packs, manifests and tags live in an
//! `object_store` backend and are the truth; a local RocksDB index says where each chunk is
//! and can be rebuilt from the pack footers. docs/FORMAT.md gives the byte layouts.

pub mod backend;
mod bases;
pub mod cache;
pub mod chunker;
pub mod codec;
pub mod compose;
mod config;
pub mod copy;
pub mod crypto;
pub mod damage;
mod deltas;
mod error;
mod floats;
pub mod gc;
mod http;
pub mod huffman;
mod id;
pub mod images;
pub mod index;
pub mod key;
pub mod lease;
mod lock;
pub mod manifest;
mod memory;
pub mod pack;
mod prefix_zstd;
pub mod profile;
pub mod progress;
pub mod push;
mod seen;
pub mod similar;
mod source;
mod store;
pub mod stream;
pub mod tag;
pub mod usage;
pub mod verify;

pub use config::{StoreConfig, FORMAT_VERSION};
pub use error::{Result, StoreError};
pub use id::{ChunkIds, ObjectId};
pub use store::{HeldBases, Store, StoreLocation};
pub use tag::TagRef;
