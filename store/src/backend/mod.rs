//! The object backend: one small trait, [`Objects`] (get / get_range / put with a condition /
//! delete / list / size), with one module per implementation — [`local`] (a directory on
//! local disk), [`objects`] (any `object_store`: S3 through [`s3`], or one the caller builds,
//! [`Backend::from_object_store`]) and [`http`] (a gstore chunk server), wrappers ([`sealed`]
//! for encrypted stores, [`retry`], [`tiered`]) — and [`Backend`], the blocking facade every
//! store uses, which counts requests and turns a retried conditional write that had landed
//! into the success it was, and knows what it was opened on (a directory, an `object_store`, a
//! server) without asking through the wrappers. Every implementation runs on one shared tokio
//! runtime.
//! Keys are built and parsed by [`crate::format::key`] alone.

pub(crate) mod http_client;

mod http;
mod local;
mod objects;
mod retry;
mod s3;
mod sealed;
mod tiered;

use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use crate::ObjectKind;
use bytes::Bytes;
use object_store::{ObjectStore, PutPayload};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub use local::CAS_LOCK_FILE;
pub use retry::Patience;
pub use tiered::tiers_from_env;

/// Part size of multipart uploads (S3 requires at least 5 MiB but the last).
pub const MULTIPART_PART: usize = 8 << 20;
/// Objects larger than this are uploaded in parts. Default packs (48 MiB) go in one PUT:
/// against s3s-fs on loopback, multipart made pushes 1.6x slower (the server joins the parts).
pub const MULTIPART_ABOVE: u64 = 64 << 20;

/// The version of an object as read, for compare-and-swap writes.
#[derive(Debug, Clone)]
pub struct Version(object_store::UpdateVersion);

impl Version {
    /// The version an object had when it carried this entity tag (as a client sends it in
    /// `If-Match`), for a compare-and-swap on its behalf.
    pub fn from_e_tag(e_tag: String) -> Version {
        Version(object_store::UpdateVersion { e_tag: Some(e_tag), version: None })
    }
}

/// One listed object as it lies in the backend (and as the chunk server lists it: a JSON
/// object with these fields), its key not yet read.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ListEntry {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in seconds since the Unix epoch (0: not said).
    #[serde(default)]
    pub modified: u64,
}

impl ListEntry {
    /// The entry of an object as `object_store` lists it.
    pub fn of(m: &object_store::ObjectMeta) -> ListEntry {
        ListEntry { key: m.location.to_string(), size: m.size, modified: m.last_modified.timestamp().max(0) as u64 }
    }
}

/// One listed object of the store.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its key.
    pub key: ObjectKey,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in seconds since the Unix epoch (0: the backend did not say).
    pub modified: u64,
}

/// How a write treats an object already under its key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Put<'a> {
    /// Replace it; durable when the write returns.
    Replace,
    /// Replace it, without fsync where the backend has that choice: for objects that need not
    /// survive a crash of this machine (a lease dies with its holder).
    ReplaceVolatile,
    /// Write only if no object is there ([`StoreError::AlreadyExists`] otherwise).
    Create,
    /// Write only if the object is still at this version (a lost race otherwise).
    Update(&'a Version),
}

/// What a store keeps its objects in. Blocking; implementations run their requests on
/// [`runtime`]. A missing object is `None` (reads) or not an error (delete).
pub(crate) trait Objects: Send + Sync {
    /// Writes an object (its bytes given in pieces, one after the other) under `mode`'s
    /// condition.
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()>;
    /// Replaces a large object, in parts where the backend uploads parts concurrently.
    fn put_large(&self, key: &ObjectKey, bytes: PutPayload) -> Result<()> {
        self.put(key, bytes, Put::Replace)
    }
    /// Reads a whole object with its version.
    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>>;
    /// Reads a byte range of an object; fewer bytes than asked for is an error.
    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes>;
    /// Reads a byte range of an object into `out`, which has exactly the range's length.
    fn get_range_into(&self, key: &ObjectKey, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(&self.get_range(key, range)?);
        Ok(())
    }
    /// Says that a byte range of `key` will be read soon. A hint: a local store asks the
    /// kernel to read it into the page cache ahead, so that reads of a cold disk overlap;
    /// other backends (the default) do nothing.
    fn will_read(&self, _key: &ObjectKey, _range: Range<u64>) {}
    /// The size of an object.
    fn size(&self, key: &ObjectKey) -> Result<Option<u64>>;
    /// Every object under `prefix`.
    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>>;
    /// Deletes an object.
    fn delete(&self, key: &ObjectKey) -> Result<()>;
}

/// The tokio runtime every backend runs its requests on (two workers: the requests are
/// I/O-bound, and the callers' own threads block on them).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gstore-io")
            .enable_all()
            .build()
            .expect("tokio runtime starts")
    })
}

/// What a backend keeps its objects in, as it was opened; the wrappers around it (retries,
/// tiers, sealing) leave it as it is.
#[derive(Clone)]
enum Origin {
    /// A directory on this machine, whose file store is `objects`.
    Local { root: PathBuf, objects: Arc<dyn ObjectStore> },
    /// An `object_store`: a bucket, or one the caller built.
    Objects(Arc<dyn ObjectStore>),
    /// A gstore server.
    Server(Arc<http::HttpObjects>),
}

/// A blocking handle on an object store. Cheap to clone (clones share the store and the
/// request count); safe to use from many threads.
#[derive(Clone)]
pub struct Backend {
    objects: Arc<dyn Objects>,
    /// The store itself, where `objects` reads packs through caching tiers first
    /// ([`Backend::past_tiers`]).
    past_tiers: Option<Arc<dyn Objects>>,
    /// The caching tiers pack reads go through first, if any.
    tiers: Option<Arc<tiered::Tiered>>,
    description: String,
    origin: Origin,
    requests: Arc<AtomicU64>,
}

impl Backend {
    /// A directory on local disk; writes are fsynced and published atomically (rename).
    pub fn local(root: &Path) -> Result<Backend> {
        let dir = local::LocalDir::open(root)?;
        let origin = Origin::Local { root: root.to_path_buf(), objects: dir.object_store() };
        Ok(Self::wrap(Arc::new(dir), root.display().to_string(), origin))
    }

    /// An S3-compatible bucket, optionally under a key prefix. Endpoint, region, credentials
    /// and `AWS_ALLOW_HTTP` come from the usual `AWS_*` environment variables or the S3
    /// config file (`$GSTORE_S3_CONFIG`, else `~/.config/gstore/s3.env`); requests use
    /// path-style addressing unless `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`; the region
    /// defaults to us-east-1. Failed requests are retried briefly, so an unreachable
    /// endpoint fails within seconds; once the bucket has answered, requests failing in transit
    /// are retried for up to [`Patience::retry_for`].
    pub fn s3(bucket: &str, prefix: &str) -> Result<Backend> {
        let patience = Patience::from_env()?;
        let bucket_objects = s3::open(bucket, prefix, patience)?;
        let origin = Origin::Objects(bucket_objects.store());
        let objects = retry::Retrying::new(Arc::new(bucket_objects), patience);
        Ok(Self::wrap(Arc::new(objects), format!("s3://{bucket}/{prefix}"), origin))
    }

    /// Any `object_store` the caller builds (another cloud, an in-memory store, a wrapper of
    /// its own), described as `description` in messages. Open it with
    /// [`crate::Store::open_backend`] and a [`crate::StoreLocation::Custom`] naming where this
    /// machine keeps its index.
    pub fn from_object_store(store: Arc<dyn ObjectStore>, description: impl Into<String>) -> Backend {
        let origin = Origin::Objects(store.clone());
        Self::wrap(Arc::new(objects::ObjectStoreObjects::new(store)), description.into(), origin)
    }

    /// An in-memory store, for unit tests.
    #[cfg(test)]
    pub(crate) fn memory() -> Backend {
        Self::from_object_store(Arc::new(object_store::memory::InMemory::new()), "memory")
    }

    /// A gstore HTTP chunk server at `url` (`http://host:port`); the token comes from
    /// `GSTORE_TOKEN`. Retries as for [`Backend::s3`].
    pub fn http(url: &str) -> Result<Backend> {
        let patience = Patience::from_env()?;
        let server = Arc::new(http::HttpObjects::new(url, patience)?);
        let objects = retry::Retrying::new(server.clone(), patience);
        Ok(Self::wrap(Arc::new(objects), url.to_string(), Origin::Server(server)))
    }

    /// This store with its pack reads going first through the caching tiers at `urls`
    /// (`gstore serve --cache`), nearest first, and to this store when none answers; every
    /// other request goes to this store. No tiers: the store as it is.
    pub fn through_tiers(self, urls: &[String]) -> Result<Backend> {
        if urls.is_empty() {
            return Ok(self);
        }
        let store = self.objects.clone();
        let tiered = Arc::new(tiered::Tiered::new(store.clone(), urls, Patience::from_env()?)?);
        let description = format!("{} (through {})", self.description, urls.join(", "));
        Ok(Backend { objects: tiered.clone(), past_tiers: Some(store), tiers: Some(tiered), description, ..self })
    }

    fn wrap(objects: Arc<dyn Objects>, description: String, origin: Origin) -> Backend {
        Backend { objects, past_tiers: None, tiers: None, description, origin, requests: Arc::default() }
    }

    /// This backend as an encrypted store sees it: objects that hold data sealed with
    /// `sealer` on the way in and opened on the way out (docs/FORMAT.md, "Encrypted stores").
    pub fn sealed(&self, sealer: crate::crypto::sealed::Sealer) -> Backend {
        // Every pack read is opened with the store's key, block by block: bytes a tier changed
        // fail to open (and are read again past it, [`Backend::distrust`]).
        let objects = Arc::new(sealed::SealedObjects::new(self.objects.clone(), sealer, self.local_root().is_some()));
        Backend { objects, past_tiers: None, ..self.clone() }
    }

    /// The store itself, past the caching tiers this backend reads packs through first
    /// ([`Backend::through_tiers`]): where to read what a tier served that its pack's name did
    /// not cover ([`crate::repo::packs::read_tail`]). `None` when no tier is named, or when
    /// every pack read is opened with an encrypted store's key ([`Backend::sealed`]).
    pub fn past_tiers(&self) -> Option<Backend> {
        let objects = self.past_tiers.clone()?;
        Some(Backend { objects, past_tiers: None, tiers: None, ..self.clone() })
    }

    /// Requests sent so far through this backend and its clones.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Counts a request.
    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The `object_store` this backend reads and writes (for serving it over HTTP); `None` for
    /// an HTTP backend.
    pub fn object_store(&self) -> Option<Arc<dyn ObjectStore>> {
        match &self.origin {
            Origin::Local { objects, .. } | Origin::Objects(objects) => Some(objects.clone()),
            Origin::Server(_) => None,
        }
    }

    /// The directory of a local store, where an object's key is its path (`None` for other
    /// backends).
    pub fn local_root(&self) -> Option<&Path> {
        match &self.origin {
            Origin::Local { root, .. } => Some(root),
            Origin::Objects(_) | Origin::Server(_) => None,
        }
    }

    /// Fails when this client may not write tags named `name` (a server token limited to other
    /// tags): asked before a push or copy uploads anything, so a refused tag costs no upload.
    pub fn check_tag_write(&self, name: &str) -> Result<()> {
        match &self.origin {
            Origin::Server(server) => {
                self.count();
                server.check_tag_write(name)
            }
            // Whoever may write a directory or a bucket may write any tag.
            Origin::Local { .. } | Origin::Objects(_) => Ok(()),
        }
    }

    /// Says that bytes just read of `key` failed their check; true when reading `key` again
    /// may give other bytes (they came through a caching tier, which `key` now goes past).
    pub fn distrust(&self, key: &ObjectKey) -> bool {
        self.tiers.as_ref().is_some_and(|t| t.distrust(key))
    }

    /// Where this backend points, for messages.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Writes an object (in one piece, or in pieces written one after the other), replacing
    /// any existing one.
    pub fn put(&self, key: &ObjectKey, bytes: impl Into<PutPayload>) -> Result<()> {
        self.count();
        self.objects.put(key, bytes.into(), Put::Replace)
    }

    /// Writes an object that need not survive a crash of this machine (a lease: its holder
    /// dies with the machine), replacing any existing one: like [`Backend::put`], but without
    /// fsync on a local store. Readers still see the old or the new object whole.
    pub fn put_volatile(&self, key: &ObjectKey, bytes: Vec<u8>) -> Result<()> {
        self.count();
        self.objects.put(key, bytes.into(), Put::ReplaceVolatile)
    }

    /// Writes a large object in parts uploaded concurrently (S3 multipart upload), for
    /// remote backends; a failed upload is aborted and leaves no object.
    pub fn put_multipart(&self, key: &ObjectKey, bytes: impl Into<PutPayload>) -> Result<()> {
        self.count();
        self.objects.put_large(key, bytes.into())
    }

    /// Writes an object only if none exists under `key` ([`StoreError::AlreadyExists`] otherwise).
    pub fn put_new(&self, key: &ObjectKey, bytes: Vec<u8>) -> Result<()> {
        self.count();
        self.objects.put(key, bytes.into(), Put::Create)
    }

    /// [`Backend::put_new`] for a record no other writer could produce byte for byte (a lease
    /// under a random key, a gc lock with a nonce): an object already there with exactly these
    /// bytes is this writer's own, met by a retry of a request whose answer was lost after it
    /// landed (the HTTP client and the S3 client both retry), and counts as written.
    pub fn create_record(&self, key: &ObjectKey, bytes: Vec<u8>) -> Result<()> {
        match self.put_new(key, bytes.clone()) {
            Err(StoreError::AlreadyExists { what, key: k }) => match self.get_opt(key)? {
                Some(found) if found[..] == bytes[..] => Ok(()),
                _ => Err(StoreError::AlreadyExists { what, key: k }),
            },
            other => other,
        }
    }

    /// Reads a whole object with the version a later [`Backend::put_if`] can require, or
    /// `None` if it does not exist.
    pub fn get_versioned(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        self.count();
        self.objects.get(key)
    }

    /// Writes an object only if it is still at `expected` (or, with `None`, does not exist
    /// yet): compare-and-swap through the server's If-Match / If-None-Match. A lost race is
    /// [`StoreError::Conflict`]. On a local directory store, which has no If-Match, the
    /// version is compared and the object written under an exclusive lock on
    /// `STORE/cas.lock`, which every gstore process on the machine takes for the same purpose.
    ///
    /// A conflict whose object now holds exactly `bytes` is this writer's own write, met by a
    /// retry of a request whose answer was lost after it landed: it counts as written (had
    /// another writer put the same bytes, the object holds what this writer wanted anyway).
    pub fn put_if(&self, key: &ObjectKey, bytes: Vec<u8>, expected: Option<&Version>) -> Result<()> {
        self.count();
        let mode = match expected {
            None => Put::Create,
            Some(v) => Put::Update(v),
        };
        let lost = match self.objects.put(key, bytes.clone().into(), mode) {
            Err(StoreError::AlreadyExists { .. }) => StoreError::lost_race(key),
            Err(e @ StoreError::Conflict(_)) => e,
            other => return other,
        };
        match self.get_opt(key)? {
            Some(found) if found[..] == bytes[..] => Ok(()),
            _ => Err(lost),
        }
    }

    /// Changes the object under `key` by compare-and-swap ([`Backend::put_if`]): `change` is
    /// given its current bytes (`None` while it does not exist) and returns the new bytes, or
    /// `None` to leave it as it is. A write that loses a race to another writer reads the
    /// object again and asks `change` again, up to 16 times.
    pub fn update(
        &self,
        key: &ObjectKey,
        mut change: impl FnMut(Option<&Bytes>) -> Result<Option<Vec<u8>>>,
    ) -> Result<()> {
        for _ in 0..16 {
            let current = self.get_versioned(key)?;
            let Some(bytes) = change(current.as_ref().map(|(b, _)| b))? else { return Ok(()) };
            match self.put_if(key, bytes, current.as_ref().map(|(_, v)| v)) {
                Err(StoreError::Conflict(_)) => continue,
                other => return other,
            }
        }
        Err(StoreError::lost_race(key))
    }

    /// Writes an object only if it is still at `expected`: the bare compare-and-swap, for a
    /// server passing a client's If-Match through. Unlike [`Backend::put_if`] a lost race is
    /// always [`StoreError::Conflict`], even when the object holds these bytes already: the
    /// client, not the server, decides whether that was its own earlier write.
    pub fn put_if_unchanged(&self, key: &ObjectKey, bytes: Vec<u8>, expected: &Version) -> Result<()> {
        self.count();
        self.objects.put(key, bytes.into(), Put::Update(expected))
    }

    /// Reads a whole object.
    pub fn get(&self, key: &ObjectKey) -> Result<Bytes> {
        self.get_opt(key)?.ok_or_else(|| StoreError::NotFound { what: ObjectKind::Object, key: key.to_string() })
    }

    /// Reads a whole object, or `None` if it does not exist.
    pub fn get_opt(&self, key: &ObjectKey) -> Result<Option<Bytes>> {
        self.count();
        Ok(self.objects.get(key)?.map(|(bytes, _)| bytes))
    }

    /// Reads a byte range of an object (a local store maps it: a view of the page cache, not
    /// a copy).
    pub fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        self.count();
        let b = self.objects.get_range(key, range.clone())?;
        if b.len() as u64 != range.end - range.start {
            return Err(short_range(key, &range, b.len()));
        }
        Ok(b)
    }

    /// Reads a byte range of an object into `out` (exactly the range's length): a local store
    /// `pread`s straight into it.
    pub fn get_range_into(&self, key: &ObjectKey, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        let want = (range.end - range.start) as usize;
        if out.len() != want {
            return Err(StoreError::Internal(format!("a {want}-byte range read into a {}-byte buffer", out.len())));
        }
        self.count();
        self.objects.get_range_into(key, range, out)
    }

    /// Says that a byte range of `key` will be read soon (see [`Objects::will_read`]).
    pub fn will_read(&self, key: &ObjectKey, range: Range<u64>) {
        self.objects.will_read(key, range)
    }

    /// The size of an object, or `None` if it does not exist.
    pub fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        self.count();
        self.objects.size(key)
    }

    /// Lists every object under `prefix` (a [`crate::format::key::Family`]'s prefix, or a
    /// longer one). What is there under a key no store object has (a temporary file, an object
    /// of something else) is left out.
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.count();
        let listed = self.objects.list(prefix)?.into_iter();
        Ok(listed
            .filter_map(|e| Some(Listed { key: ObjectKey::parse(&e.key).ok()?, size: e.size, modified: e.modified }))
            .collect())
    }

    /// Deletes an object; deleting a missing object is not an error.
    pub fn delete(&self, key: &ObjectKey) -> Result<()> {
        self.count();
        self.objects.delete(key)
    }
}

/// A range read that returned fewer bytes than asked for.
pub(crate) fn short_range(key: &ObjectKey, range: &Range<u64>, got: usize) -> StoreError {
    StoreError::corrupt(ObjectKind::Object, key.to_string(), format!("range {range:?} returned {got} bytes: truncated"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ObjectId, TagRef};

    fn tag_key() -> ObjectKey {
        ObjectKey::Tag(TagRef::parse("t:v").unwrap())
    }

    #[test]
    fn local_compare_and_swap_refuses_a_stale_version() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::local(dir.path()).unwrap();
        b.put_if(&tag_key(), b"1".to_vec(), None).unwrap();
        let (_, v1) = b.get_versioned(&tag_key()).unwrap().unwrap();
        // Another process (here: another handle) moves it; the stale version loses.
        let other = Backend::local(dir.path()).unwrap();
        other.put_if(&tag_key(), b"2".to_vec(), Some(&v1)).unwrap();
        assert!(matches!(b.put_if(&tag_key(), b"3".to_vec(), Some(&v1)), Err(StoreError::Conflict(_))));
        assert_eq!(&b.get(&tag_key()).unwrap()[..], b"2");
        let (_, v2) = b.get_versioned(&tag_key()).unwrap().unwrap();
        b.put_if(&tag_key(), b"3".to_vec(), Some(&v2)).unwrap();
        assert_eq!(&b.get(&tag_key()).unwrap()[..], b"3");
        assert!(matches!(b.put_if(&tag_key(), b"4".to_vec(), None), Err(StoreError::Conflict(_))));
    }

    #[test]
    fn local_ranges_are_read_mapped_and_into_buffers_alike() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::local(dir.path()).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        b.put(&ObjectKey::Pack(ObjectId::of(b"x")), data.clone()).unwrap();
        assert_eq!(&b.get_range(&ObjectKey::Pack(ObjectId::of(b"x")), 4097..9000).unwrap()[..], &data[4097..9000]);
        let mut out = vec![0; 100];
        b.get_range_into(&ObjectKey::Pack(ObjectId::of(b"x")), 5..105, &mut out).unwrap();
        assert_eq!(out, data[5..105]);
        let short = b.get_range(&ObjectKey::Pack(ObjectId::of(b"x")), 9000..10_001).unwrap_err().to_string();
        assert!(short.contains("truncated"), "{short}");
        let short =
            b.get_range_into(&ObjectKey::Pack(ObjectId::of(b"x")), 9901..10_001, &mut out).unwrap_err().to_string();
        assert!(short.contains("truncated"), "{short}");
        assert!(matches!(b.get_range(&ObjectKey::Pack(ObjectId::of(b"none")), 0..1), Err(StoreError::NotFound { .. })));
        assert!(matches!(
            b.get_range_into(&ObjectKey::Pack(ObjectId::of(b"none")), 0..100, &mut out),
            Err(StoreError::NotFound { .. })
        ));
        assert!(b.get_range(&ObjectKey::Pack(ObjectId::of(b"x")), 3..3).unwrap().is_empty());
    }

    #[test]
    fn memory_round_trip_and_create_only() {
        let b = Backend::memory();
        b.put_new(&ObjectKey::Probe("b".into()), b"one".to_vec()).unwrap();
        assert!(matches!(
            b.put_new(&ObjectKey::Probe("b".into()), b"two".to_vec()),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert_eq!(&b.get(&ObjectKey::Probe("b".into())).unwrap()[..], b"one");
        assert_eq!(&b.get_range(&ObjectKey::Probe("b".into()), 1..3).unwrap()[..], b"ne");
        assert_eq!(b.size(&ObjectKey::Probe("b".into())).unwrap(), Some(3));
        assert!(b.get_opt(&ObjectKey::Probe("nope".into())).unwrap().is_none());
        assert!(matches!(b.get(&ObjectKey::Probe("nope".into())), Err(StoreError::NotFound { .. })));
        assert_eq!(b.list("probe/").unwrap().len(), 1);
        b.delete(&ObjectKey::Probe("b".into())).unwrap();
        b.delete(&ObjectKey::Probe("b".into())).unwrap();
        assert!(b.size(&ObjectKey::Probe("b".into())).unwrap().is_none());
    }

    #[test]
    fn a_create_that_finds_its_own_bytes_counts_as_written() {
        let b = Backend::memory();
        b.create_record(&ObjectKey::Lease("x".into()), b"mine".to_vec()).unwrap();
        b.create_record(&ObjectKey::Lease("x".into()), b"mine".to_vec()).unwrap();
        assert!(matches!(
            b.create_record(&ObjectKey::Lease("x".into()), b"other".to_vec()),
            Err(StoreError::AlreadyExists { .. })
        ));
        b.put_if(&tag_key(), b"v1".to_vec(), None).unwrap();
        b.put_if(&tag_key(), b"v1".to_vec(), None).unwrap();
        assert!(matches!(b.put_if(&tag_key(), b"v2".to_vec(), None), Err(StoreError::Conflict(_))));
    }
}
