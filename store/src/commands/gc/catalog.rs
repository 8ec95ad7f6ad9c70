//! gc's reads of immutable objects — pack footers and manifests — cached on this machine for
//! remote stores, so that a later gc reads only what is new (footers and manifests never
//! change under their ids). Cached bytes are checked again on every use.

use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::manifest::{Manifest, References};
use crate::format::pack::{self, PackEntry, TRAILER_LEN};
use crate::repo::store::Store;
use crate::ObjectKind;
use bytes::Bytes;
use std::path::PathBuf;

/// Cached reads for one gc run.
pub struct Catalog<'a> {
    store: &'a Store,
    /// Cache directory; `None` for local stores (reading the store is as cheap).
    dir: Option<PathBuf>,
}

impl<'a> Catalog<'a> {
    /// A catalog for `store`.
    pub fn new(store: &'a Store) -> Catalog<'a> {
        let dir = store.is_remote().then(|| store.gc_state_dir().join("cache"));
        Catalog { store, dir }
    }

    /// Where the cached copy of a pack's footer or a manifest lies (`footers/` or
    /// `manifests/`, then the id); `None` for other objects, or when nothing is cached.
    fn cached(&self, key: &ObjectKey) -> Option<PathBuf> {
        let (kind, id) = match key {
            ObjectKey::Pack(id) => ("footers", id),
            ObjectKey::Manifest(id) => ("manifests", id),
            _ => return None,
        };
        self.dir.as_ref().map(|d| d.join(kind).join(id.to_hex()))
    }

    /// Writes a cache file atomically (a crash leaves the old one or none).
    fn save(path: &std::path::Path, bytes: &[u8]) {
        let Some(parent) = path.parent() else { return };
        let tmp = path.with_extension("tmp");
        let _ = std::fs::create_dir_all(parent)
            .and_then(|_| std::fs::write(&tmp, bytes))
            .and_then(|_| std::fs::rename(&tmp, path));
    }

    /// A pack's chunk list, checked, from the cache or the pack's tail (`size` as listed).
    pub fn footer(&self, id: &ObjectId, size: u64) -> Result<Vec<PackEntry>> {
        let key = ObjectKey::Pack(*id);
        let cache = self.cached(&key);
        if let Some(tail) = cache.as_ref().and_then(|p| std::fs::read(p).ok()) {
            if let Ok(entries) = parse_tail(&tail, size, &key.to_string(), self.store.config().chunk_max) {
                return Ok(entries);
            }
        }
        let (entries, tail) = self.store.read_pack_tail(id, size)?;
        if let Some(p) = cache {
            Self::save(&p, &tail);
        }
        Ok(entries)
    }

    /// What a manifest references, checked against its id, from the cache or the store
    /// ([`Manifest::references`]).
    pub fn manifest_references(&self, id: &ObjectId) -> Result<References> {
        self.manifest_read(id, |bytes| Ok(Manifest::references(bytes, id)?))
    }

    /// When the image `id` names was made (its manifest's `created_unix`), if its manifest
    /// can be read: what retention dates images by.
    pub fn manifest_created(&self, id: &ObjectId) -> Option<u64> {
        self.manifest_read(id, |bytes| Ok(Manifest::decode_unchecked(bytes, id)?)).ok().map(|m| m.created_unix)
    }

    /// Reads a manifest through `parse` (which checks it against its id), from the cache or
    /// the store; what the store gave is cached once it parses.
    fn manifest_read<T>(&self, id: &ObjectId, parse: impl Fn(&[u8]) -> Result<T>) -> Result<T> {
        let cache = self.cached(&ObjectKey::Manifest(*id));
        if let Some(bytes) = cache.as_ref().and_then(|p| std::fs::read(p).ok()) {
            if let Ok(parsed) = parse(&bytes) {
                return Ok(parsed);
            }
        }
        let key = ObjectKey::Manifest(*id);
        let bytes: Bytes = match self.store.backend().get(&key) {
            Err(StoreError::NotFound { .. }) => {
                return Err(StoreError::NotFound { what: ObjectKind::Manifest, key: key.to_string() })
            }
            other => other?,
        };
        let parsed = parse(&bytes)?;
        if let Some(p) = cache {
            Self::save(&p, &bytes);
        }
        Ok(parsed)
    }

    /// Drops what is cached for an object gc deleted.
    pub fn forget(&self, key: &ObjectKey) {
        if let Some(p) = self.cached(key) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Parses a cached pack tail (footer then trailer) of a pack `size` bytes long, of a store
/// whose chunks are at most `chunk_max` bytes.
fn parse_tail(tail: &[u8], size: u64, key: &str, chunk_max: u32) -> Result<Vec<PackEntry>> {
    let bad = || StoreError::corrupt(ObjectKind::Pack, key, "cached footer does not fit");
    let split = tail.len().checked_sub(TRAILER_LEN).ok_or_else(bad)?;
    let t = pack::parse_trailer(&tail[split..], size, key)?;
    if size - t.footer_offset != tail.len() as u64 {
        return Err(bad());
    }
    Ok(pack::parse_footer(&tail[..split], &t, key, chunk_max)?)
}
