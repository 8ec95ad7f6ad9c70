//! The HTTP routes (docs/HTTP.md).
// Handlers return early with ready-made responses; boxing them would buy nothing.
#![allow(clippy::result_large_err)]

use crate::answers::{error, store_error, store_failure};
use crate::auth::{Denied, Scope, Token};
use crate::headers::{declared_length, parse_range};
use crate::lookup::{known_bases, locate, pack_path, refreshed, stored_bases, StoredBase};
use crate::tier::Served;
use crate::{quota, verify, AppState, Settings};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::{StreamExt, TryStreamExt};
use gstore_store::backend::ListEntry;
use gstore_store::backend::Version;
use gstore_store::codec::Decoder;
use gstore_store::format::key::{Family, ObjectKey as Key};
use gstore_store::format::tag::{TagRecord, TagRef};
use gstore_store::ObjectId;
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::sync::Arc;
use std::time::Instant;

/// The router with every layer: auth is per handler, from the headers, before any body is
/// read; limits, timeout and metrics wrap all.
pub fn router(state: AppState, s: &Settings) -> Router {
    Router::new()
        .route("/v1/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/list", get(list))
        .route("/v1/o/{*key}", get(get_object).head(get_object).put(put_object).delete(delete_object))
        .route("/v1/chunks/missing", axum::routing::post(missing_chunks))
        .route("/v1/may-write/tags/{name}", get(may_write_tag))
        .route("/v1/chunks/{id}", get(get_chunk))
        .route("/v2/", get(crate::registry::root))
        .route("/v2/{*path}", axum::routing::any(crate::registry::dispatch))
        .layer(middleware::from_fn({
            let limit = s.max_body;
            move |req, next| refuse_oversized(limit, req, next)
        }))
        .layer(middleware::from_fn_with_state(state.clone(), record))
        .layer(DefaultBodyLimit::max(s.max_body))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, s.timeout))
        .layer(tower::limit::ConcurrencyLimitLayer::new(s.max_concurrent))
        .with_state(state)
}

/// Refuses a request whose declared length passes `limit` before its body is read. No `100
/// Continue` goes out, so a client that waits for one (curl does, for large bodies) never
/// sends the body, and gets the 413. Found midway instead, the answer could be lost: the
/// server closes the connection while the client is still sending, and the reset can reach
/// the client before the answer does (a test saw curl report the `100` as the last status).
/// Registry uploads (`/v2/`) are bounded by the registry's upload limits instead.
async fn refuse_oversized(limit: usize, req: Request, next: Next) -> Response {
    match declared_length(req.headers()) {
        _ if req.uri().path().starts_with("/v2/") => next.run(req).await,
        Some(n) if n > limit as u64 => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a body of {n} bytes is more than this server takes (--max-body {limit})"),
        ),
        _ => next.run(req).await,
    }
}

/// Checks the request's token for `scope` (on tag `tag`): the token, or `None` when the
/// server has no tokens; else the 401/403 answer.
fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    scope: Scope,
    tag: Option<&str>,
) -> Result<Option<Arc<Token>>, Response> {
    let header = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    state.tokens.current().authorize(header, scope, tag).map_err(|d| match d {
        Denied::Unauthenticated => error(StatusCode::UNAUTHORIZED, "missing or unknown bearer token"),
        Denied::Forbidden(why) => error(StatusCode::FORBIDDEN, why),
    })
}

/// Reads a request's body (413 over `--max-body`): only once the request is authorized, so
/// that a request without a valid token costs the server no more than its headers.
async fn body_of(req: Request) -> Result<Bytes, Response> {
    Bytes::from_request(req, &()).await.map_err(IntoResponse::into_response)
}

/// The store object a request path names; `gstore init`'s probe objects and the registry's
/// uploads (its own, through `/v2/`) are not served.
fn parse_key(key: &str) -> Result<Key, Response> {
    match Key::parse(key) {
        Ok(Key::Probe(_) | Key::Upload(_)) => {
            Err(error(StatusCode::BAD_REQUEST, format!("not a served gstore object key: {key:?}")))
        }
        other => other.map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string())),
    }
}

async fn get_object(
    State(state): State<AppState>,
    method: Method,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read, None) {
        return r;
    }
    let parsed = match parse_key(&key) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let range = match headers.get(header::RANGE).map(|v| v.to_str().ok().and_then(parse_range)) {
        Some(None) => return error(StatusCode::RANGE_NOT_SATISFIABLE, "unsupported Range header"),
        Some(r) => r,
        None => None,
    };
    if let (Some(tier), Key::Pack(pack), Some(GetRange::Bounded(r)), false) =
        (&state.tier, &parsed, &range, method == Method::HEAD)
    {
        if let Served::Checked(bytes, len, held) = tier.get(&state, *pack, r.clone()).await {
            state.metrics.bytes_out.inc_by(bytes.len() as u64);
            let h = range_headers(r, len, true);
            // The tier's share of memory is held until the body is sent (the stream dropped).
            let body = futures::stream::iter([Ok::<_, std::convert::Infallible>(bytes)]).map(move |b| {
                let _held = &held;
                b
            });
            return (StatusCode::PARTIAL_CONTENT, h, axum::body::Body::from_stream(body)).into_response();
        }
    }
    let opts = GetOptions { range: range.clone(), head: method == Method::HEAD, ..Default::default() };
    let got = match state.objects.get_opts(&ObjPath::from(key.as_str()), opts).await {
        Ok(g) => g,
        Err(object_store::Error::Generic { .. }) if range.is_some() => {
            return error(StatusCode::RANGE_NOT_SATISFIABLE, "range outside the object")
        }
        Err(e) => return store_error(e),
    };
    let mut h = range_headers(&got.range, got.meta.size, range.is_some());
    if let Some(e) = got.meta.e_tag.as_ref().and_then(|e| e.parse().ok()) {
        h.insert(header::ETAG, e);
    }
    let status = if range.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    if method == Method::HEAD {
        return (status, h).into_response();
    }
    match got.bytes().await {
        Ok(b) => {
            state.metrics.bytes_out.inc_by(b.len() as u64);
            (status, h, b).into_response()
        }
        Err(e) => store_error(e),
    }
}

/// The headers of an answer holding `served` of an object of `size` bytes: `Accept-Ranges`,
/// `Content-Length`, and `Content-Range` when it answers a range request (`partial`).
fn range_headers(served: &std::ops::Range<u64>, size: u64, partial: bool) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::ACCEPT_RANGES, "bytes".parse().expect("header"));
    if partial {
        let content_range = format!("bytes {}-{}/{size}", served.start, served.end.saturating_sub(1));
        h.insert(header::CONTENT_RANGE, content_range.parse().expect("header"));
    }
    h.insert(header::CONTENT_LENGTH, (served.end - served.start).into());
    h
}

/// The write a PUT asks for: `If-None-Match: *` creates, `If-Match: ETAG` updates that
/// version, neither overwrites.
fn put_mode(headers: &HeaderMap) -> PutMode {
    let header_str = |n: header::HeaderName| headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    match (header_str(header::IF_NONE_MATCH), header_str(header::IF_MATCH)) {
        (Some(v), _) if v == "*" => PutMode::Create,
        (_, Some(etag)) => PutMode::Update(UpdateVersion { e_tag: Some(etag), version: None }),
        _ => PutMode::Overwrite,
    }
}

async fn put_object(State(state): State<AppState>, Path(key): Path<String>, req: Request) -> Response {
    let k = match parse_key(&key) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let (scope, tag) = write_scope(&k);
    let token = match authorize(&state, req.headers(), scope, tag) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if let Err(r) = check_lease_owner(&k, token.as_deref()) {
        return r;
    }
    // Packs and manifests are written once, whatever the client asks: a write token may add
    // them, never replace one (that would destroy every image using it).
    let write_once = matches!(k, Key::Pack(_) | Key::Manifest(_));
    let mode = if write_once { PutMode::Create } else { put_mode(req.headers()) };
    // A new tag must not read as a manifest id; an existing one (written by an older gstore)
    // may still be updated in place. Known from the headers: refused before the body is read.
    if let (Key::Tag(t), PutMode::Create | PutMode::Overwrite) = (&k, &mode) {
        if let Err(e) = t.check_new() {
            return error(StatusCode::UNPROCESSABLE_ENTITY, format!("rejected, nothing stored: {e}"));
        }
    }
    let body = match body_of(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    // The bases of the deltas a pack holds, from the store: every delta is decoded and
    // hashed before it is stored (a forged one would break every image that names its id).
    let wanted = verify::bases_wanted(&k, &body, state.chunk_max, state.sealed);
    let bases = match stored_bases(&state, wanted).await {
        Ok(b) => b,
        Err(StoredBase::Missing(b)) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("rejected, nothing stored: delta base {} is stored whole in no pack here", b.to_hex()),
            )
        }
        Err(StoredBase::Failed(r)) => return r,
    };
    let checked = {
        let (k, body, chunk_max, sealed) = (k.clone(), body.clone(), state.chunk_max, state.sealed);
        tokio::task::spawn_blocking(move || {
            let known = known_bases(bases, chunk_max).map_err(|e| e.to_string())?;
            verify::upload(&k, &body, chunk_max, sealed, known)
        })
        .await
    };
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return error(StatusCode::UNPROCESSABLE_ENTITY, format!("rejected, nothing stored: {why}")),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
    if let (Key::Tag(t), Some(token)) = (&k, &token) {
        if let Err(r) = within_quota(&state, token, Some((t, &body))).await {
            return r;
        }
    }
    write_checked(&state, &k, body, mode, write_once).await
}

/// Whether the images under `token`'s prefix stay within its quota (if it has one) with the
/// tag record `writing` (the tag and the uploaded body) written; else the 403 answer. Without
/// `writing`: whether they are below it now (a push asks before it uploads anything).
async fn within_quota(state: &AppState, token: &Token, writing: Option<(&TagRef, &Bytes)>) -> Result<(), Response> {
    let record = match writing.map(|(t, body)| TagRecord::from_json(body, t)).transpose() {
        Ok(r) => r,
        Err(e) => return Err(error(StatusCode::UNPROCESSABLE_ENTITY, format!("rejected, nothing stored: {e}"))),
    };
    match quota::room(state, token, record).await {
        Ok(_) => Ok(()),
        Err(quota::Refusal::Over(why)) => Err(error(StatusCode::FORBIDDEN, why)),
        Err(quota::Refusal::Failed(e)) => Err(store_failure(e)),
    }
}

/// Writes an upload that passed its checks under `mode`: once only for packs and manifests
/// (`write_once`: the same bytes again are a retry, done; other bytes a conflict), by
/// compare-and-swap for an update.
async fn write_checked(state: &AppState, k: &Key, body: Bytes, mode: PutMode, write_once: bool) -> Response {
    let len = body.len() as u64;
    let path = ObjPath::from(k.to_string());
    let sent = write_once.then(|| body.clone());
    let put = match mode {
        // Compare-and-swap through the store's own (native If-Match, or on a local directory
        // the version compared under the lock file every gstore writer takes).
        PutMode::Update(UpdateVersion { e_tag, .. }) => {
            let (backend, version) = (state.backend.clone(), Version::from_e_tag(e_tag.unwrap_or_default()));
            let k = k.clone();
            let swapped =
                tokio::task::spawn_blocking(move || backend.put_if_unchanged(&k, body.to_vec(), &version)).await;
            match swapped {
                Ok(Ok(())) => state.objects.head(&path).await.map(|m| m.e_tag),
                Ok(Err(e)) => return store_failure(e),
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        mode => state
            .objects
            .put_opts(&path, PutPayload::from(body), PutOptions { mode, ..Default::default() })
            .await
            .map(|r| r.e_tag),
    };
    match put {
        Ok(e_tag) => {
            state.metrics.bytes_in.inc_by(len);
            let mut h = HeaderMap::new();
            if let Some(e) = e_tag.and_then(|e| e.parse().ok()) {
                h.insert(header::ETAG, e);
            }
            (StatusCode::CREATED, h).into_response()
        }
        Err(object_store::Error::AlreadyExists { .. }) if sent.is_some() => match state.objects.get(&path).await {
            // The same bytes again (a retried upload): done.
            Ok(got) => match got.bytes().await {
                Ok(b) if Some(&b) == sent.as_ref() => StatusCode::OK.into_response(),
                Ok(_) => error(
                    StatusCode::CONFLICT,
                    format!("{k} exists with other bytes: packs and manifests are written once, never replaced"),
                ),
                Err(e) => store_error(e),
            },
            Err(e) => store_error(e),
        },
        Err(e) => store_error(e),
    }
}

/// Whether the request's token may write tags named `name`: 204, else 401/403 as a write of
/// such a tag would get, or 403 when the images under its prefix are at its quota already. A
/// push asks before it uploads anything.
async fn may_write_tag(State(state): State<AppState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    match authorize(&state, &headers, Scope::Write, Some(&name)) {
        Ok(Some(token)) => match within_quota(&state, &token, None).await {
            Ok(()) => StatusCode::NO_CONTENT.into_response(),
            Err(r) => r,
        },
        Ok(None) => StatusCode::NO_CONTENT.into_response(),
        Err(r) => r,
    }
}

/// The scope (and tag namespace) writing or deleting an object needs: tags and leases are
/// written by pushes, restore profiles by restores; the config, the deletion of packs,
/// manifests and profiles, tombstones, the gc lock and the retention policies belong to
/// admins (gc).
fn write_scope(k: &Key) -> (Scope, Option<&str>) {
    match k {
        Key::Tag(t) => (Scope::Write, Some(t.name.as_str())),
        Key::Pack(_) | Key::Manifest(_) | Key::Lease(_) | Key::Profile(_) | Key::Damage(_) => (Scope::Write, None),
        Key::Config
        | Key::Tombstone(_)
        | Key::GcLock
        | Key::Probe(_)
        | Key::Upload(_)
        | Key::KeyRecord(_)
        | Key::RetiredKeys
        | Key::Policies => (Scope::Admin, None),
    }
}

/// A lease belongs to the token whose [`Token::lease_prefix`] starts its name: a token that is
/// not an admin's may write and delete only its own leases, so that one tenant cannot drop
/// the protection of another's push in flight (docs/SECURITY.md).
fn check_lease_owner(k: &Key, token: Option<&Token>) -> Result<(), Response> {
    match (k, token) {
        (Key::Lease(name), Some(t)) if t.scope < Scope::Admin && !name.starts_with(&t.lease_prefix()) => Err(error(
            StatusCode::FORBIDDEN,
            "this lease belongs to another token: a token writes and deletes only leases named with its own \
             prefix (docs/SECURITY.md); gstore before 2026-11 names leases otherwise: upgrade the client",
        )),
        _ => Ok(()),
    }
}

async fn delete_object(State(state): State<AppState>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    let k = match parse_key(&key) {
        Ok(Key::Config) => return error(StatusCode::METHOD_NOT_ALLOWED, "the store config cannot be deleted"),
        Ok(k) => k,
        Err(r) => return r,
    };
    // Deleting packs, manifests, profiles and damage records is gc's work.
    let (scope, tag) = match &k {
        Key::Pack(_) | Key::Manifest(_) | Key::Profile(_) | Key::Damage(_) => (Scope::Admin, None),
        other => write_scope(other),
    };
    if let Err(r) = authorize(&state, &headers, scope, tag).and_then(|t| check_lease_owner(&k, t.as_deref())) {
        return r;
    }
    let path = ObjPath::from(key.as_str());
    if let Err(e) = state.objects.head(&path).await {
        return store_error(e);
    }
    match state.objects.delete(&path).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => store_error(e),
    }
}

#[derive(serde::Deserialize)]
struct ListQuery {
    prefix: String,
}

async fn list(State(state): State<AppState>, Query(q): Query<ListQuery>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read, None) {
        return r;
    }
    if !Family::ALL.iter().any(|f| f.prefix() == q.prefix) {
        let all: Vec<&str> = Family::ALL.iter().map(|f| f.prefix()).collect();
        return error(StatusCode::BAD_REQUEST, format!("prefix must be one of {}", all.join(", ")));
    }
    let listed: Result<Vec<_>, _> =
        state.objects.list(Some(&ObjPath::from(q.prefix.as_str()))).map_ok(|m| ListEntry::of(&m)).try_collect().await;
    match listed {
        Ok(v) => Json(v).into_response(),
        Err(e) => store_error(e),
    }
}

#[derive(serde::Deserialize)]
struct ChunkQuery {
    #[serde(default)]
    stored: bool,
}

async fn get_chunk(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<ChunkQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read, None) {
        return r;
    }
    if let Some(r) = no_chunks_when_sealed(&state) {
        return r;
    }
    let Ok(id) = ObjectId::from_hex(&id) else { return error(StatusCode::BAD_REQUEST, "not a 64-hex chunk id") };
    let e = match locate(&state, &id).await {
        Ok(Some(found)) => found,
        Ok(None) => return error(StatusCode::NOT_FOUND, "no pack holds this chunk"),
        Err(r) => return r,
    };
    let stored = match state.objects.get_range(&pack_path(&e), e.range()).await {
        Ok(b) => b,
        Err(err) => return store_error(err),
    };
    let codec = [(header::HeaderName::from_static("x-gstore-codec"), e.codec.name())];
    if q.stored {
        state.metrics.bytes_out.inc_by(stored.len() as u64);
        return (codec, stored).into_response();
    }
    // A delta is decoded against its bases, fetched the same way (a base is never a delta).
    let bases = match stored_bases(&state, e.bases.iter().flat_map(|b| b.iter()).collect()).await {
        Ok(b) => b,
        Err(StoredBase::Missing(_)) => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "a delta base of this chunk is missing")
        }
        Err(StoredBase::Failed(r)) => return r,
    };
    let chunk_max = state.chunk_max;
    let decoded = tokio::task::spawn_blocking(move || {
        let known = known_bases(bases, chunk_max)?;
        let mut decoder = Decoder::with_bases(chunk_max, &known);
        let mut plain = Vec::with_capacity(e.plain_len as usize);
        decoder.decode_append(e.codec, &stored, e.plain_len as usize, &id, &mut plain)?;
        Ok::<_, gstore_store::StoreError>(plain)
    })
    .await;
    match decoded {
        Ok(Ok(plain)) => {
            state.metrics.bytes_out.inc_by(plain.len() as u64);
            plain.into_response()
        }
        Ok(Err(err)) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("stored chunk is damaged: {err}")),
        Err(err) => error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    }
}

/// Of the chunk ids posted (a JSON array of hex ids), the ones no pack without a gc tombstone
/// holds: the chunks a push must upload.
/// The answer to a chunk request on an encrypted store: the server holds no key, so it cannot
/// read the pack footers that say where chunks are.
fn no_chunks_when_sealed(state: &AppState) -> Option<Response> {
    state.sealed.then(|| {
        error(
            StatusCode::CONFLICT,
            "this store is encrypted and the server holds no key: chunks are not found by id here; read objects (/v1/o/)",
        )
    })
}

async fn missing_chunks(State(state): State<AppState>, req: Request) -> Response {
    if let Err(r) = authorize(&state, req.headers(), Scope::Read, None) {
        return r;
    }
    if let Some(r) = no_chunks_when_sealed(&state) {
        return r;
    }
    let body = match body_of(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Ok(ids) = serde_json::from_slice::<Vec<String>>(&body) else {
        return error(StatusCode::BAD_REQUEST, "expected a JSON array of 64-hex chunk ids");
    };
    let mut parsed = Vec::with_capacity(ids.len());
    for s in &ids {
        match ObjectId::from_hex(s) {
            Ok(id) => parsed.push(id),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("not a 64-hex chunk id: {:?}", s.chars().take(80).collect::<String>()),
                )
            }
        }
    }
    // Tombstones are listed for every query (a push must not rely on a pack gc tombstoned
    // since), footers refreshed once at most, whatever the batch size.
    if let Err(r) = refreshed(&state, true).await {
        return r;
    }
    let mut footers_read = false;
    let mut missing = Vec::new();
    for id in parsed {
        if state.chunks.held_live(&id) {
            continue;
        }
        if !footers_read {
            if let Err(r) = refreshed(&state, false).await {
                return r;
            }
            footers_read = true;
            if state.chunks.held_live(&id) {
                continue;
            }
        }
        missing.push(id.to_hex());
    }
    Json(missing).into_response()
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read, None) {
        return r;
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// Counts every request and its latency.
async fn record(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    state.metrics.requests.with_label_values(&[method.as_str(), resp.status().as_str()]).inc();
    state.metrics.latency.with_label_values(&[method.as_str()]).observe(started.elapsed().as_secs_f64());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges() {
        assert!(matches!(parse_range("bytes=0-9"), Some(GetRange::Bounded(r)) if r == (0..10)));
        assert!(matches!(parse_range("bytes=5-"), Some(GetRange::Offset(5))));
        assert!(parse_range(&format!("bytes=0-{}", u64::MAX)).is_none(), "an end that overflows is refused");
        for bad in ["bytes=9-0", "bytes=-5", "items=0-1", "bytes=a-b", "bytes=0-1,3-4", ""] {
            assert!(parse_range(bad).is_none(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn range_parser_never_panics(s in ".{0,64}", a in any::<u64>(), b in any::<u64>()) {
            let _ = parse_range(&s);
            if let Some(GetRange::Bounded(r)) = parse_range(&format!("bytes={a}-{b}")) {
                prop_assert!(r.start <= r.end);
            }
        }
    }
}
