//! Space accounting (`gstore du`): logical bytes, stored bytes, dedup and compression ratios,
//! and the stored bytes only each image holds.

use crate::error::Result;
use crate::format::id::ObjectId;
use crate::repo::indexed::IndexedStore;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// Space used by one tagged image.
#[derive(Debug, Clone, Serialize)]
pub struct ImageUsage {
    /// `name:version`.
    pub tag: String,
    /// Manifest id.
    pub manifest: String,
    /// Plain bytes of the image.
    pub logical_bytes: u64,
    /// Stored bytes of chunks no other image references: what removing it would free.
    pub unique_stored_bytes: u64,
}

/// Space used by the whole store.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    /// Per tag.
    pub images: Vec<ImageUsage>,
    /// Plain bytes of all images added up (an image under two tags counts once).
    pub logical_bytes: u64,
    /// Plain bytes of the distinct non-zero chunks the images reference.
    pub unique_plain_bytes: u64,
    /// Stored bytes of those chunks (after compression).
    pub referenced_stored_bytes: u64,
    /// Bytes of all pack objects (referenced or not).
    pub pack_bytes: u64,
    /// Number of packs.
    pub packs: usize,
    /// logical / unique plain.
    pub dedup_ratio: f64,
    /// unique plain / referenced stored.
    pub compression_ratio: f64,
    /// Chunks referenced by a manifest but missing from the index.
    pub missing_chunks: u64,
    /// Per tag prefix asked for ([`usage_by`]): what a token limited to that prefix holds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<PrefixUsage>,
}

/// Space used by the images whose tag names start with one prefix (a token's namespace).
#[derive(Debug, Clone, Serialize)]
pub struct PrefixUsage {
    /// The prefix ("" for every name).
    pub prefix: String,
    /// Tags under it.
    pub images: usize,
    /// Plain bytes of those images (an image under two tags counts once).
    pub logical_bytes: u64,
    /// Stored bytes of the distinct chunks they reference: what the prefix holds, and what a
    /// quota on it bounds (docs/SECURITY.md).
    pub stored_bytes: u64,
    /// Stored bytes of the chunks no image outside the prefix references: what removing
    /// them all would free.
    pub unique_stored_bytes: u64,
}

/// Stored bytes of the distinct chunks among `chunks` (the non-zero chunk ids of some
/// manifests, repeats allowed), each counted once; `stored_len` says a chunk's stored length
/// (one it does not know counts nothing). What `gstore du --prefix` reports and a server's
/// quota bounds.
pub fn stored_bytes<'a>(
    chunks: impl IntoIterator<Item = &'a ObjectId>,
    stored_len: impl Fn(&ObjectId) -> Option<u64>,
) -> u64 {
    let distinct: HashSet<&ObjectId> = chunks.into_iter().collect();
    distinct.into_iter().filter_map(stored_len).sum()
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

/// Computes the store's usage from tags, manifests and the index.
pub fn usage(store: &IndexedStore) -> Result<Usage> {
    usage_by(store, &[])
}

/// [`usage`], with the usage of the images under each of `prefixes` too.
pub fn usage_by(store: &IndexedStore, prefixes: &[String]) -> Result<Usage> {
    let tags: Vec<_> = store.list_tags()?.into_iter().filter_map(|t| t.ok()).collect();
    let mut manifests = HashMap::new();
    for t in &tags {
        let id = t.manifest_id()?;
        if let std::collections::hash_map::Entry::Vacant(e) = manifests.entry(id) {
            e.insert(store.get_manifest(&id)?);
        }
    }
    // chunk -> (number of manifests referencing it, stored len, plain len)
    let mut chunks: HashMap<ObjectId, (u32, u64, u64)> = HashMap::new();
    let mut missing = 0;
    // Each manifest's distinct stored chunks, computed once.
    let distinct: HashMap<ObjectId, HashSet<ObjectId>> =
        manifests.iter().map(|(id, m)| (*id, m.chunks.iter().filter(|c| !c.zero).map(|c| c.id).collect())).collect();
    for ids in distinct.values() {
        for &id in ids {
            if let Some(e) = chunks.get_mut(&id) {
                e.0 += 1;
            } else if let Some(loc) = store.locate(&id)? {
                chunks.insert(id, (1, loc.stored_len as u64, loc.plain_len as u64));
            } else {
                missing += 1;
            }
        }
    }
    let unique_stored = |manifest: &ObjectId| -> u64 {
        distinct[manifest].iter().filter_map(|id| chunks.get(id)).filter(|c| c.0 == 1).map(|c| c.1).sum()
    };
    let images = tags
        .iter()
        .map(|t| {
            let id = t.manifest_id().expect("checked above");
            ImageUsage {
                tag: t.tag().to_string(),
                manifest: t.manifest.clone(),
                logical_bytes: manifests[&id].logical_size(),
                unique_stored_bytes: unique_stored(&id),
            }
        })
        .collect();
    let logical: u64 = manifests.values().map(|m| m.logical_size()).sum();
    let unique_plain: u64 = chunks.values().map(|c| c.2).sum();
    let stored: u64 = chunks.values().map(|c| c.1).sum();
    let packs = store.index().packs()?;
    let stored_len = |id: &ObjectId| chunks.get(id).map(|c| c.1);
    let prefixes = prefixes
        .iter()
        .map(|prefix| {
            let tagged: Vec<_> = tags.iter().filter(|t| t.name.starts_with(prefix.as_str())).collect();
            let under: HashSet<ObjectId> = tagged.iter().map(|t| t.manifest_id().expect("checked above")).collect();
            let inside: HashMap<&ObjectId, u32> =
                under.iter().flat_map(|m| &distinct[m]).fold(HashMap::new(), |mut n, id| {
                    *n.entry(id).or_default() += 1;
                    n
                });
            PrefixUsage {
                prefix: prefix.clone(),
                images: tagged.len(),
                logical_bytes: under.iter().map(|m| manifests[m].logical_size()).sum(),
                stored_bytes: stored_bytes(under.iter().flat_map(|m| &distinct[m]), stored_len),
                // Referenced by as many manifests inside the prefix as in the whole store.
                unique_stored_bytes: inside
                    .iter()
                    .filter_map(|(id, n)| chunks.get(*id).filter(|c| c.0 == *n).map(|c| c.1))
                    .sum(),
            }
        })
        .collect();
    Ok(Usage {
        prefixes,
        images,
        logical_bytes: logical,
        unique_plain_bytes: unique_plain,
        referenced_stored_bytes: stored,
        pack_bytes: packs.iter().map(|p| p.1.size).sum(),
        packs: packs.len(),
        dedup_ratio: ratio(logical, unique_plain),
        compression_ratio: ratio(unique_plain, stored),
        missing_chunks: missing,
    })
}
