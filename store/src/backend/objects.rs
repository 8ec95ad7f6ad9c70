//! [`Objects`] over any `object_store` implementation: an S3 bucket (see [`super::s3`]), the
//! local directory's file store (wrapped by [`super::local`]), memory for unit tests.

use super::{runtime, ListEntry, Objects, Put, Version};
use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use crate::ObjectKind;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::sync::Arc;

/// An `object_store` as gstore's backend.
pub(crate) struct ObjectStoreObjects {
    store: Arc<dyn ObjectStore>,
}

impl ObjectStoreObjects {
    /// Wraps `store`.
    pub(crate) fn new(store: Arc<dyn ObjectStore>) -> ObjectStoreObjects {
        ObjectStoreObjects { store }
    }

    /// The store it wraps.
    pub(crate) fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The object's entity tag, or `None` if it does not exist (for the local
    /// compare-and-swap, which compares it under a lock).
    pub(super) fn e_tag(&self, key: &ObjectKey) -> Result<Option<Option<String>>> {
        match runtime().block_on(self.store.head(&path_of(key))) {
            Ok(m) => Ok(Some(m.e_tag)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(err("checking", key, e)),
        }
    }
}

impl Objects for ObjectStoreObjects {
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()> {
        let mode = match mode {
            Put::Replace | Put::ReplaceVolatile => PutMode::Overwrite,
            Put::Create => PutMode::Create,
            Put::Update(v) => PutMode::Update(v.0.clone()),
        };
        let update = matches!(mode, PutMode::Update(_));
        let opts = PutOptions { mode, ..Default::default() };
        match runtime().block_on(self.store.put_opts(&path_of(key), bytes, opts)) {
            Ok(_) => Ok(()),
            Err(object_store::Error::Precondition { .. }) if update => Err(StoreError::lost_race(key)),
            Err(object_store::Error::NotImplemented { .. }) if update => Err(StoreError::Backend {
                action: "writing",
                key: key.to_string(),
                message: "this store cannot write conditionally (If-Match), which tag updates need".into(),
            }),
            Err(e) => Err(err("writing", key, e)),
        }
    }

    fn put_large(&self, key: &ObjectKey, bytes: PutPayload) -> Result<()> {
        let path = path_of(key);
        runtime()
            .block_on(async {
                let upload = self.store.put_multipart(&path).await?;
                let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, super::MULTIPART_PART);
                for piece in bytes {
                    w.put(piece);
                }
                w.finish().await
            })
            .map(|_| ())
            .map_err(|e| err("uploading", key, e))
    }

    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        let path = path_of(key);
        let r = runtime().block_on(async {
            let g = self.store.get(&path).await?;
            let v = object_store::UpdateVersion { e_tag: g.meta.e_tag.clone(), version: g.meta.version.clone() };
            Ok::<_, object_store::Error>((g.bytes().await?, Version(v)))
        });
        match r {
            Ok(x) => Ok(Some(x)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(err("reading", key, e)),
        }
    }

    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        runtime().block_on(self.store.get_range(&path_of(key), range)).map_err(|e| err("reading", key, e))
    }

    fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        match runtime().block_on(self.store.head(&path_of(key))) {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(err("checking", key, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        let p = ObjPath::from(prefix);
        runtime()
            .block_on(self.store.list(Some(&p)).map_ok(|m| ListEntry::of(&m)).try_collect())
            .map_err(|e| err("listing", prefix, e))
    }

    fn delete(&self, key: &ObjectKey) -> Result<()> {
        match runtime().block_on(self.store.delete(&path_of(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(err("deleting", key, e)),
        }
    }
}

/// Where `key` lies in an `object_store`.
pub(super) fn path_of(key: &ObjectKey) -> ObjPath {
    ObjPath::from(key.to_string())
}

/// The store's error for an `object_store` failure, with a hint for the common S3 ones.
pub(super) fn err(action: &'static str, key: impl std::fmt::Display, e: object_store::Error) -> StoreError {
    match e {
        object_store::Error::NotFound { .. } => StoreError::NotFound { what: ObjectKind::Object, key: key.to_string() },
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            StoreError::AlreadyExists { what: ObjectKind::Object, key: key.to_string() }
        }
        other => {
            let transit = in_transit(&other);
            let message = innermost(&other);
            let message = match hint(&message) {
                Some(h) => format!("{h} ({message})"),
                None => message,
            };
            if let Some(reached) = transit {
                StoreError::Unavailable { action, key: key.to_string(), message, reached }
            } else {
                StoreError::Backend { action, key: key.to_string(), message }
            }
        }
    }
}

/// Whether `e` failed on the way rather than being refused — no connection, a request or
/// answer cut off, cancelled or timed out, or server errors (5xx) until the client's retries
/// ran out — and if so, whether the store was reached (anything but no connection).
fn in_transit(e: &object_store::Error) -> Option<bool> {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<HttpError>() {
            // Every kind but a body that would not decode: the client files a connection the
            // pool cancelled ("connection was not ready") as Unknown.
            return match h.kind() {
                HttpErrorKind::Decode => None,
                HttpErrorKind::Connect => Some(false),
                _ => Some(true),
            };
        }
        if c.to_string().contains("Server returned non-2xx status code: 5") {
            return Some(true);
        }
        cur = c.source();
    }
    None
}

/// The deepest message in an error chain (the OS or server's own words): an OS error alone
/// (the library's wrapping, e.g. "Generic LocalFileSystem error: Unable to open file
/// X#1", names its temporary files and repeats the OS's words), else the outer message with it.
pub(super) fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    let (outer, inner) = (e.to_string(), cur.to_string());
    if cur.downcast_ref::<std::io::Error>().is_some() || outer == inner {
        inner
    } else if outer.contains(&inner) {
        outer
    } else {
        format!("{outer}: {inner}")
    }
}

/// A one-line explanation of the common S3 failures.
pub(super) fn hint(message: &str) -> Option<&'static str> {
    let m = message.to_ascii_lowercase();
    if m.contains("connection refused")
        || m.contains("dns error")
        || m.contains("timed out")
        || m.contains("error sending request")
    {
        Some("cannot reach the S3 endpoint: check AWS_ENDPOINT and that the server is up")
    } else if m.contains("nosuchbucket") || m.contains("bucket does not exist") {
        Some("no such bucket")
    } else if m.contains("169.254.169.254") {
        // object_store asks the cloud's metadata service when no credentials are set.
        Some("no S3 credentials set: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or put them in $GSTORE_S3_CONFIG / ~/.config/gstore/s3.env); none came from an instance metadata service either")
    } else if m.contains("url scheme is not allowed") || m.contains("http scheme is not allowed") {
        Some("the endpoint is plain http://: set AWS_ALLOW_HTTP=true to allow it (or use https://)")
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
        assert!(hint("Error performing PUT http://169.254.169.254/latest/api/token: 403 Forbidden")
            .unwrap()
            .starts_with("no S3 credentials set"));
        assert!(hint("Generic HTTP client error: URL scheme is not allowed").unwrap().contains("AWS_ALLOW_HTTP=true"));
        assert_eq!(hint("something else"), None);
    }
}
