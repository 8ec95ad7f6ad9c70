//! The backend of an encrypted store: a wrapper that seals every object [`ObjectKey::is_sealed`]
//! names on its way in and opens it on its way out ([`crate::crypto::sealed`]), so that every
//! layer above reads and writes plain objects and every backend below holds only sealed ones.
//! Ranges are read by the blocks that hold them; each object's header is read once and kept.

use super::{ListEntry, Objects, Put, Version};
use crate::crypto::sealed::{self, Header, Sealer};
use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use crate::memory::KEPT;
use crate::ObjectKind;
use bytes::Bytes;
use object_store::PutPayload;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Headers kept at most; past it the map starts again (a pack's header costs one small read).
const HEADERS_KEPT: usize = 65_536;

/// Objects sealed on the way in and opened on the way out.
pub(crate) struct SealedObjects {
    inner: Arc<dyn Objects>,
    sealer: Sealer,
    /// `inner` is a local directory: sealed ranges are read into kept buffers.
    local: bool,
    headers: Mutex<HashMap<ObjectKey, Header>>,
}

/// Bytes a sealed object is written in at a time: a sealed 48 MiB pack handed to the local
/// backend in one piece was one `write(2)` of 48 MiB, which after a page-cache drop cost the
/// kernel three times the time of writing it 64 KiB at a time (2-core machine: 1.9-2.6 s
/// against 0.55-0.7 s of system time for a 1 GiB push), as unencrypted packs are written.
const WRITE_PART: usize = 64 << 10;

/// Sealed bytes as a payload of parts of [`WRITE_PART`] bytes (views, not copies).
fn in_parts(sealed: Bytes) -> PutPayload {
    (0..sealed.len()).step_by(WRITE_PART).map(|at| sealed.slice(at..(at + WRITE_PART).min(sealed.len()))).collect()
}

impl SealedObjects {
    pub(crate) fn new(inner: Arc<dyn Objects>, sealer: Sealer, local: bool) -> SealedObjects {
        SealedObjects { inner, sealer, local, headers: Mutex::default() }
    }

    fn forget(&self, key: &ObjectKey) {
        self.headers.lock().expect("header map lock").remove(key);
    }

    /// The header of sealed object `key`: kept, or read (`fresh`: read again).
    fn header(&self, key: &ObjectKey, fresh: bool) -> Result<Header> {
        if !fresh {
            if let Some(h) = self.headers.lock().expect("header map lock").get(key) {
                return Ok(*h);
            }
        }
        let h = Header::parse(&self.inner.get_range(key, 0..sealed::HEADER)?, &key.to_string())?;
        let mut map = self.headers.lock().expect("header map lock");
        if map.len() >= HEADERS_KEPT {
            map.clear();
        }
        map.insert(key.clone(), h);
        Ok(h)
    }

    /// Sealed bytes `span` of `key` read with `pread` into a kept buffer where the store is
    /// local, else as [`Objects::get_range`] gives them. For ranges opened into a caller's
    /// buffer, which need the sealed bytes only for that: mapping them saves a copy, but a
    /// mapping of bytes not yet in the page cache holds the process's address space while the
    /// disk reads, and unmapping waits for every such hold — the 16 threads reading delta
    /// bases beside a restore's own left its cores idle (a cold restore on two cores took
    /// 1.16-1.20x the unencrypted time, which reads bases with `pread`).
    fn read_sealed(&self, key: &ObjectKey, span: Range<u64>) -> Result<Bytes> {
        if !self.local {
            return self.inner.get_range(key, span);
        }
        KEPT.read((span.end - span.start) as usize, |sealed| self.inner.get_range_into(key, span, sealed))
    }

    /// Opens plain range `range` of sealed object `key` with `open` (given the header and the
    /// sealed bytes of the blocks holding the range, as `read` reads them: none for an empty
    /// range). A kept header that no longer fits (the object was replaced since) is read again
    /// once.
    fn open_range<T>(
        &self,
        key: &ObjectKey,
        range: Range<u64>,
        read: impl Fn(&ObjectKey, Range<u64>) -> Result<Bytes>,
        mut open: impl FnMut(&Header, &[u8]) -> Result<T>,
    ) -> Result<T> {
        let mut fresh = false;
        loop {
            let header = self.header(key, fresh)?;
            if range.end > header.plain_len {
                if !fresh {
                    fresh = true;
                    continue;
                }
                return Err(super::short_range(key, &range, header.plain_len.saturating_sub(range.start) as usize));
            }
            if range.is_empty() {
                return open(&header, &[]);
            }
            let (span, _) = header.sealed_range(&range);
            let bytes = read(key, span)?;
            match open(&header, &bytes) {
                Err(StoreError::Corrupt { .. }) if !fresh => fresh = true,
                other => return other,
            }
        }
    }
}

impl Objects for SealedObjects {
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()> {
        if !key.is_sealed() {
            return self.inner.put(key, bytes, mode);
        }
        self.forget(key);
        self.inner.put(key, in_parts(self.sealer.seal(&key.to_string(), bytes.as_ref())), mode)
    }

    fn put_large(&self, key: &ObjectKey, bytes: PutPayload) -> Result<()> {
        if !key.is_sealed() {
            return self.inner.put_large(key, bytes);
        }
        self.forget(key);
        self.inner.put_large(key, in_parts(self.sealer.seal(&key.to_string(), bytes.as_ref())))
    }

    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        match self.inner.get(key)? {
            Some((b, v)) if key.is_sealed() => Ok(Some((self.sealer.open(&key.to_string(), &b)?.into(), v))),
            other => Ok(other),
        }
    }

    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        if !key.is_sealed() {
            return self.inner.get_range(key, range);
        }
        let (r, name) = (range.clone(), key.to_string());
        self.open_range(
            key,
            range,
            |k, span| self.inner.get_range(k, span),
            |header, sealed| self.sealer.open_range_owned(&name, header, &r, sealed),
        )
    }

    fn get_range_into(&self, key: &ObjectKey, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        if !key.is_sealed() {
            return self.inner.get_range_into(key, range, out);
        }
        let (r, name) = (range.clone(), key.to_string());
        self.open_range(
            key,
            range,
            |k, span| self.read_sealed(k, span),
            |header, sealed| self.sealer.open_range(&name, header, &r, sealed, out),
        )
    }

    fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        match self.inner.size(key)? {
            Some(n) if key.is_sealed() => sealed::plain_len(n).map(Some).ok_or_else(|| {
                StoreError::corrupt(
                    ObjectKind::SealedObject,
                    key.to_string(),
                    format!("{n} bytes is no sealed object's length"),
                )
            }),
            other => Ok(other),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        let mut listed = self.inner.list(prefix)?;
        for l in listed.iter_mut().filter(|l| ObjectKey::parse(&l.key).is_ok_and(|k| k.is_sealed())) {
            // A length no sealed object has is reported as 0; reading the object says why.
            l.size = sealed::plain_len(l.size).unwrap_or(0);
        }
        Ok(listed)
    }

    fn delete(&self, key: &ObjectKey) -> Result<()> {
        self.forget(key);
        self.inner.delete(key)
    }
}
