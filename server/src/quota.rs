//! Quotas: the most stored bytes the images under a token's tag prefix may hold (`quota=SIZE`
//! in the token file, docs/SECURITY.md). What they hold is computed from the store itself —
//! the tags under the prefix (current values and history), their manifests, and the stored
//! length of each distinct chunk they reference, as `gstore du --prefix` counts it — so every
//! replica over one bucket agrees, with nothing kept of its own but a cache of manifests'
//! chunk lists (immutable, by id).

use crate::auth::Token;
use crate::AppState;
use gstore_store::commands::usage::stored_bytes;
use gstore_store::format::key::{Family, ObjectKey};
use gstore_store::format::manifest::Manifest;
use gstore_store::format::tag::TagRecord;
use gstore_store::{ObjectId, Result, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Chunk lists kept at most; the cache starts again when it is full.
const CACHED_MANIFESTS: usize = 4096;

/// The manifests' chunk lists read for quota checks, by manifest id.
#[derive(Default)]
pub struct Quotas {
    lists: Mutex<HashMap<ObjectId, Arc<Vec<ObjectId>>>>,
}

impl Quotas {
    /// Stored bytes the images under `prefix` hold, with `writing` (a tag record about to be
    /// written) in place of that tag's stored value. Blocks: call on a blocking thread.
    pub fn held(&self, state: &AppState, prefix: &str, writing: Option<&TagRecord>) -> Result<u64> {
        if state.sealed {
            return Err(StoreError::Invalid(
                "quotas need a store whose manifests the server can read; this one is encrypted".into(),
            ));
        }
        let b = &state.backend;
        let mut images: Vec<ObjectId> = Vec::new();
        let mut take = |rec: &TagRecord| -> Result<()> {
            images.push(rec.manifest_id()?);
            images.extend(rec.history.iter().filter_map(|h| ObjectId::from_hex(&h.manifest).ok()));
            Ok(())
        };
        for listed in b.list(Family::Tags.prefix())? {
            let ObjectKey::Tag(tag) = &listed.key else { continue };
            if !tag.name.starts_with(prefix) || writing.is_some_and(|w| &w.tag() == tag) {
                continue;
            }
            let Some(bytes) = b.get_opt(&listed.key)? else { continue };
            let rec = TagRecord::from_json(&bytes, tag)?;
            if rec.removed_unix.is_none() {
                take(&rec)?;
            }
        }
        if let Some(w) = writing {
            take(w)?;
        }
        images.sort();
        images.dedup();
        let lists = images.iter().map(|id| self.chunks_of(state, id)).collect::<Result<Vec<_>>>()?;
        let chunks = || lists.iter().flat_map(|l| l.iter());
        if !chunks().all(|id| state.chunks.get(id).is_some()) {
            // Packs pushed since the map was last read.
            state.chunks.refresh(b)?;
        }
        Ok(stored_bytes(chunks(), |id| state.chunks.get(id).map(|l| u64::from(l.stored_len))))
    }

    /// The non-zero chunk ids of manifest `id`, from the cache or the store.
    fn chunks_of(&self, state: &AppState, id: &ObjectId) -> Result<Arc<Vec<ObjectId>>> {
        if let Some(l) = self.lists.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(id) {
            return Ok(Arc::clone(l));
        }
        let bytes = state.backend.get(&ObjectKey::Manifest(*id))?;
        let m = Manifest::decode_unchecked(&bytes, id)?;
        let list = Arc::new(m.chunks.iter().filter(|c| !c.zero).map(|c| c.id).collect::<Vec<_>>());
        let mut cache = self.lists.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= CACHED_MANIFESTS {
            cache.clear();
        }
        cache.insert(*id, Arc::clone(&list));
        Ok(list)
    }
}

/// Why a write is refused for its token's quota.
#[derive(Debug)]
pub enum Refusal {
    /// The write would take the token's images past the quota ([`over`]).
    Over(String),
    /// What the images hold could not be read.
    Failed(StoreError),
}

/// The stored bytes `token`'s quota leaves room for (no quota: `u64::MAX`), with `writing`
/// (a tag record about to be written) in place of that tag's value. Refused past the quota,
/// and without `writing` at it (nothing more may be sent).
pub async fn room(state: &AppState, token: &Token, writing: Option<TagRecord>) -> std::result::Result<u64, Refusal> {
    let Some(quota) = token.quota else { return Ok(u64::MAX) };
    let (s, prefix, adding) = (state.clone(), token.tag_prefix.clone(), writing.is_some());
    let held = tokio::task::spawn_blocking(move || s.quotas.held(&s, &prefix, writing.as_ref()))
        .await
        .map_err(|e| Refusal::Failed(StoreError::Internal(e.to_string())))?
        .map_err(Refusal::Failed)?;
    if held > quota || (!adding && held >= quota) {
        return Err(Refusal::Over(over(&token.tag_prefix, quota, held)));
    }
    Ok(quota - held)
}

/// The answer to a write that would take the images under `prefix` past `quota`.
pub fn over(prefix: &str, quota: u64, held: u64) -> String {
    let name = if prefix.is_empty() { "every tag".to_string() } else { format!("tags starting with {prefix:?}") };
    format!(
        "quota exceeded, nothing tagged: the images under {name} would hold {held} stored bytes, more than this \
         token's quota of {quota} (remove some of them, run gc, or ask for a larger quota)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_says_what_and_how_much() {
        let m = over("team-a-", 10 << 20, 12 << 20);
        assert!(m.contains("\"team-a-\"") && m.contains("12582912") && m.contains("10485760"), "{m}");
        assert!(over("", 1, 2).contains("every tag"));
    }
}
