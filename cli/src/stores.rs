//! Opening a store for a command, waiting (and saying so) while another process holds its
//! index.

use anyhow::Result;
use gstore_store::format::manifest::Manifest;
use gstore_store::{IndexedStore, ObjectId, Store, StoreLocation};

/// Opens the store at `location` with its index.
pub(crate) fn open_indexed(location: &StoreLocation) -> Result<IndexedStore> {
    Ok(Store::open_indexed(location, &|msg| eprintln!("gstore: {msg}"))?)
}

/// Opens the store at `location` with its index, for a command that only reads chunks
/// ([`Store::with_index_to_read`]: read-only when the index is up to date).
pub(crate) fn open_to_read(location: &StoreLocation) -> Result<IndexedStore> {
    Ok(Store::open(location)?.with_index_to_read(&|msg| eprintln!("gstore: {msg}"))?)
}

/// Opens the store with its index (as [`open_to_read`]) and reads the manifest `image` names (the two overlap).
pub(crate) fn open_image(location: &StoreLocation, image: &str) -> Result<(IndexedStore, ObjectId, Manifest)> {
    Ok(Store::open_image(location, image, &|msg| eprintln!("gstore: {msg}"))?)
}
