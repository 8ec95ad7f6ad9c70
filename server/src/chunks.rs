//! The server's map of chunks to packs, built in memory from pack footers (the server keeps no
//! files of its own) and refreshed, reading only new footers, when a chunk is not found. It
//! also knows which packs gc has tombstoned: those still serve reads, but a push must not
//! deduplicate against them (docs/GC.md), so they never make a chunk count as present.

use futures::TryStreamExt;
use gstore_store::key::{Family, ObjectKey};
use gstore_store::pack::{parse_footer, parse_trailer, PackEntry, TRAILER_LEN};
use gstore_store::ObjectId;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::{HashMap, HashSet};
use tokio::sync::RwLock;

/// Where each chunk is.
pub struct ChunkMap {
    inner: RwLock<Known>,
    /// The store's `chunk_max`: packs listing a longer chunk are damaged.
    chunk_max: u32,
}

#[derive(Default)]
struct Known {
    /// Every pack known to hold each chunk.
    chunks: HashMap<ObjectId, Vec<(ObjectId, PackEntry)>>,
    packs: HashSet<ObjectId>,
    /// Packs with a gc tombstone, as last listed.
    doomed: HashSet<ObjectId>,
}

impl Known {
    /// A holder of `id` without a tombstone, if any.
    fn live(&self, id: &ObjectId) -> Option<(ObjectId, PackEntry)> {
        self.chunks.get(id)?.iter().find(|(pack, _)| !self.doomed.contains(pack)).copied()
    }
}

impl ChunkMap {
    /// An empty map for a store whose chunks are at most `chunk_max` bytes.
    pub fn new(chunk_max: u32) -> ChunkMap {
        ChunkMap { inner: RwLock::default(), chunk_max }
    }

    /// The pack and footer entry of `id` to read it from, if known: a pack without a
    /// tombstone if there is one, else a tombstoned one (readable until gc deletes it).
    pub async fn get(&self, id: &ObjectId) -> Option<(ObjectId, PackEntry)> {
        let k = self.inner.read().await;
        k.live(id).or_else(|| k.chunks.get(id)?.first().copied())
    }

    /// True when a pack without a tombstone (as last listed) holds `id`: one a push may rely on.
    pub async fn held_live(&self, id: &ObjectId) -> bool {
        self.inner.read().await.live(id).is_some()
    }

    /// Lists gc's tombstones again, so [`ChunkMap::held_live`] answers for now.
    pub async fn refresh_tombstones(&self, objects: &dyn ObjectStore) -> object_store::Result<()> {
        let listed: Vec<_> = objects.list(Some(&ObjPath::from(Family::Tombstones.prefix()))).try_collect().await?;
        let doomed = listed.iter().filter_map(|m| tombstoned_pack(m.location.as_ref())).collect();
        self.inner.write().await.doomed = doomed;
        Ok(())
    }

    /// Reads the footers of packs not seen yet. Damaged packs are skipped. When gc deleted a
    /// known pack, the map is rebuilt (chunks it held may live in another pack now).
    pub async fn refresh(&self, objects: &dyn ObjectStore) -> object_store::Result<()> {
        let listed: Vec<_> = objects.list(Some(&ObjPath::from(Family::Packs.prefix()))).try_collect().await?;
        let present: HashSet<ObjectId> = listed.iter().filter_map(|m| listed_pack(m.location.as_ref())).collect();
        let mut known = self.inner.read().await.packs.clone();
        if !known.is_subset(&present) {
            let mut k = self.inner.write().await;
            k.chunks.clear();
            k.packs.clear();
            known.clear();
        }
        for meta in listed {
            let Some(pack) = listed_pack(meta.location.as_ref()) else { continue };
            if known.contains(&pack) {
                continue;
            }
            if let Ok(entries) = footer(objects, &pack, meta.size, self.chunk_max).await {
                let mut k = self.inner.write().await;
                k.packs.insert(pack);
                for e in entries {
                    k.chunks.entry(e.id).or_default().push((pack, e));
                }
            }
        }
        Ok(())
    }
}

/// The pack a listed key names, if it is a pack's.
fn listed_pack(key: &str) -> Option<ObjectId> {
    ObjectKey::parse(key).ok()?.pack()
}

/// The pack a listed tombstone marks, if it marks a pack.
fn tombstoned_pack(key: &str) -> Option<ObjectId> {
    ObjectKey::parse(key).ok()?.tombstoned()?.pack()
}

async fn footer(
    objects: &dyn ObjectStore,
    pack: &ObjectId,
    size: u64,
    chunk_max: u32,
) -> Result<Vec<PackEntry>, String> {
    let key = ObjectKey::Pack(*pack).to_string();
    let path = ObjPath::from(key.as_str());
    if size < TRAILER_LEN as u64 + 8 {
        return Err("truncated".into());
    }
    let tail = objects.get_range(&path, size - TRAILER_LEN as u64..size).await.map_err(|e| e.to_string())?;
    let t = parse_trailer(&tail, size, &key).map_err(|e| e.to_string())?;
    let f = objects.get_range(&path, t.footer_offset..size - TRAILER_LEN as u64).await.map_err(|e| e.to_string())?;
    parse_footer(&f, &t, &key, chunk_max).map_err(|e| e.to_string())
}
