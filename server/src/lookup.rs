//! Finding chunks and delta bases in the store, for the chunk routes and the caching tier:
//! the chunk map first, new pack footers read once when it does not know a chunk yet.

use crate::answers::{error, store_error, store_failure};
use crate::chunks::ChunkMap;
use crate::AppState;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use gstore_store::codec::{decode_base, KnownBases};
use gstore_store::format::key::ObjectKey as Key;
use gstore_store::repo::index::ChunkLocation;
use gstore_store::{ChunkIds, ObjectId};
use object_store::path::Path as ObjPath;
use object_store::ObjectStoreExt;

/// Runs a chunk map refresh (blocking store requests) on a blocking thread.
pub(crate) async fn refreshed(state: &AppState, tombstones_only: bool) -> Result<(), Response> {
    let (chunks, backend) = (state.chunks.clone(), state.backend.clone());
    let done = tokio::task::spawn_blocking(move || {
        if tombstones_only {
            chunks.refresh_tombstones(&backend)
        } else {
            chunks.refresh(&backend)
        }
    })
    .await;
    match done {
        Ok(r) => r.map_err(store_failure),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// The object path of the pack holding a chunk.
pub(crate) fn pack_path(l: &ChunkLocation) -> ObjPath {
    ObjPath::from(Key::Pack(l.pack).to_string().as_str())
}

/// Finds a chunk, reading new pack footers once if it is not known yet.
pub(crate) async fn locate(state: &AppState, id: &ObjectId) -> Result<Option<ChunkLocation>, Response> {
    locate_by(state, id, ChunkMap::get).await
}

/// Finds a chunk through `find` on the chunk map, reading new pack footers once if `find`
/// finds nothing yet.
pub(crate) async fn locate_by(
    state: &AppState,
    id: &ObjectId,
    find: fn(&ChunkMap, &ObjectId) -> Option<ChunkLocation>,
) -> Result<Option<ChunkLocation>, Response> {
    if let Some(found) = find(&state.chunks, id) {
        state.metrics.chunk_lookups.with_label_values(&["hit"]).inc();
        return Ok(Some(found));
    }
    state.metrics.chunk_lookups.with_label_values(&["miss"]).inc();
    refreshed(state, false).await?;
    Ok(find(&state.chunks, id))
}

/// Why a delta base could not be read from the store.
pub(crate) enum StoredBase {
    /// No pack holds it whole.
    Missing(ObjectId),
    /// The request failed: the answer to give.
    Failed(Response),
}

/// The stored bytes of delta bases `ids`, each from a pack holding it whole (a base is never
/// a delta), for [`known_bases`] to decode on a blocking thread.
pub(crate) async fn stored_bases(
    state: &AppState,
    ids: Vec<ObjectId>,
) -> Result<Vec<(ObjectId, ChunkLocation, Bytes)>, StoredBase> {
    let mut out = Vec::new();
    for b in ids {
        match locate_by(state, &b, ChunkMap::get_whole).await {
            Ok(Some(l)) => match state.objects.get_range(&pack_path(&l), l.range()).await {
                Ok(bytes) => out.push((b, l, bytes)),
                Err(err) => return Err(StoredBase::Failed(store_error(err))),
            },
            Ok(_) => return Err(StoredBase::Missing(b)),
            Err(r) => return Err(StoredBase::Failed(r)),
        }
    }
    Ok(out)
}

/// Decodes and checks the bases [`stored_bases`] read. Chunk routes and delta checks serve
/// unencrypted stores only (an encrypted one answers 409 or is not decoded): plain ids.
pub(crate) fn known_bases(
    bases: Vec<(ObjectId, ChunkLocation, Bytes)>,
    chunk_max: u32,
) -> gstore_store::Result<KnownBases> {
    bases
        .into_iter()
        .map(|(b, l, bytes)| {
            let plain = decode_base(l.codec, &bytes, l.plain_len as usize, &b, chunk_max, ChunkIds::Plain)?;
            Ok((b, std::sync::Arc::new(plain)))
        })
        .collect()
}
