//! The object backend: a blocking facade over the `object_store` crate (keys are built and
//! parsed by [`crate::key`]).

use crate::error::{Result, StoreError};
use crate::http::HttpClient;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::sync::Arc;

/// File in a local store's directory that serializes compare-and-swap writes between processes.
pub const CAS_LOCK_FILE: &str = "cas.lock";

/// The version of an object as read, for compare-and-swap writes.
#[derive(Debug, Clone)]
pub struct Version(object_store::UpdateVersion);

/// Part size of multipart uploads (S3 requires at least 5 MiB but the last).
pub const MULTIPART_PART: usize = 8 << 20;
/// Objects larger than this are uploaded in parts. Default packs (48 MiB) go in one PUT:
/// against s3s-fs on loopback, multipart made pushes 1.6x slower (the server joins the parts).
pub const MULTIPART_ABOVE: u64 = 64 << 20;

/// One listed object.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Called before every request with the operation's name and key (see [`Backend::with_gate`]).
pub type Gate = Arc<dyn Fn(&'static str, &str) + Send + Sync>;

/// A blocking handle on an object store. Cheap to clone (clones share the store, the request
/// count and the gate); safe to use from many threads.
#[derive(Clone)]
pub struct Backend {
    inner: Inner,
    rt: Arc<tokio::runtime::Runtime>,
    description: String,
    requests: Arc<std::sync::atomic::AtomicU64>,
    gate: Option<Gate>,
    /// The same directory without fsync, for objects that need not survive a crash of the
    /// machine (local stores only).
    volatile: Option<Arc<dyn ObjectStore>>,
    /// Lock file that makes compare-and-swap atomic across processes on a local store.
    cas_lock: Option<std::path::PathBuf>,
    /// The directory of a local store.
    root: Option<std::path::PathBuf>,
}

/// What a backend talks to.
#[derive(Clone)]
enum Inner {
    /// An `object_store` implementation: local directory, S3, memory.
    Objects(Arc<dyn ObjectStore>),
    /// A gstore HTTP chunk server.
    Http(Arc<HttpClient>),
}

impl Backend {
    /// A directory on local disk; writes are fsynced and published atomically (rename).
    pub fn local(root: &std::path::Path) -> Result<Backend> {
        std::fs::create_dir_all(root).map_err(|e| StoreError::io("creating store directory", root, e))?;
        let open = |fsync: bool| {
            object_store::local::LocalFileSystem::new_with_prefix(root)
                .map(|fs| Arc::new(fs.with_fsync(fsync).with_automatic_cleanup(true)))
                .map_err(|e| StoreError::Backend {
                    action: "opening",
                    key: root.display().to_string(),
                    message: e.to_string(),
                })
        };
        let mut b = Self::wrap(Inner::Objects(open(true)?), root.display().to_string());
        b.volatile = Some(open(false)?);
        b.cas_lock = Some(root.join(CAS_LOCK_FILE));
        b.root = Some(root.to_path_buf());
        Ok(b)
    }

    /// An S3-compatible bucket, optionally under a key prefix. Endpoint, region, credentials
    /// and `AWS_ALLOW_HTTP` come from the usual `AWS_*` environment variables; requests use
    /// path-style addressing unless `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`; the region
    /// defaults to us-east-1. Failed requests are retried briefly, so an unreachable
    /// endpoint fails within seconds.
    pub fn s3(bucket: &str, prefix: &str) -> Result<Backend> {
        let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(
            object_store::RetryConfig {
                max_retries: 3,
                retry_timeout: std::time::Duration::from_secs(15),
                ..Default::default()
            },
        );
        let file = s3_config_file();
        for (key, value) in &file {
            let parsed = key
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| StoreError::Invalid(format!("S3 config file: unknown setting {key}")))?;
            b = b.with_config(parsed, value);
        }
        let has = |k: &str| std::env::var_os(k).is_some() || file.iter().any(|(f, _)| f == k);
        if !has("AWS_REGION") && !has("AWS_DEFAULT_REGION") {
            b = b.with_region("us-east-1");
        }
        let s3 = b.build().map_err(|e| StoreError::Backend {
            action: "configuring",
            key: format!("s3://{bucket}"),
            message: innermost(&e),
        })?;
        let desc = format!("s3://{bucket}/{prefix}");
        if prefix.is_empty() {
            Ok(Self::wrap(Inner::Objects(Arc::new(s3)), desc))
        } else {
            Ok(Self::wrap(Inner::Objects(Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))), desc))
        }
    }

    /// An in-memory store, for unit tests only.
    pub fn memory() -> Backend {
        Self::wrap(Inner::Objects(Arc::new(object_store::memory::InMemory::new())), "memory".into())
    }

    /// A gstore HTTP chunk server at `url` (`http://host:port`); the token comes from
    /// `GSTORE_TOKEN`.
    pub fn http(url: &str) -> Result<Backend> {
        Ok(Self::wrap(Inner::Http(Arc::new(HttpClient::new(url)?)), url.to_string()))
    }

    fn wrap(inner: Inner, description: String) -> Backend {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime starts");
        Backend {
            inner,
            rt: Arc::new(rt),
            description,
            requests: Arc::default(),
            gate: None,
            volatile: None,
            cas_lock: None,
            root: None,
        }
    }

    /// This backend with `gate` called before every request, sharing the same objects: a
    /// test scheduler can hold a request until it is that actor's turn.
    pub fn with_gate(&self, gate: Gate) -> Backend {
        Backend { gate: Some(gate), ..self.clone() }
    }

    /// Requests sent so far through this backend and its clones.
    pub fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a request and passes the gate, if any.
    fn before(&self, op: &'static str, key: &str) {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(g) = &self.gate {
            g(op, key);
        }
    }

    /// The `object_store` this backend reads and writes (for serving it over HTTP); `None` for
    /// an HTTP backend.
    pub fn object_store(&self) -> Option<Arc<dyn ObjectStore>> {
        match &self.inner {
            Inner::Objects(s) => Some(s.clone()),
            Inner::Http(_) => None,
        }
    }

    /// The object store, for methods that handled the HTTP case first.
    fn objects(&self) -> &Arc<dyn ObjectStore> {
        match &self.inner {
            Inner::Objects(s) => s,
            Inner::Http(_) => unreachable!("HTTP backends are handled before"),
        }
    }

    fn http_client(&self) -> Option<&HttpClient> {
        match &self.inner {
            Inner::Http(h) => Some(h),
            Inner::Objects(_) => None,
        }
    }

    /// One HTTP request, checked.
    fn http_call(
        &self,
        h: &HttpClient,
        method: reqwest::Method,
        key: &str,
        headers: &[(reqwest::header::HeaderName, String)],
        body: Option<Vec<u8>>,
    ) -> Result<crate::http::Answer> {
        let a = self.rt.block_on(h.send(method, &HttpClient::object_path(key), headers, body.map(Bytes::from)))?;
        h.check(key, &a)?;
        Ok(a)
    }

    /// The lock file that serializes compare-and-swap writes on a local store (`None`
    /// elsewhere), for other writers of the same directory such as `gstore serve`.
    pub fn cas_lock_path(&self) -> Option<&std::path::Path> {
        self.cas_lock.as_deref()
    }

    /// The directory of a local store, where an object's key is its path (`None` for other
    /// backends).
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.root.as_deref()
    }

    /// Where this backend points, for messages.
    pub fn description(&self) -> &str {
        &self.description
    }

    fn err(action: &'static str, key: &str, e: object_store::Error) -> StoreError {
        match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound { what: "object", key: key.to_string() },
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                StoreError::AlreadyExists { what: "object", key: key.to_string() }
            }
            other => {
                let message = innermost(&other);
                let message = match hint(&message) {
                    Some(h) => format!("{h} ({message})"),
                    None => message,
                };
                StoreError::Backend { action, key: key.to_string(), message }
            }
        }
    }

    /// Writes an object, replacing any existing one.
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        self.before("put", key);
        if let Some(h) = self.http_client() {
            return self.http_call(h, reqwest::Method::PUT, key, &[], Some(bytes)).map(|_| ());
        }
        self.rt
            .block_on(self.objects().put(&ObjPath::from(key), PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|e| Self::err("writing", key, e))
    }

    /// Writes an object that need not survive a crash of this machine (a lease: its holder
    /// dies with the machine), replacing any existing one: like [`Backend::put`], but without
    /// fsync on a local store. Readers still see the old or the new object whole.
    pub fn put_volatile(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        let Some(v) = &self.volatile else { return self.put(key, bytes) };
        self.before("put", key);
        self.rt
            .block_on(v.put(&ObjPath::from(key), PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|e| Self::err("writing", key, e))
    }

    /// Writes a large object in parts uploaded concurrently (S3 multipart upload), for
    /// remote backends; a failed upload is aborted and leaves no object.
    pub fn put_multipart(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        if self.http_client().is_some() {
            return self.put(key, bytes);
        }
        self.before("put_multipart", key);
        let path = ObjPath::from(key);
        self.rt
            .block_on(async {
                let upload = self.objects().put_multipart(&path).await?;
                let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART);
                w.put(Bytes::from(bytes));
                w.finish().await
            })
            .map(|_| ())
            .map_err(|e| Self::err("uploading", key, e))
    }

    /// Writes an object only if none exists under `key` ([`StoreError::AlreadyExists`] otherwise).
    pub fn put_new(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        self.before("put_new", key);
        if let Some(h) = self.http_client() {
            let r = self.http_call(
                h,
                reqwest::Method::PUT,
                key,
                &[(reqwest::header::IF_NONE_MATCH, "*".into())],
                Some(bytes),
            );
            return match r {
                Err(StoreError::Conflict(_)) => Err(StoreError::AlreadyExists { what: "object", key: key.to_string() }),
                other => other.map(|_| ()),
            };
        }
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.rt
            .block_on(self.objects().put_opts(&ObjPath::from(key), PutPayload::from(bytes), opts))
            .map(|_| ())
            .map_err(|e| Self::err("writing", key, e))
    }

    /// [`Backend::put_new`] for a record no other writer could produce byte for byte (a lease
    /// under a random key, a gc lock with a nonce): an object already there with exactly these
    /// bytes is this writer's own, met by a retry of a request whose answer was lost after it
    /// landed (the HTTP client and the S3 client both retry), and counts as written.
    pub fn create_record(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
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
    pub fn get_versioned(&self, key: &str) -> Result<Option<(Bytes, Version)>> {
        self.before("get_versioned", key);
        if let Some(h) = self.http_client() {
            return match self.http_call(h, reqwest::Method::GET, key, &[], None) {
                Ok(a) => Ok(Some((a.body, Version(object_store::UpdateVersion { e_tag: a.etag, version: None })))),
                Err(StoreError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            };
        }
        let path = ObjPath::from(key);
        let r = self.rt.block_on(async {
            let g = self.objects().get(&path).await?;
            let v = object_store::UpdateVersion { e_tag: g.meta.e_tag.clone(), version: g.meta.version.clone() };
            Ok::<_, object_store::Error>((g.bytes().await?, Version(v)))
        });
        match r {
            Ok(x) => Ok(Some(x)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::err("reading", key, e)),
        }
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
    pub fn put_if(&self, key: &str, bytes: Vec<u8>, expected: Option<&Version>) -> Result<()> {
        match self.put_if_once(key, bytes.clone(), expected) {
            Err(StoreError::Conflict(msg)) => match self.get_opt(key)? {
                Some(found) if found[..] == bytes[..] => Ok(()),
                _ => Err(StoreError::Conflict(msg)),
            },
            other => other,
        }
    }

    fn put_if_once(&self, key: &str, bytes: Vec<u8>, expected: Option<&Version>) -> Result<()> {
        self.before("put_if", key);
        if let Some(h) = self.http_client() {
            let cond = match expected {
                None => (reqwest::header::IF_NONE_MATCH, "*".to_string()),
                Some(v) => (reqwest::header::IF_MATCH, v.0.e_tag.clone().unwrap_or_default()),
            };
            return self.http_call(h, reqwest::Method::PUT, key, &[cond], Some(bytes)).map(|_| ());
        }
        let mode = match expected {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v.0.clone()),
        };
        let opts = PutOptions { mode, ..Default::default() };
        let path = ObjPath::from(key);
        match self.rt.block_on(self.objects().put_opts(&path, PutPayload::from(bytes.clone()), opts)) {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {
                Err(StoreError::lost_race(key))
            }
            Err(object_store::Error::NotImplemented { .. }) => self.put_if_unchanged(key, bytes, expected),
            Err(e) => Err(Self::err("writing", key, e)),
        }
    }

    /// Compare-and-swap for a store without If-Match: compares the version and writes while
    /// holding the store's CAS lock file (without one, just writes).
    fn put_if_unchanged(&self, key: &str, bytes: Vec<u8>, expected: Option<&Version>) -> Result<()> {
        let path = ObjPath::from(key);
        let write = || {
            self.rt
                .block_on(self.objects().put(&path, PutPayload::from(bytes.clone())))
                .map(|_| ())
                .map_err(|e| Self::err("writing", key, e))
        };
        let Some(lock_path) = &self.cas_lock else { return write() };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path)
            .map_err(|e| StoreError::io("opening", lock_path, e))?;
        file.lock().map_err(|e| StoreError::io("locking", lock_path, e))?;
        let current = match self.rt.block_on(self.objects().head(&path)) {
            Ok(m) => Some(m.e_tag),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(Self::err("checking", key, e)),
        };
        if current != expected.map(|v| v.0.e_tag.clone()) {
            return Err(StoreError::lost_race(key));
        }
        write()
    }

    /// Reads a whole object.
    pub fn get(&self, key: &str) -> Result<Bytes> {
        self.before("get", key);
        if let Some(h) = self.http_client() {
            return self.http_call(h, reqwest::Method::GET, key, &[], None).map(|a| a.body);
        }
        let path = ObjPath::from(key);
        self.rt
            .block_on(async { self.objects().get(&path).await?.bytes().await })
            .map_err(|e| Self::err("reading", key, e))
    }

    /// Reads a whole object, or `None` if it does not exist.
    pub fn get_opt(&self, key: &str) -> Result<Option<Bytes>> {
        match self.get(key) {
            Ok(b) => Ok(Some(b)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads a byte range of an object.
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        self.before("get_range", key);
        let want = range.end - range.start;
        let b = match self.http_client() {
            Some(h) => {
                self.http_call(
                    h,
                    reqwest::Method::GET,
                    key,
                    &[(reqwest::header::RANGE, HttpClient::range(&range))],
                    None,
                )?
                .body
            }
            None => self
                .rt
                .block_on(self.objects().get_range(&ObjPath::from(key), range.clone()))
                .map_err(|e| Self::err("reading", key, e))?,
        };
        if b.len() as u64 != want {
            return Err(StoreError::corrupt(
                "object",
                key,
                format!("range {range:?} returned {} bytes: truncated", b.len()),
            ));
        }
        Ok(b)
    }

    /// The size of an object, or `None` if it does not exist.
    pub fn size(&self, key: &str) -> Result<Option<u64>> {
        self.before("size", key);
        if let Some(h) = self.http_client() {
            let a = self.rt.block_on(h.send(reqwest::Method::HEAD, &HttpClient::object_path(key), &[], None))?;
            if a.status == reqwest::StatusCode::NOT_FOUND {
                return Ok(None);
            }
            h.check(key, &a)?;
            return Ok(a.content_length);
        }
        match self.rt.block_on(self.objects().head(&ObjPath::from(key))) {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::err("checking", key, e)),
        }
    }

    /// Lists every object under `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.before("list", prefix);
        if let Some(h) = self.http_client() {
            let path = format!("/v1/list?prefix={prefix}");
            let a = self.rt.block_on(h.send(reqwest::Method::GET, &path, &[], None))?;
            h.check(prefix, &a)?;
            let v: Vec<serde_json::Value> =
                serde_json::from_slice(&a.body).map_err(|e| StoreError::Invalid(format!("server listing: {e}")))?;
            return Ok(v
                .iter()
                .filter_map(|o| Some(Listed { key: o["key"].as_str()?.to_string(), size: o["size"].as_u64()? }))
                .collect());
        }
        let p = ObjPath::from(prefix);
        self.rt
            .block_on(
                self.objects()
                    .list(Some(&p))
                    .map_ok(|m| Listed { key: m.location.to_string(), size: m.size })
                    .try_collect(),
            )
            .map_err(|e| Self::err("listing", prefix, e))
    }

    /// Deletes an object; deleting a missing object is not an error.
    pub fn delete(&self, key: &str) -> Result<()> {
        self.before("delete", key);
        if let Some(h) = self.http_client() {
            return match self.http_call(h, reqwest::Method::DELETE, key, &[], None) {
                Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            };
        }
        match self.rt.block_on(self.objects().delete(&ObjPath::from(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::err("deleting", key, e)),
        }
    }
}

/// Settings from the S3 config file — `$GSTORE_S3_CONFIG`, else
/// `$XDG_CONFIG_HOME/gstore/s3.env` (else `~/.config/gstore/s3.env`): `AWS_NAME=value` lines,
/// `#` comments. A variable set in the environment wins over the file.
fn s3_config_file() -> Vec<(String, String)> {
    let path = std::env::var_os("GSTORE_S3_CONFIG").map(std::path::PathBuf::from).or_else(|| {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".config")))?;
        Some(base.join("gstore/s3.env"))
    });
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else { return Vec::new() };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| k.starts_with("AWS_") && std::env::var_os(k).is_none())
        .collect()
}

/// A one-line explanation of the common S3 failures.
fn hint(message: &str) -> Option<&'static str> {
    let m = message.to_ascii_lowercase();
    if m.contains("connection refused")
        || m.contains("dns error")
        || m.contains("timed out")
        || m.contains("error sending request")
    {
        Some("cannot reach the S3 endpoint: check AWS_ENDPOINT and that the server is up")
    } else if m.contains("nosuchbucket") || m.contains("bucket does not exist") {
        Some("no such bucket")
    } else if m.contains("invalidaccesskeyid")
        || m.contains("signaturedoesnotmatch")
        || m.contains("403 forbidden")
        || m.contains("accessdenied")
    {
        Some("access denied: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    } else {
        None
    }
}

/// The deepest message in an error chain (the OS or server's own words).
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    if cur.to_string() == e.to_string() {
        e.to_string()
    } else {
        format!("{e}: {cur}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_common_s3_failures() {
        assert_eq!(
            hint("HEAD in 403.4ms - HTTP error: error sending request: Connection refused"),
            Some("cannot reach the S3 endpoint: check AWS_ENDPOINT and that the server is up")
        );
        assert_eq!(
            hint("Client error with status 403 Forbidden: SignatureDoesNotMatch"),
            Some("access denied: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        );
        assert_eq!(hint("404 Not Found: NoSuchBucket"), Some("no such bucket"));
        assert_eq!(hint("something else"), None);
    }

    #[test]
    fn local_compare_and_swap_refuses_a_stale_version() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::local(dir.path()).unwrap();
        b.put_if("tags/t/v.tag", b"1".to_vec(), None).unwrap();
        let (_, v1) = b.get_versioned("tags/t/v.tag").unwrap().unwrap();
        // Another process (here: another handle) moves it; the stale version loses.
        let other = Backend::local(dir.path()).unwrap();
        other.put_if("tags/t/v.tag", b"2".to_vec(), Some(&v1)).unwrap();
        assert!(matches!(b.put_if("tags/t/v.tag", b"3".to_vec(), Some(&v1)), Err(StoreError::Conflict(_))));
        assert_eq!(&b.get("tags/t/v.tag").unwrap()[..], b"2");
        let (_, v2) = b.get_versioned("tags/t/v.tag").unwrap().unwrap();
        b.put_if("tags/t/v.tag", b"3".to_vec(), Some(&v2)).unwrap();
        assert_eq!(&b.get("tags/t/v.tag").unwrap()[..], b"3");
    }

    #[test]
    fn memory_round_trip_and_create_only() {
        let b = Backend::memory();
        b.put_new("a/b", b"one".to_vec()).unwrap();
        assert!(matches!(b.put_new("a/b", b"two".to_vec()), Err(StoreError::AlreadyExists { .. })));
        assert_eq!(&b.get("a/b").unwrap()[..], b"one");
        assert_eq!(&b.get_range("a/b", 1..3).unwrap()[..], b"ne");
        assert_eq!(b.size("a/b").unwrap(), Some(3));
        assert!(b.get_opt("nope").unwrap().is_none());
        assert_eq!(b.list("a").unwrap().len(), 1);
        b.delete("a/b").unwrap();
        b.delete("a/b").unwrap();
        assert!(b.size("a/b").unwrap().is_none());
    }
}
