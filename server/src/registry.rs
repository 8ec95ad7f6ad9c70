//! The OCI distribution API (`/v2/`) over the store's registry ([`gstore_registry`]): pulls
//! and pushes from podman, CRI-O, containerd, skopeo. docs/REGISTRY.md lists what is served.
//! Tokens are the server's: sent as `Bearer TOKEN`, or as the password of basic auth
//! (`podman login -p TOKEN`); reads need `read`, pushes `write` on the tag (`REPO:TAG`) or,
//! for uploads, on the repository name.
// Handlers return early with ready-made responses; boxing them would buy nothing.
#![allow(clippy::result_large_err)]

use crate::auth::{Denied, Scope, Token};
use crate::headers::{declared_length, parse_range};
use crate::quota;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use gstore_registry::digest::Digest;
use gstore_registry::{Registry, RegistryError};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The largest manifest accepted.
const MANIFEST_MAX: usize = 4 << 20;

/// How often abandoned uploads are looked for ([`sweep_uploads`]).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The most of a body past the upload limits that is read (and thrown away) before the
/// refusal is sent: a client still sending when the connection closes may see it reset
/// instead of the answer.
const DRAIN_MAX: u64 = 8 << 20;

/// The answer for a registry error: its status, and the distribution API's error body.
fn failure(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": message.into(), "detail": null }] });
    let mut r = (status, axum::Json(body)).into_response();
    r.headers_mut().insert("Docker-Distribution-API-Version", HeaderValue::from_static("registry/2.0"));
    r
}

fn registry_failure(e: RegistryError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    failure(status, e.code(), e.to_string())
}

/// Checks the request's token; a missing or unknown one is asked for (basic auth, which
/// podman and the others answer with the credentials they were given). Returns the token
/// (none when the server has no tokens).
fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    scope: Scope,
    tag: Option<&str>,
) -> Result<Option<Arc<Token>>, Response> {
    let header = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match state.tokens.current().authorize(header, scope, tag) {
        Ok(t) => Ok(t),
        Err(Denied::Unauthenticated) => {
            let mut r = failure(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "a gstore token is needed (as the password)");
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(r#"Basic realm="gstore""#));
            Err(r)
        }
        Err(Denied::Forbidden(why)) => Err(failure(StatusCode::FORBIDDEN, "DENIED", why)),
    }
}

/// The registry, or the answer saying why this server has none.
fn registry(state: &AppState) -> Result<Arc<Registry>, Response> {
    state.registry.clone().ok_or_else(|| {
        failure(
            StatusCode::NOT_IMPLEMENTED,
            "UNSUPPORTED",
            "this server has no registry: its store is encrypted and the server holds no key",
        )
    })
}

/// Runs a registry call on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> gstore_registry::Result<T> + Send + 'static,
) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(registry_failure),
        Err(e) => Err(failure(StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN", e.to_string())),
    }
}

/// Whose uploads a request's token makes: its number, the 64 bits its leases are named by
/// (the same on every server and after the token file is read again), never 0; or 0 on a
/// server without tokens. One owner's uploads share a limit, and only its own are visible
/// to it.
fn owner(token: Option<&Token>) -> u64 {
    token.map_or(0, |t| u64::from_str_radix(&t.lease_prefix(), 16).map_or(1, |n| n | 1))
}

/// Checks that the request may upload to repository `name`; returns whose upload it is and
/// what it may hold: a token with a quota, the quota's room (its images' stored bytes
/// counted from the store, docs/SECURITY.md).
async fn uploader(state: &AppState, headers: &HeaderMap, name: &str) -> Result<Uploader, Response> {
    let token = authorize(state, headers, Scope::Write, Some(name))?;
    let limit = match token.as_deref() {
        Some(t) => within_quota(state, t).await?,
        None => u64::MAX,
    };
    Ok(Uploader { owner: owner(token.as_deref()), limit })
}

/// The stored bytes `token`'s quota leaves room for (`u64::MAX` without one); at or past it,
/// the answer refusing the push.
async fn within_quota(state: &AppState, token: &Token) -> Result<u64, Response> {
    quota::room(state, token, None).await.map_err(|r| match r {
        quota::Refusal::Over(why) => failure(StatusCode::FORBIDDEN, "DENIED", why),
        quota::Refusal::Failed(e) => {
            failure(StatusCode::BAD_GATEWAY, "UNKNOWN", format!("reading the quota's images: {e}"))
        }
    })
}

/// Removes abandoned uploads ([`gstore_registry::uploads::Uploads::sweep`]) every minute
/// while the registry is in use.
pub async fn sweep_uploads(registry: Weak<Registry>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        let Some(reg) = registry.upgrade() else { return };
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || reg.uploads().sweep()).await {
            eprintln!("gstore serve: sweeping the registry's abandoned uploads: {e}");
        }
    }
}

/// `GET /v2/`: the API version check, which is also where clients learn to authenticate.
pub async fn root(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = registry(&state).and_then(|_| authorize(&state, &headers, Scope::Read, None)) {
        return r;
    }
    let mut r = axum::Json(serde_json::json!({})).into_response();
    r.headers_mut().insert("Docker-Distribution-API-Version", HeaderValue::from_static("registry/2.0"));
    r
}

/// What a `/v2/NAME/...` path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Manifest(&'a str, &'a str),
    Blob(&'a str, &'a str),
    /// An upload: started (no id) or continued.
    Upload(&'a str, Option<&'a str>),
    Tags(&'a str),
}

fn target(path: &str) -> Option<Target<'_>> {
    if let Some(name) = path.strip_suffix("/tags/list") {
        return Some(Target::Tags(name));
    }
    if let Some((name, reference)) = path.rsplit_once("/manifests/") {
        return Some(Target::Manifest(name, reference));
    }
    if let Some((name, id)) = path.split_once("/blobs/uploads") {
        let id = id.trim_matches('/');
        return Some(Target::Upload(name, (!id.is_empty()).then_some(id)));
    }
    let (name, digest) = path.rsplit_once("/blobs/")?;
    Some(Target::Blob(name, digest))
}

/// Every `/v2/NAME/...` route.
pub async fn dispatch(
    State(state): State<AppState>,
    method: Method,
    Path(path): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    let Some(t) = target(&path) else {
        return failure(StatusCode::NOT_FOUND, "NAME_UNKNOWN", format!("no registry route /v2/{path}"));
    };
    let reg = match registry(&state) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let headers = req.headers().clone();
    let outcome = match (t, method.clone()) {
        (Target::Manifest(name, reference), Method::GET | Method::HEAD) => {
            get_manifest(&state, &headers, reg, name, reference, method == Method::HEAD).await
        }
        (Target::Manifest(name, reference), Method::PUT) => put_manifest(&state, reg, name, reference, req).await,
        (Target::Blob(name, digest), Method::GET | Method::HEAD) => {
            get_blob(&state, &headers, reg, name, digest, method == Method::HEAD).await
        }
        (Target::Upload(name, None), Method::POST) => start_upload(&state, reg, name, &query, req).await,
        (Target::Upload(name, Some(id)), Method::PATCH) => patch_upload(&state, reg, name, id, req).await,
        (Target::Upload(name, Some(id)), Method::PUT) => finish_upload(&state, reg, name, id, &query, req).await,
        (Target::Upload(name, Some(id)), Method::GET) => upload_status(&state, &headers, reg, name, id).await,
        (Target::Upload(name, Some(id)), Method::DELETE) => cancel_upload(&state, &headers, reg, name, id).await,
        (Target::Tags(name), Method::GET) => tags(&state, &headers, reg, name, &query).await,
        (_, Method::DELETE) => Err(failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "deleting through the registry is not supported: `gstore rm REPO:TAG`, then `gstore gc`",
        )),
        (_, m) => Err(failure(StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED", format!("{m} /v2/{path}"))),
    };
    outcome.unwrap_or_else(|r| r)
}

fn set(h: &mut HeaderMap, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        h.insert(name, v);
    }
}

async fn get_manifest(
    state: &AppState,
    headers: &HeaderMap,
    reg: Arc<Registry>,
    name: &str,
    reference: &str,
    head: bool,
) -> Result<Response, Response> {
    authorize(state, headers, Scope::Read, None)?;
    let (n, r) = (name.to_string(), reference.to_string());
    let served = blocking(move || reg.manifest(&n, &r)).await?;
    let mut h = HeaderMap::new();
    set(&mut h, "content-type", &served.media_type);
    set(&mut h, "docker-content-digest", &served.digest);
    set(&mut h, "content-length", served.bytes.len());
    Ok(if head { (StatusCode::OK, h).into_response() } else { (StatusCode::OK, h, served.bytes).into_response() })
}

async fn put_manifest(
    state: &AppState,
    reg: Arc<Registry>,
    name: &str,
    reference: &str,
    req: Request,
) -> Result<Response, Response> {
    let token = authorize(state, req.headers(), Scope::Write, Some(&format!("{name}:{reference}")))?;
    if let Some(t) = token.as_deref() {
        within_quota(state, t).await?;
    }
    let who = owner(token.as_deref());
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    let bytes = axum::body::to_bytes(req.into_body(), MANIFEST_MAX).await.map_err(|e| {
        failure(StatusCode::PAYLOAD_TOO_LARGE, "SIZE_INVALID", format!("a manifest of at most 4 MiB: {e}"))
    })?;
    let (n, r) = (name.to_string(), reference.to_string());
    let digest = blocking(move || reg.put_manifest(&n, &r, content_type.as_deref(), &bytes, who)).await?;
    let mut h = HeaderMap::new();
    set(&mut h, "location", format!("/v2/{name}/manifests/{digest}"));
    set(&mut h, "docker-content-digest", &digest);
    Ok((StatusCode::CREATED, h).into_response())
}

async fn get_blob(
    state: &AppState,
    headers: &HeaderMap,
    reg: Arc<Registry>,
    name: &str,
    digest: &str,
    head: bool,
) -> Result<Response, Response> {
    let who = owner(authorize(state, headers, Scope::Read, None)?.as_deref());
    let digest = Digest::parse(digest).map_err(registry_failure)?;
    let (n, d) = (name.to_string(), digest.clone());
    let r = reg.clone();
    let blob = blocking(move || r.blob(&n, &d, who)).await?;
    // One range (`bytes=A-B` / `bytes=A-`), as a client resuming a pull asks.
    let range = match headers.get(header::RANGE).map(|v| v.to_str().ok().and_then(parse_range)) {
        None => 0..blob.size,
        Some(Some(object_store::GetRange::Bounded(r))) if r.start < blob.size => r.start..r.end.min(blob.size),
        Some(Some(object_store::GetRange::Offset(start))) if start < blob.size => start..blob.size,
        Some(_) => {
            let mut r =
                failure(StatusCode::RANGE_NOT_SATISFIABLE, "BLOB_UNKNOWN", "unsatisfiable or unsupported Range");
            set(r.headers_mut(), "content-range", format!("bytes */{}", blob.size));
            return Err(r);
        }
    };
    let partial = range.start > 0 || range.end < blob.size;
    let mut h = HeaderMap::new();
    set(&mut h, "content-type", "application/octet-stream");
    set(&mut h, "docker-content-digest", &digest);
    set(&mut h, "accept-ranges", "bytes");
    set(&mut h, "content-length", range.end - range.start);
    let status = if partial {
        set(&mut h, "content-range", format!("bytes {}-{}/{}", range.start, range.end - 1, blob.size));
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    if head {
        return Ok((status, h).into_response());
    }
    // Written on a blocking thread into a bounded channel; a failure (a damaged chunk) ends
    // the body with an error, which cuts the connection short of its length: the client
    // never takes a partial blob for the whole.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    state.metrics.bytes_out.inc_by(range.end - range.start);
    tokio::task::spawn_blocking(move || {
        let mut w = Sending { tx: tx.clone(), piece: Vec::new(), skip: range.start, left: range.end - range.start };
        let wrote = reg
            .write_blob(&blob, &mut w)
            .and_then(|()| w.flush().map_err(|e| RegistryError::io("sending", std::path::Path::new("a blob"), e)));
        if let Err(e) = wrote {
            eprintln!("gstore serve: blob {digest}: {e}");
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    Ok((status, h, Body::from_stream(body)).into_response())
}

/// A writer handing the bytes of a window of what is written to it (`skip` bytes passed
/// over, then `left` bytes) to a response body, a piece at a time; once the window is sent
/// it says the client went away, which stops the blob's writer.
struct Sending {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    piece: Vec<u8>,
    skip: u64,
    left: u64,
}

/// Bytes handed to the body at once.
const PIECE: usize = 1 << 20;

impl Write for Sending {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let skipped = buf.len().min(self.skip.min(usize::MAX as u64) as usize);
        if skipped > 0 {
            self.skip -= skipped as u64;
            return Ok(skipped);
        }
        if self.left == 0 {
            self.flush()?;
            return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the range is sent"));
        }
        let n = buf.len().min(PIECE - self.piece.len()).min(self.left.min(usize::MAX as u64) as usize);
        self.piece.extend_from_slice(&buf[..n]);
        self.left -= n as u64;
        if self.piece.len() == PIECE || self.left == 0 {
            self.flush()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(&mut self.piece, Vec::with_capacity(PIECE)));
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

/// The start a request's `Content-Range: START-END` gives its bytes, if it says.
fn range_start(headers: &HeaderMap) -> Option<u64> {
    let v = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    v.trim_start_matches("bytes ").split('-').next()?.trim().parse().ok()
}

/// Who uploads, and how many bytes its uploads may hold.
#[derive(Clone, Copy)]
struct Uploader {
    /// The token's number ([`owner`]).
    owner: u64,
    /// Its quota's room (no quota: unbounded), as the upload limits allow it.
    limit: u64,
}

/// Appends a request's body to upload `id` of repository `name`, as it arrives, a part at a
/// time into the store, within the upload limits: a body whose declared length would pass
/// them is refused before any of it is read; one found passing them midway ends the upload.
/// Returns the upload's length.
async fn append(reg: &Arc<Registry>, who: Uploader, name: &str, id: &str, req: Request) -> Result<u64, Response> {
    let (from, declared) = (range_start(req.headers()), declared_length(req.headers()));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let (r, n, i) = (reg.clone(), name.to_string(), id.to_string());
    let writer = tokio::task::spawn_blocking(move || -> gstore_registry::Result<u64> {
        let mut appending = r.uploads().append(who.owner, &n, &i, from, who.limit, declared)?;
        let mut wrote = Ok(());
        while let Some(b) = rx.blocking_recv() {
            wrote = appending.write(&b);
            if wrote.is_err() {
                break;
            }
        }
        let stored = wrote.and_then(|()| appending.finish());
        // Past a limit the upload ends; other failures keep what was stored, to go on from.
        if let Err(RegistryError::UploadLimit(_)) = &stored {
            let _ = appending.abandon();
        }
        stored
    });
    let mut stream = req.into_body().into_data_stream();
    let mut cut = None;
    while let Some(piece) = stream.next().await {
        match piece {
            Ok(b) => {
                if tx.send(b).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                cut = Some(e.to_string());
                break;
            }
        }
    }
    drop(tx);
    let written = writer.await.map_err(|e| failure(StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN", e.to_string()))?;
    match (written, cut) {
        (Ok(_), Some(why)) => {
            Err(failure(StatusCode::BAD_REQUEST, "BLOB_UPLOAD_INVALID", format!("the upload was cut: {why}")))
        }
        (Ok(len), None) => Ok(len),
        (Err(e), _) => {
            drain(stream).await;
            Err(registry_failure(e))
        }
    }
}

/// Reads what is left of a refused body (up to [`DRAIN_MAX`]) and throws it away, so that
/// a client still sending it gets the answer.
async fn drain(mut stream: axum::body::BodyDataStream) {
    let mut left = DRAIN_MAX;
    while let Some(Ok(b)) = stream.next().await {
        left = left.saturating_sub(b.len() as u64);
        if left == 0 {
            return;
        }
    }
}

fn upload_headers(name: &str, id: &str, len: u64) -> HeaderMap {
    let mut h = HeaderMap::new();
    set(&mut h, "location", format!("/v2/{name}/blobs/uploads/{id}"));
    set(&mut h, "docker-upload-uuid", id);
    set(&mut h, "range", format!("0-{}", len.saturating_sub(1)));
    set(&mut h, "content-length", 0);
    h
}

fn blob_created(name: &str, digest: &Digest) -> Response {
    let mut h = HeaderMap::new();
    set(&mut h, "location", format!("/v2/{name}/blobs/{digest}"));
    set(&mut h, "docker-content-digest", digest);
    (StatusCode::CREATED, h).into_response()
}

async fn start_upload(
    state: &AppState,
    reg: Arc<Registry>,
    name: &str,
    query: &HashMap<String, String>,
    req: Request,
) -> Result<Response, Response> {
    let who = uploader(state, req.headers(), name).await?;
    gstore_registry::tag_name(name).map_err(registry_failure)?;
    // A mount from another repository: every blob is the store's, so one that exists needs
    // no upload.
    if let Some(d) = query.get("mount") {
        let digest = Digest::parse(d).map_err(registry_failure)?;
        let (r, n, dd) = (reg.clone(), name.to_string(), digest.clone());
        if blocking(move || r.blob(&n, &dd, who.owner)).await.is_ok() {
            return Ok(blob_created(name, &digest));
        }
    }
    let declared = declared_length(req.headers()).unwrap_or(0);
    let (r, n) = (reg.clone(), name.to_string());
    let id = blocking(move || r.uploads().start(&n, who.owner, declared, who.limit)).await?;
    let len = append(&reg, who, name, &id, req).await?;
    match query.get("digest") {
        Some(d) => finish(reg, who, name, &id, d).await,
        None => Ok((StatusCode::ACCEPTED, upload_headers(name, &id, len)).into_response()),
    }
}

async fn patch_upload(
    state: &AppState,
    reg: Arc<Registry>,
    name: &str,
    id: &str,
    req: Request,
) -> Result<Response, Response> {
    let who = uploader(state, req.headers(), name).await?;
    let len = append(&reg, who, name, id, req).await?;
    Ok((StatusCode::ACCEPTED, upload_headers(name, id, len)).into_response())
}

async fn finish_upload(
    state: &AppState,
    reg: Arc<Registry>,
    name: &str,
    id: &str,
    query: &HashMap<String, String>,
    req: Request,
) -> Result<Response, Response> {
    let who = uploader(state, req.headers(), name).await?;
    let digest = query
        .get("digest")
        .ok_or_else(|| failure(StatusCode::BAD_REQUEST, "DIGEST_INVALID", "the upload's PUT names no ?digest="))?;
    append(&reg, who, name, id, req).await?;
    finish(reg, who, name, id, digest).await
}

/// Ends upload `id` as blob `digest` (checking its bytes).
async fn finish(reg: Arc<Registry>, who: Uploader, name: &str, id: &str, digest: &str) -> Result<Response, Response> {
    let digest = Digest::parse(digest).map_err(registry_failure)?;
    let (n, i, d) = (name.to_string(), id.to_string(), digest.clone());
    blocking(move || reg.uploads().finish(who.owner, &n, &i, &d)).await?;
    Ok(blob_created(name, &digest))
}

async fn upload_status(
    state: &AppState,
    headers: &HeaderMap,
    reg: Arc<Registry>,
    name: &str,
    id: &str,
) -> Result<Response, Response> {
    let owner = owner(authorize(state, headers, Scope::Write, Some(name))?.as_deref());
    let (n, i) = (name.to_string(), id.to_string());
    let len = blocking(move || reg.uploads().received(owner, &n, &i)).await?;
    Ok((StatusCode::NO_CONTENT, upload_headers(name, id, len)).into_response())
}

async fn cancel_upload(
    state: &AppState,
    headers: &HeaderMap,
    reg: Arc<Registry>,
    name: &str,
    id: &str,
) -> Result<Response, Response> {
    let owner = owner(authorize(state, headers, Scope::Write, Some(name))?.as_deref());
    let (n, i) = (name.to_string(), id.to_string());
    blocking(move || reg.uploads().cancel(owner, &n, &i)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn tags(
    state: &AppState,
    headers: &HeaderMap,
    reg: Arc<Registry>,
    name: &str,
    query: &HashMap<String, String>,
) -> Result<Response, Response> {
    authorize(state, headers, Scope::Read, None)?;
    let n = name.to_string();
    let mut tags = blocking(move || reg.tags(&n)).await?;
    if let Some(last) = query.get("last") {
        tags.retain(|t| t > last);
    }
    if let Some(n) = query.get("n").and_then(|n| n.parse::<usize>().ok()) {
        tags.truncate(n);
    }
    Ok(axum::Json(serde_json::json!({ "name": name, "tags": tags })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_targets() {
        assert_eq!(target("web/manifests/2"), Some(Target::Manifest("web", "2")));
        assert_eq!(target("web/blobs/sha256:ab"), Some(Target::Blob("web", "sha256:ab")));
        assert_eq!(target("web/blobs/uploads/"), Some(Target::Upload("web", None)));
        assert_eq!(target("web/blobs/uploads/0a1b"), Some(Target::Upload("web", Some("0a1b"))));
        assert_eq!(target("web/tags/list"), Some(Target::Tags("web")));
        assert_eq!(target("a/b/manifests/x"), Some(Target::Manifest("a/b", "x")));
        assert_eq!(target("web"), None);
    }
}
