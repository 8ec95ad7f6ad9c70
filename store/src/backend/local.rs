//! A store in a directory on local disk: objects are files under their keys, written through
//! `object_store`'s file store (fsynced, published by rename), read in ranges straight from
//! the files (mapped, or `pread` into the caller's buffer), with compare-and-swap under a lock
//! file, since a file system has no If-Match.

use super::objects::ObjectStoreObjects;
use super::{ListEntry, Objects, Put, Version};
use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use crate::ObjectKind;
use bytes::Bytes;
use object_store::{ObjectStore, PutPayload};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File in a local store's directory that serializes compare-and-swap writes between processes.
pub const CAS_LOCK_FILE: &str = "cas.lock";

/// Mapping offsets must be multiples of the page size.
const PAGE: u64 = 4096;

/// A directory on local disk as gstore's backend.
pub(super) struct LocalDir {
    /// Writes fsynced before they are published.
    durable: ObjectStoreObjects,
    /// The same directory without fsync, for objects that need not survive a crash.
    volatile: ObjectStoreObjects,
    root: PathBuf,
    cas_lock: PathBuf,
}

impl LocalDir {
    /// The file store that holds the directory's objects.
    pub(super) fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.durable.store()
    }

    /// The store in `root`, which must exist (`Store::init` makes it).
    pub(super) fn open(root: &Path) -> Result<LocalDir> {
        // Only `init` makes a store's directory: any other command names a missing one as
        // missing, instead of leaving an empty directory behind.
        match std::fs::metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(StoreError::Path { path: root.to_path_buf(), why: "not a directory".into() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotInitialized(root.display().to_string()))
            }
            Err(e) => return Err(StoreError::io("opening store directory", root, e)),
        }
        let open = |fsync: bool| {
            object_store::local::LocalFileSystem::new_with_prefix(root)
                .map(|fs| ObjectStoreObjects::new(Arc::new(fs.with_fsync(fsync).with_automatic_cleanup(true))))
                .map_err(|e| StoreError::Backend {
                    action: "opening",
                    key: root.display().to_string(),
                    message: e.to_string(),
                })
        };
        Ok(LocalDir {
            durable: open(true)?,
            volatile: open(false)?,
            root: root.to_path_buf(),
            cas_lock: root.join(CAS_LOCK_FILE),
        })
    }

    /// Compare-and-swap: compares the version and writes while holding the CAS lock file,
    /// which every gstore process writing this directory takes for the same purpose.
    fn put_if_unchanged(&self, key: &ObjectKey, bytes: PutPayload, expected: &Version) -> Result<()> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.cas_lock)
            .map_err(|e| StoreError::io("opening", &self.cas_lock, e))?;
        file.lock().map_err(|e| StoreError::io("locking", &self.cas_lock, e))?;
        if self.durable.e_tag(key)? != Some(expected.0.e_tag.clone()) {
            return Err(StoreError::lost_race(key));
        }
        self.durable.put(key, bytes, Put::Replace)
    }

    /// The object's file, open, and its size; `NotFound` when it does not exist.
    fn open_file(&self, key: &ObjectKey) -> Result<(File, PathBuf, u64)> {
        let path = self.root.join(key.to_string());
        let file = match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound { what: ObjectKind::Object, key: key.to_string() })
            }
            other => other.map_err(|e| StoreError::io("opening", &path, e))?,
        };
        let size = file.metadata().map_err(|e| StoreError::io("checking", &path, e))?.len();
        Ok((file, path, size))
    }
}

/// A read past the end of an object.
fn truncated(key: &ObjectKey, size: u64, needed: u64) -> StoreError {
    StoreError::corrupt(
        ObjectKind::Object,
        key.to_string(),
        format!("{size} bytes long but bytes up to {needed} are needed: truncated"),
    )
}

impl Objects for LocalDir {
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()> {
        match mode {
            Put::ReplaceVolatile => self.volatile.put(key, bytes, Put::Replace),
            Put::Update(v) => self.put_if_unchanged(key, bytes, v),
            Put::Replace | Put::Create => self.durable.put(key, bytes, mode),
        }
    }

    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        self.durable.get(key)
    }

    /// Maps the range (pre-faulted): a view of the page cache, not a copy, living as long as
    /// the returned bytes. Objects are never changed in place (a write publishes a new file),
    /// so a mapping never sees a file shrink under it.
    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        let (file, path, size) = self.open_file(key)?;
        if size < range.end {
            return Err(truncated(key, size, range.end));
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let start = range.start - range.start % PAGE;
        // SAFETY: objects are immutable once published; nothing writes to a mapped file.
        let map = unsafe {
            memmap2::MmapOptions::new().offset(start).len((range.end - start) as usize).populate().map(&file)
        }
        .map_err(|e| StoreError::io("mapping", &path, e))?;
        Ok(Bytes::from_owner(map).slice((range.start - start) as usize..))
    }

    /// `pread`s straight into `out` (e.g. pinned memory a GPU copies from): one copy from the
    /// page cache, and no mapping, whose setup and teardown serialise threads on the
    /// process's address space.
    fn get_range_into(&self, key: &ObjectKey, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        let (file, path, size) = self.open_file(key)?;
        if size < range.end {
            return Err(truncated(key, size, range.end));
        }
        file.read_exact_at(out, range.start).map_err(|e| StoreError::io("reading", &path, e))
    }

    /// `posix_fadvise(WILLNEED)`: the kernel starts reading the range into the page cache and
    /// returns; cached pages cost a lookup. Failures are ignored (a hint).
    fn will_read(&self, key: &ObjectKey, range: Range<u64>) {
        use std::os::fd::AsRawFd;
        if let Ok((file, _, _)) = self.open_file(key) {
            let (start, len) = (range.start as libc::off_t, (range.end - range.start) as libc::off_t);
            // SAFETY: a file descriptor this function owns, open for the call.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), start, len, libc::POSIX_FADV_WILLNEED) };
        }
    }

    fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        self.durable.size(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        self.durable.list(prefix)
    }

    fn delete(&self, key: &ObjectKey) -> Result<()> {
        self.durable.delete(key)
    }
}
