//! [`Objects`] on a gstore HTTP chunk server (docs/HTTP.md), through [`crate::backend::http_client`]'s client.

use super::{runtime, ListEntry, Objects, Patience, Put, Version};
use crate::backend::http_client::{Answer, HttpClient};
use crate::error::{Result, StoreError};
use crate::format::key::ObjectKey;
use crate::ObjectKind;
use bytes::Bytes;
use object_store::PutPayload;
use reqwest::header::{HeaderName, IF_MATCH, IF_NONE_MATCH, RANGE};
use reqwest::{Method, StatusCode};
use std::ops::Range;

/// A chunk server as gstore's backend.
pub(super) struct HttpObjects {
    client: HttpClient,
}

impl HttpObjects {
    /// The server at `url`.
    /// Fails when this client's token may not write tags named `name` (docs/HTTP.md).
    pub(super) fn check_tag_write(&self, name: &str) -> Result<()> {
        let path = format!("/v1/may-write/tags/{name}");
        let a = runtime().block_on(self.client.send(Method::GET, &path, &[], None))?;
        match a.status {
            // A server older than this route: the tag's own write decides, as before.
            StatusCode::NOT_FOUND => Ok(()),
            _ => self.client.check(&format!("tags/{name}"), &a),
        }
    }

    pub(super) fn new(url: &str, patience: Patience) -> Result<HttpObjects> {
        Ok(HttpObjects { client: HttpClient::new(url, patience.stall)? })
    }

    /// One request on an object, checked.
    fn call(
        &self,
        method: Method,
        key: &ObjectKey,
        headers: &[(HeaderName, String)],
        body: Option<Bytes>,
    ) -> Result<Answer> {
        let key = key.to_string();
        let a = runtime().block_on(self.client.send(method, &HttpClient::object_path(&key), headers, body))?;
        self.client.check(&key, &a)?;
        Ok(a)
    }
}

impl Objects for HttpObjects {
    fn put(&self, key: &ObjectKey, bytes: PutPayload, mode: Put<'_>) -> Result<()> {
        let cond = match mode {
            Put::Replace | Put::ReplaceVolatile => None,
            Put::Create => Some((IF_NONE_MATCH, "*".to_string())),
            Put::Update(v) => Some((IF_MATCH, v.0.e_tag.clone().unwrap_or_default())),
        };
        // One body: the pieces joined (a copy only for an object given in several).
        match self.call(Method::PUT, key, cond.as_slice(), Some(Bytes::from(bytes))) {
            Err(StoreError::Conflict(_)) if matches!(mode, Put::Create) => {
                Err(StoreError::AlreadyExists { what: ObjectKind::Object, key: key.to_string() })
            }
            other => other.map(|_| ()),
        }
    }

    fn get(&self, key: &ObjectKey) -> Result<Option<(Bytes, Version)>> {
        match self.call(Method::GET, key, &[], None) {
            Ok(a) => Ok(Some((a.body, Version(object_store::UpdateVersion { e_tag: a.etag, version: None })))),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes> {
        Ok(self.call(Method::GET, key, &[(RANGE, HttpClient::range(&range))], None)?.body)
    }

    fn size(&self, key: &ObjectKey) -> Result<Option<u64>> {
        let key = key.to_string();
        let a = runtime().block_on(self.client.send(Method::HEAD, &HttpClient::object_path(&key), &[], None))?;
        if a.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        self.client.check(&key, &a)?;
        Ok(a.content_length)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ListEntry>> {
        let query: String = form_urlencoded::Serializer::new(String::new()).append_pair("prefix", prefix).finish();
        let a = runtime().block_on(self.client.send(Method::GET, &format!("/v1/list?{query}"), &[], None))?;
        self.client.check(prefix, &a)?;
        serde_json::from_slice(&a.body).map_err(|e| StoreError::Backend {
            action: "listing",
            key: prefix.to_string(),
            message: format!("the server's listing is not what docs/HTTP.md describes: {e}"),
        })
    }

    fn delete(&self, key: &ObjectKey) -> Result<()> {
        match self.call(Method::DELETE, key, &[], None) {
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
